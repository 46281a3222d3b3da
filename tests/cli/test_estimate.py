"""``gatekeeper estimate`` as a user runs it: a real process, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.vllm.table import flag_table
from tests.support.quant_conformance_cases import FAMILIES

REQUIRED_KEYS = {
    "weights_bytes", "non_torch_bytes", "activation_peak_bytes", "cuda_graph_bytes",
    "kv_cache_bytes", "kv_cache_tokens", "max_concurrency", "fits", "reasons",
    "max_model_len", "vllm_version", "method",
}  # fmt: skip


AWQ_SKIP_ATTENTION = {
    **FAMILIES["llama"],
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                            "zero_point": True, "version": "gemm",
                            "modules_to_not_convert": ["self_attn"]},
}  # fmt: skip


def gatekeeper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args], capture_output=True, text=True, timeout=60
    )


def test_estimate_prints_a_table_with_gib_and_a_verdict():
    out = gatekeeper("estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB")
    assert out.returncode == 0, out.stderr
    assert "GiB" in out.stdout and "verdict: FITS" in out.stdout
    assert "largest max_model_len that fits" in out.stdout


def test_estimate_json_has_the_documented_keys():
    out = gatekeeper(
        "estimate",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--gpu",
        "L4",
        "--max-model-len",
        "8192",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload.keys() >= REQUIRED_KEYS
    assert payload["method"] == "vllm" and isinstance(payload["fits"], bool)
    assert payload["gpu_total_bytes"] == round(22.05 * 2**30)


def test_estimate_shows_what_is_quantized(tmp_path: Path):
    """#36 item 4: the weights by module group and format, a line under the weights in
    the table and ``weights_by_group`` in integer bytes in the JSON; AWQ with
    ``self_attn`` not converted keeps attention in the model dtype."""
    model = tmp_path / "llama-awq"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(AWQ_SKIP_ATTENTION))
    text = gatekeeper("estimate", str(model), "--max-model-len", "512")
    assert text.returncode == 0, text.stderr
    line = text.stdout.split("\n  weights ", 1)[1].splitlines()[1]
    assert line.startswith("    of which: attention ") and " GiB awq" in line, text.stdout
    out = gatekeeper("estimate", str(model), "--max-model-len", "512", "--json")
    payload = json.loads(out.stdout)
    groups = payload["weights_by_group"]
    dtype = payload["options"]["dtype"]
    assert set(groups["attention"]) == {dtype} and set(groups["mlp"]) == {"awq"}
    assert f"attention {groups['attention'][dtype] / 2**30:.2f} GiB {dtype}" in line
    sizes = [b for formats in groups.values() for b in formats.values()]
    assert all(isinstance(b, int) for b in sizes)
    assert sum(sizes) == payload["weights_bytes"]
    assert payload["stages"][0]["weights_by_group"] == groups


def test_estimate_does_not_fit_with_reasons():
    out = gatekeeper(
        "estimate", "meta-llama/Llama-3.3-70B-Instruct", "--gpu", "A100-40GB", "--json"
    )
    payload = json.loads(out.stdout)
    assert payload["fits"] is False and payload["reasons"]


def test_simple_method_json():
    out = gatekeeper("estimate", "meta-llama/Llama-2-7b-hf", "--method", "simple", "--json")
    payload = json.loads(out.stdout)
    assert payload["method"] == "simple"
    assert payload["total_bytes"] == round(payload["weights_bytes"] * 1.2)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuch/model"], "model"),
        (["meta-llama/Llama-3.1-8B-Instruct", "-tp", "3"], "tensor_parallel_size"),
        (["meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "0"], "max_model_len"),
        (["meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory", "-5GiB"], "--gpu-memory"),
        (["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "TPU-v5"], "gpu"),
        (["meta-llama/Llama-3.1-8B-Instruct", "--quantization", "q3_k_m"], "quantization"),
        # from 0.33 vLLM's parser takes any string and its CacheConfig refuses the unknown
        (
            ["meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-dtype", "int2"],
            "kv_cache_dtype: 'int2'",
        ),
        (
            ["meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-utilization", "0"],
            "gpu_memory_utilization",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_traceback(args, needle):
    out = gatekeeper("estimate", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert needle in lines[0] and "Traceback" not in out.stderr


def test_bad_config_directory_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    out = gatekeeper("estimate", str(tmp_path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "config.json" in out.stderr


def test_models_lists_the_catalog():
    out = gatekeeper("models")
    assert out.returncode == 0 and "meta-llama/Llama-3.1-8B-Instruct" in out.stdout


def test_any_vllm_flag_and_a_pasted_command_line_are_read_as_vllm_reads_them():
    out = gatekeeper(
        "estimate", "-tp", "2", "meta-llama/Llama-3.3-70B-Instruct", "--max_model_len", "32k",
        "--gpu", "H100-80GB", "--json",
    )  # fmt: skip
    payload = json.loads(out.stdout)
    assert out.returncode == (0 if payload["fits"] else 1), out.stderr
    assert payload["max_model_len"] == 32000
    pasted = gatekeeper(
        "estimate", "vllm", "serve", "Qwen/Qwen3-8B", "--enable-lora", "--max-loras", "4",
        "--kv-cache-memory-bytes", "20G", "--hf-overrides.max_position_embeddings", "8192",
        "--kv-offloading-backend", "lmcache",
        "--json",
    )  # fmt: skip
    assert pasted.returncode == (0 if json.loads(pasted.stdout)["fits"] else 1), pasted.stderr
    assert "--kv-offloading-backend read but not modelled" in pasted.stderr
    assert "--hf-overrides" not in pasted.stderr  # laid over the config, as vLLM does
    assert json.loads(pasted.stdout)["max_model_len"] == 8192  # the overridden length
    assert json.loads(pasted.stdout)["kv_cache_bytes"] == 20 * 2**30
    assert json.loads(pasted.stdout)["lora_bytes"] > 0  # four rank-16 slots, sized


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-modle-len", "4096"], "did you mean --max-model-len"),
        (["--kv-cache-memory-bytes", "20GiB"], "no 'GiB'"),
        (["--max-model-len", "4096.5"], "--max-model-len '4096.5'"),
        (["--dtype", "BF16"], "did you mean bfloat16"),
    ],
)
def test_a_flag_vllm_would_refuse_exits_2_naming_it(args, needle):
    out = gatekeeper("estimate", "Qwen/Qwen3-8B", *args)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_a_pasted_line_with_a_path_to_vllm_and_model_flag_names_the_model():
    out = gatekeeper(
        "estimate", "/usr/bin/vllm", "serve", "--model", "Qwen/Qwen3-8B", "-tp", "2", "--json"
    )
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["model"] == "Qwen/Qwen3-8B"


def test_a_model_that_does_not_fit_exits_1_like_check():
    out = gatekeeper("estimate", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "L4")
    assert "verdict: DOES NOT FIT" in out.stdout, out.stdout + out.stderr
    assert out.returncode == 1


def test_the_second_line_says_where_the_config_came_from_not_internal_files(tmp_path):
    out = gatekeeper("estimate", "qwen3-0.6b")
    second = out.stdout.splitlines()[1]
    assert second == (
        f"vLLM {DEFAULT_VLLM_VERSION} accounting, per GPU (most loaded rank); "
        "config from embedded catalog (`gatekeeper models` lists it)"
    )
    assert ".md" not in out.stdout and "shared/" not in out.stdout and ".py" not in out.stdout
    catalog = Path(__file__).parents[2] / "gatekeeper" / "catalog" / "Qwen__Qwen3-0.6B.json"
    (tmp_path / "config.json").write_text(json.dumps(json.loads(catalog.read_text())["config"]))
    local = gatekeeper("estimate", str(tmp_path), "--json")
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["config_source"] == f"local directory {tmp_path}"
    assert f"config from local directory {tmp_path}" in gatekeeper("estimate", str(tmp_path)).stdout


# The flag table and the accounting follow --vllm-version (else the settings' default), the
# flags are read as that release's argparse reads them, and a --config file may name the
# model. In-process: the same main() the entry point runs.

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from gatekeeper.cli.entry import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("version", "has_kv_bytes", "has_swap", "utilization"),
    [("0.8.5", False, True, 0.9), ("0.11.0", True, True, 0.9), (None, True, False, 0.92)],
)
def test_the_flag_table_and_accounting_follow_the_vllm_version(
    capsys, version, has_kv_bytes, has_swap, utilization
):
    release = ["--vllm-version", version] if version else []
    code, out, err = run_main(capsys, "estimate", LLAMA_8B, *release, "--json",
                              "--kv-cache-memory-bytes", "8G")  # fmt: skip
    assert (code != 2) is has_kv_bytes, out  # 2: a usage error; 0 or 1: estimated
    if not has_kv_bytes:
        assert (
            f"'--kv-cache-memory-bytes' is not a flag of vllm serve {version} (it came in vLLM "
            "0.10.2;" in out
        )
    code, out, err = run_main(capsys, "estimate", LLAMA_8B, *release, "--json",
                              "--swap-space", "4")  # fmt: skip
    assert (code == 0) is has_swap, out
    if has_swap:
        payload = json.loads(out)
        assert payload["vllm_version"] == (version or DEFAULT_VLLM_VERSION)
        assert payload["options"]["gpu_memory_utilization"] == utilization
        # modelled (issue 40): host memory of V0's CPU swap; V1 keeps none, so 0 here
        assert "--swap-space" not in err
        assert payload["host"]["swap_space_bytes"] == 0
    else:
        table = flag_table().vllm
        assert f"'--swap-space' is not a flag of vllm serve {table} (vLLM had it up to" in out


def test_abbreviated_flags_are_read_as_vllm_reads_them(capsys):
    code, out, _ = run_main(capsys, "estimate", "--max-num-seq", "8", LLAMA_8B,
                            "--gpu-memory-util=0.8", "--max-model", "4k", "--json")  # fmt: skip
    assert code == 0, out
    payload = json.loads(out)
    options = payload["options"]
    assert (payload["model"], options["max_num_seqs"], payload["max_model_len"]) == (
        LLAMA_8B, 8, 4000
    )  # fmt: skip
    assert options["gpu_memory_utilization"] == 0.8
    code, out, _ = run_main(capsys, "estimate", LLAMA_8B, "--kv-cache", "fp8", "--json")
    assert code == 2
    assert "ambiguous option: --kv-cache could match --kv-cache-dtype, " in out
    code, out, _ = run_main(capsys, "estimate", LLAMA_8B, "--vllm-version", "0.8.5",
                            "--kv-cache", "fp8", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["options"]["kv_cache_dtype"] == "fp8", out


def test_the_model_may_come_from_a_config_file(capsys, tmp_path: Path):
    named = tmp_path / "serve.yaml"
    named.write_text(f"model: {LLAMA_8B}\nmax-model-len: 2048\n")
    code, out, _ = run_main(capsys, "estimate", "--config", str(named), "--json")
    assert code == 0, out
    assert (json.loads(out)["model"], json.loads(out)["max_model_len"]) == (LLAMA_8B, 2048)
    qwen = "Qwen/Qwen3-8B"  # the command line's model wins, as in vLLM
    code, out, _ = run_main(capsys, "estimate", qwen, "--config", str(named), "--json")
    assert code == 0 and json.loads(out)["model"] == qwen, out
    bare = tmp_path / "bare.yaml"
    bare.write_text("max-model-len: 2048\n")
    code, out, _ = run_main(capsys, "estimate", "--config", str(bare), "--json")
    assert code == 2 and "no model specified" in out, out


@pytest.mark.parametrize(
    ("size", "total"),
    [("80G", 80 * 2**30), ("80g", 80 * 10**9), ("80GiB", 80 * 2**30), ("80GB", 80 * 10**9),
     ("512M", 512 * 2**20), ("79.19g", 79_190_000_000)],
)  # fmt: skip
def test_a_one_letter_size_means_what_it_means_to_vllm(capsys, size, total):
    """``--gpu-memory 80G`` and ``--kv-cache-memory-bytes 80G`` on one command line are
    the same bytes: vLLM's human_readable_int (uppercase binary, lowercase decimal)."""
    code, out, _ = run_main(capsys, "estimate", LLAMA_8B, "--gpu-memory", size,
                            "--kv-cache-memory-bytes", "4G", "--json")  # fmt: skip
    assert code in (0, 1), out  # estimated (fits or not), not a usage error
    payload = json.loads(out)
    assert payload["gpu_total_bytes"] == total
    assert payload["kv_cache_bytes"] == 4 * 2**30  # vLLM's 4G, as --gpu-memory 4G would be


def test_a_binary_one_letter_size_takes_no_decimals_as_in_vllm(capsys):
    code, out, _ = run_main(capsys, "estimate", LLAMA_8B, "--gpu-memory", "79.19G", "--json")
    assert code == 2
    assert (
        "--gpu-memory: '79.19G': G is binary (2^30) as vLLM reads it, which takes no decimals; "
        "write 79.19GiB, or 79.19g for 10^9" in json.loads(out)["error"]["message"]
    )
