"""Reading vLLM command lines out of containers, and pod templates out of workloads."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gatekeeper.estimate.options import ServeOptions
from gatekeeper.k8s.workloads import gpu_product_constraint, pod_templates, vllm_containers
from gatekeeper.vllm.command import VllmCommand, parse_vllm_command
from gatekeeper.vllm.flags import human_readable_int


def parse(
    command: Sequence[str] = (),
    args: Sequence[str] = (),
    image: str = "",
    env: dict[str, str] | None = None,
) -> VllmCommand | None:
    return parse_vllm_command(list(command), list(args), image, env or {})


@pytest.mark.parametrize(
    ("text", "value"),
    [("32768", 32768), ("32k", 32000), ("32K", 32768), ("1.5k", 1500), ("2M", 2 * 2**20)],
)
def test_human_readable_int_as_vllm(text, value):
    assert human_readable_int(text) == value


def test_binary_suffix_with_a_decimal_is_refused_as_vllm_does():
    with pytest.raises(ValueError, match=r"did you mean 1\.5k"):
        human_readable_int("1.5K")


def test_vllm_serve_with_every_flag_form():
    cmd = parse(
        ["vllm", "serve", "Qwen/Qwen3-8B"],
        ["--max-model-len=32k", "-tp", "2", "--pipeline_parallel_size", "2", "-dp=2",
         "-q", "fp8", "--dtype", "half", "--kv-cache-dtype=fp8", "--gpu-memory-utilization",
         "0.85", "--max-num-seqs", "64", "--max-num-batched-tokens", "8K", "--enforce-eager",
         "--port", "8000"],
    )  # fmt: skip
    assert cmd is not None
    assert (cmd.model, cmd.model_from, cmd.data_parallel_size, cmd.problems) == (
        "Qwen/Qwen3-8B", "command line", 2, ()
    )  # fmt: skip
    assert cmd.options == ServeOptions(
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


def test_unreadable_values_are_problems_and_keep_the_default():
    cmd = parse(
        ["vllm", "serve", "m"],
        ["--max-model-len", "lots", "--gpu-memory-utilization=1.5", "--enforce-eager=maybe"],
    )
    assert cmd is not None and cmd.options == ServeOptions()
    assert cmd.problems == (
        "--max-model-len 'lots' cannot be read; vLLM takes a positive integer such as 32768 "
        "or 32k, or auto",
        "--gpu-memory-utilization '1.5' cannot be read; vLLM takes a fraction in (0, 1] such as 0.9",
        "--enforce-eager='maybe' is not a boolean; give --enforce-eager or --no-enforce-eager",
    )


def test_a_config_file_is_named_as_unread():
    cmd = parse(["vllm", "serve", "m", "--config", "/etc/vllm/serve.yaml"])
    assert cmd is not None
    assert cmd.problems == (
        "--config '/etc/vllm/serve.yaml': flags in a config file cannot be read at admission; "
        "only the command line is checked",
    )


def test_max_model_len_auto():
    cmd = parse(["vllm", "serve", "m", "--max-model-len", "auto"])
    assert cmd is not None and cmd.max_model_len_auto and cmd.options.max_model_len is None


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
