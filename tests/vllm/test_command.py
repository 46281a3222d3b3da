"""Reading vLLM command lines out of containers, and pod templates out of workloads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.k8s.workloads import gpu_product_constraint, pod_templates, vllm_containers
from gatekeeper.vllm.command import VllmCommand, parse_vllm_command
from gatekeeper.vllm.flags import flag_table, serve_options
from gatekeeper.vllm.serve_args import parse_serve_args


def parse(
    command: Sequence[str] = (),
    args: Sequence[str] = (),
    image: str = "",
    env: dict[str, str] | None = None,
) -> VllmCommand | None:
    return parse_vllm_command(list(command), list(args), image, env or {})


def options(**given: object) -> ServeOptions:
    """The options of a container whose image names no release: the default's."""
    return ServeOptions(vllm_version=DEFAULT_VLLM_VERSION, **given)  # type: ignore[arg-type]


SPEC_EAGLE = json.dumps(
    {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
)


@pytest.mark.parametrize(
    "argv",
    [
        ["m", "--max-model-len=32k", "--max-num-batched-tokens", "8K", "-O0"],
        ["m", "--enable-lora", "--max-loras", "8", "--max-lora-rank=256", "--max-cpu-loras=16"],
        ["m", "-dp", "2", "-tp", "2", "--enable-expert-parallel", "--cpu-offload-gb", "12.5"],
        ["m", "--speculative-config", SPEC_EAGLE, "--limit-mm-per-prompt", '{"image": 0}'],
        ["m", "--compilation-config.cudagraph_capture_sizes+", "1,2,4", "--runner", "pooling"],
        ["--model", "m", "--max_model_len", "4k", "--num-gpu-blocks-override", "100"],
    ],
)
def test_containers_are_read_with_vllms_table_as_every_door_reads(argv):
    """One grammar: a container's flags mean what ``parse_serve_args`` says they mean."""
    cmd = parse(["vllm", "serve"], argv)
    assert cmd is not None and (cmd.problems, cmd.unknown) == ((), ())
    read = parse_serve_args(argv)
    assert cmd.model == read.model == "m"
    assert cmd.options == serve_options({**read.values, "vllm_version": DEFAULT_VLLM_VERSION})
    assert cmd.options != options()


def test_vllm_serve_with_every_flag_form():
    cmd = parse(
        ["vllm", "serve", "Qwen/Qwen3-8B"],
        ["--max-model-len=32k", "-tp", "2", "--pipeline_parallel_size", "2", "-dp=2",
         "-q", "fp8", "--dtype", "half", "--kv-cache-dtype=fp8", "--gpu-memory-utilization",
         "0.85", "--max-num-seqs", "64", "--max-num-batched-tokens", "8K", "--enforce-eager",
         "--port", "8000"],
    )  # fmt: skip
    assert cmd is not None
    assert (cmd.model, cmd.model_from, cmd.problems, cmd.unknown) == (
        "Qwen/Qwen3-8B", "command line", (), ()
    )  # fmt: skip
    assert cmd.options == options(
        data_parallel_size=2,
        dtype="half",
        quantization="fp8",
        kv_cache_dtype="fp8",
        max_model_len=32000,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.85,
        enforce_eager=True,
    )


def test_api_server_with_model_flag_and_k8s_variables():
    env = {"MODEL_ID": "meta-llama/Llama-3.1-8B-Instruct", "LEN": "4096"}
    cmd = parse(
        ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        ["--model", "$(MODEL_ID)", "--max-model-len=$(LEN)", "--no-enforce-eager", "$$(LEN)"],
        env=env,
    )
    assert cmd is not None
    assert (cmd.model, cmd.model_from) == ("meta-llama/Llama-3.1-8B-Instruct", "--model")
    assert cmd.options.max_model_len == 4096 and cmd.options.enforce_eager is False


def test_shell_script_is_split_like_the_shell():
    script = (
        'pip install -q foo && \\\n  exec /usr/local/bin/vllm serve "$MODEL" --max-model-len '
        "${LEN:-16k} -tp ${TP} | tee /tmp/log\necho done -tp 8\n"
    )
    cmd = parse(["/bin/bash", "-lc"], [script], env={"MODEL": "Qwen/Qwen3-8B", "TP": "2"})
    assert cmd is not None
    assert cmd.model == "Qwen/Qwen3-8B"
    assert (cmd.options.max_model_len, cmd.options.tensor_parallel_size) == (16000, 2)


def test_model_from_the_environment():
    cmd = parse(["vllm", "serve"], ["--max-model-len", "8192"], env={"MODEL_NAME": "Qwen/Qwen3-8B"})
    assert cmd is not None and (cmd.model, cmd.model_from) == ("Qwen/Qwen3-8B", "env MODEL_NAME")
    nothing = parse(["vllm", "serve"])
    assert nothing is not None and nothing.model is None


def test_the_vllm_openai_image_entrypoint_with_args_only():
    cmd = parse(args=["--model", "Qwen/Qwen3-8B"], image="docker.io/vllm/vllm-openai:v0.11.0")
    assert cmd is not None and cmd.model == "Qwen/Qwen3-8B"
    positional = parse(args=["serve", "Qwen/Qwen3-8B"], image="vllm/vllm-openai@sha256:abc")
    assert positional is not None and positional.model == "Qwen/Qwen3-8B"
    assert parse(args=["--model", "x"], image="nginx:1.27") is None


def test_unreadable_values_are_problems_with_vllms_grammar_and_keep_the_default():
    cmd = parse(
        ["vllm", "serve", "m"],
        ["--max-model-len", "lots", "--gpu-memory-utilization=1.5", "--enforce-eager=maybe",
         "--cudagraph-capture-sizes", "1", "x", "--speculative-config", '{"method": "eagle"}',
         "-tp", "2", "--max-loras=-3"],
    )  # fmt: skip
    assert cmd is not None and cmd.unknown == ()
    assert cmd.options == options(tensor_parallel_size=2)
    assert set(cmd.problems) == {
        "argument --enforce-eager: ignored explicit argument 'maybe'",
        "--max-model-len 'lots': give a whole number (32k = 32,000, 32K = 32,768), or auto / -1",
        "--cudagraph-capture-sizes ['1', 'x']: give a whole number",
        "gpu_memory_utilization: 1.5 must be in (0, 1], a fraction of the GPU's total memory "
        "(vLLM's default is 0.92 since 0.20, 0.9 before)",
        'speculative_config: method eagle needs a draft "model"',
        "max_loras: -3 must be a positive integer; omit it to use vLLM's default",
    }


def test_unknown_flags_are_set_aside_with_their_values_and_the_rest_is_read():
    cmd = parse(
        ["vllm", "serve", "m"],
        ["--frobnicate", "3", "--max_model_len=8k", "--wat", "-tp=2", "--nope.x", "1",
         "--tokenizer-pool=4", "--enforce-eager"],
    )  # fmt: skip
    assert cmd is not None and cmd.problems == ()
    assert (cmd.model, cmd.options) == (
        "m",
        options(max_model_len=8000, tensor_parallel_size=2, enforce_eager=True),
    )
    release = flag_table().vllm
    # --wat abbreviates two flags: argparse's error, read before the unknown flags
    could = sorted(o for o in flag_table().by_option if o.startswith("--wat"))
    assert len(could) >= 2 and "--watermark" in could  # 0.33 added --watchdog-config
    assert cmd.unknown[0] == (
        f"ambiguous option: --wat could match {', '.join(could)}; give the whole flag"
    )
    assert cmd.unknown[1] == f"'--frobnicate' is not a flag of vllm serve {release}"
    assert {u.split("'")[1] for u in cmd.unknown[1:]} == {
        "--frobnicate", "--nope", "--tokenizer-pool"
    }  # fmt: skip


def test_a_stray_word_and_a_flag_before_the_model():
    stray = parse(["vllm", "serve", "m", "extra", "-tp", "2"])
    assert stray is not None and stray.options.tensor_parallel_size == 2
    assert stray.unknown == ("unexpected argument 'extra'; the model goes first, once",)
    first = parse(["vllm", "serve", "--frobnicate", "m", "--max-model-len", "4096"])
    assert first is not None and (first.model, first.options.max_model_len) == ("m", 4096)


def test_a_pathological_command_line_is_given_up_on_not_looped_over():
    cmd = parse(["vllm", "serve", "m", *(f"--x{i}" for i in range(1000)), "-tp", "2"])
    assert cmd is not None and cmd.options == options()
    assert cmd.problems[-1].endswith("flags cannot be read; no flag was checked")


def test_a_config_file_is_named_as_unread_and_never_opened(tmp_path: Path):
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 1234\ntensor-parallel-size: 8\n")
    cmd = parse(["vllm", "serve", "m", "--config", str(config), "--max-model-len", "4k"])
    assert cmd is not None
    assert cmd.problems == (
        f"--config '{config}': flags in a config file cannot be read at admission; "
        "only the command line is checked",
    )
    assert cmd.options == options(max_model_len=4000)


@pytest.mark.parametrize("value", ["auto", "-1"])
def test_max_model_len_auto(value):
    cmd = parse(["vllm", "serve", "m", "--max-model-len", value])
    assert cmd is not None and cmd.max_model_len_auto and cmd.options.max_model_len is None
    assert cmd.problems == ()


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["nginx", "-g", "daemon off;"], []),
        (["sh", "-c"], ["echo vllm; sleep infinity"]),
        (["sh", "-c"], ['vllm serve "unterminated']),
        (["sh", "script.sh"], []),
        (["python3", "-m", "sglang.launch_server"], ["--model-path", "m"]),
        ([], []),
    ],
)
def test_not_vllm(command, args):
    assert parse(command, args, image="busybox") is None


def test_pod_templates_by_kind():
    template = {"metadata": {"annotations": {"a": "t"}}, "spec": {"containers": []}}
    obj = {"metadata": {"annotations": {"a": "top", "b": "top"}}, "spec": {"template": template}}
    (t,) = pod_templates("Deployment", obj)
    assert t.path == "spec.template" and t.annotations == {"a": "t", "b": "top"}
    cron = {"spec": {"jobTemplate": {"spec": {"template": template}}}}
    assert pod_templates("CronJob", cron)[0].path == "spec.jobTemplate.spec.template"
    lws = {"spec": {"leaderWorkerTemplate": {"workerTemplate": template}}}
    assert [t.path for t in pod_templates("LeaderWorkerSet", lws)] == [
        "spec.leaderWorkerTemplate.workerTemplate"
    ]
    assert pod_templates("ConfigMap", {"data": {}}) == []
    assert pod_templates("Deployment", {"spec": "oops"}) == []


def test_containers_gpus_and_paths():
    spec = {
        "containers": [
            {"name": "web", "image": "nginx"},
            {"name": "llm", "command": ["vllm", "serve", "m"],
             "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"name": "odd", "command": ["vllm", "serve", "m"],
             "resources": {"requests": {"nvidia.com/gpu": 1}, "limits": "x"}},
        ]
    }  # fmt: skip
    (t,) = pod_templates("Pod", {"spec": spec})
    found = [(c.name, c.path, c.gpus) for c in vllm_containers(t)]
    assert found == [("llm", "spec.containers[1]", 2), ("odd", "spec.containers[2]", 1)]


def test_gpu_product_constraint():
    assert gpu_product_constraint({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}) == (
        ["NVIDIA-L4"],
        "nodeSelector nvidia.com/gpu.product",
    )
    expression = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A", "B"]}
    narrowing = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["B", "C"]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [expression, narrowing]}]}
    spec = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }
    assert gpu_product_constraint(spec)[0] == ["B"]
    assert gpu_product_constraint({"affinity": "nonsense"})[0] == []
