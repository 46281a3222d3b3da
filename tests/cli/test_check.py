"""``gatekeeper check`` and ``gatekeeper plan`` as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gatekeeper(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_check_admits_with_the_command_line_and_bars():
    out = gatekeeper(
        "check",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
        "8192",
        "--node",
        "2xH100-80GB",
    )
    assert out.returncode == 0, out.stderr
    assert "ADMITTED" in out.stdout and "vllm serve meta-llama/Llama-3.1-8B-Instruct" in out.stdout
    assert "--gpu-memory-utilization" in out.stdout
    assert "GPU 0 H100-80GB" in out.stdout and "[" in out.stdout and "legend:" in out.stdout


def test_check_rejects_with_exit_1_and_json_reasons():
    out = gatekeeper("check", "meta-llama/Llama-3.3-70B-Instruct", "--node", "1xL4", "--json")
    assert out.returncode == 1
    d = json.loads(out.stdout)
    assert d["admitted"] is False and d["reasons"] and d["suggestions"]


def test_check_without_gpus_says_how_to_plan_instead(tmp_path):
    env_out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "check", "Qwen/Qwen3-0.6B"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "LD_LIBRARY_PATH": str(tmp_path),
            "GATEKEEPER_STATE_DIR": str(tmp_path),
        },
        cwd=ROOT,
    )
    assert env_out.returncode == 2
    assert "Traceback" not in env_out.stderr and len(env_out.stderr.strip().splitlines()) == 1
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in env_out.stderr
    assert "pass --node 2xH100-80GB" in env_out.stderr


def test_the_example_plan_runs():
    out = gatekeeper("plan", "deploy/examples/plan.toml")
    assert out.returncode == 1  # the example ends with a model that fits nowhere
    assert out.stdout.count("ADMITTED") >= 4 and "REJECTED too-big" in out.stdout
    assert "headroom after the plan" in out.stdout


def test_plan_json_and_yaml(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text(
        "deployments:\n  - model: Qwen/Qwen3-0.6B\n    max_model_len: 4096\n  - model: Qwen/Qwen3-0.6B\n"
    )
    out = gatekeeper("plan", str(plan), "--node", "1xL4", "--json")
    assert out.returncode == 1, out.stderr  # one GPU, sharing off: the second waits
    payload = json.loads(out.stdout)
    assert [d["admitted"] for d in payload["deployments"]] == [True, False]
    assert "sharing is off" in payload["deployments"][1]["gpus"][0]["status"]
    assert payload["headroom"][0]["planned_bytes"] > 0


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[[deployments]]\nmodel = 'Qwen/Qwen3-0.6B'\nmax_model_lenn = 4096\n", "max_model_lenn"),
        ("[[deployments]]\nmax_model_len = 4096\n", "deployments[0]"),
        ("deployments = []\n", "non-empty"),
        ("[[deployments]]\nmodel = 'Qwen/Qwen3-0.6B'\nmax_model_len = -5\n", "max_model_len"),
        ("not toml at all = = =\n", "not valid"),
    ],
)
def test_bad_plan_files_get_one_line(tmp_path, content, needle):
    plan = tmp_path / "p.toml"
    plan.write_text(content)
    out = gatekeeper("plan", str(plan), "--node", "1xL4")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr


@pytest.mark.parametrize(("version", "read"), [("0.8.5", False), ("0.11.0", True), (None, True)])
def test_check_reads_flags_with_the_vllm_version_and_a_config_files_model(
    capsys, tmp_path: Path, version, read
):
    from gatekeeper.cli.entry import main

    config = tmp_path / "serve.yaml"
    config.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nmax-num-seq: 16\n")
    release = ["--vllm-version", version] if version else []
    code = main(["check", "--config", str(config), *release, "--node", "1xH100-80GB",
                 "--max-model", "8k", "--kv-cache-memory-bytes", "8G", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    if not read:
        assert code == 2
        assert (
            "'--kv-cache-memory-bytes' is not a flag of vllm serve 0.8.5 (it came in vLLM 0.10.2;"
            in out["error"]["message"]
        )
        return
    assert code == 0, out
    assert out["model"] == "meta-llama/Llama-3.1-8B-Instruct", out
    args = out["placement"]["vllm_args"]  # the file's abbreviated key, the line's length
    assert args[args.index("--max-num-seqs") + 1] == "16", args
    assert args[args.index("--max-model-len") + 1] == "8000", args


def test_deploy_takes_the_model_from_a_config_file(capsys, tmp_path: Path):
    from gatekeeper.cli.entry import main
    from tests.support.sidecar_harness import TOKEN, running_sidecar, settings_for

    config = tmp_path / "serve.yaml"
    config.write_text("model: tiny\nmax-num-seq: 4\n")
    with running_sidecar(settings_for(tmp_path / "state")) as sidecar:
        client = ["--url", sidecar.url, "--token", TOKEN, "--json"]
        code = main(["deploy", "--config", str(config), "--max-model", "2k", *client])
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out
        args = out["deployment"]["vllm_args"]
        assert out["deployment"]["name"] == "tiny" and args[args.index("--max-num-seqs") + 1] == "4"
        assert main(["deploy", "--max-model", "2k", *client]) == 2
        assert "the following arguments are required: model" in capsys.readouterr().out
