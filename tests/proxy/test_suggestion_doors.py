"""One suggestion menu at every door (#31 item 7): the same over-size request
(Llama-3.3-70B at max_model_len 32768 on two H100s: short by 1.27 GiB per GPU at TP=2)
gets the same suggestions from ``gatekeeper check``, the admin API's and ``gatekeeper
deploy``'s 507, the proxy's 507 and the webhook's denial; a repo id that runs here under
a configured name is pointed at that name; the webhook offers no TP larger than a node."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.placement.nearby import online_fp8_flag
from gatekeeper.settings import ModelEntry, Settings
from tests.cli.test_rehearsal_output import GATEKEEPER, gatekeeper
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
FP8 = online_fp8_flag(DEFAULT_VLLM_VERSION)
KINDS = ["max_model_len", "kv_cache_dtype", "quantization"]
"""What fits instead, in the menu's order: a shorter context, an fp8 KV cache, fp8 weights
(TP is searched already: two GPUs are the node's all)."""
POD = Path(__file__).parents[1] / "fixtures" / "admission" / "pod-denied.json"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    models = [
        ModelEntry(name="big", model=MODEL, options={"max_model_len": 32768}),
        ModelEntry(name="small", model="Qwen/Qwen3-0.6B", options={"max_model_len": 4096}),
        ModelEntry(
            name="pinned",
            model="meta-llama/Llama-3.1-8B-Instruct",
            options={"max_model_len": 131072, "tensor_parallel_size": 1},
            min_sequences=4,
        ),
    ]
    settings = settings_for(tmp_path_factory.mktemp("doors"), models=models)
    with running_sidecar(settings) as sc:
        yield sc


def menu(suggestions: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(s["kind"], s["options"]) for s in suggestions]


def run_check(*args: str) -> list[dict[str, Any]]:
    """The suggestions of the real ``gatekeeper check --json`` (no GATEKEEPER_ settings)."""
    result = subprocess.run(
        [str(GATEKEEPER), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)["suggestions"]
    return found


@pytest.fixture(scope="module")
def checked() -> list[tuple[str, dict[str, Any]]]:
    """``gatekeeper check`` on the declared (idle) node: the reference menu."""
    found = menu(run_check("check", MODEL, "--node", "2xH100-80GB", "--max-model-len", "32768"))
    assert [kind for kind, _ in found] == KINDS
    assert found[1][1] == {"kv_cache_dtype": "fp8"} and found[2][1] == {"quantization": FP8}
    assert 256 <= found[0][1]["max_model_len"] < 32768
    return found


def test_the_admin_api_and_deploy_give_checks_menu(sidecar: Sidecar, checked):
    body = {"model": MODEL, "options": {"max_model_len": 32768}}
    answer = sidecar.admin.post("/admin/deployments", json=body)
    assert answer.status_code == 507, answer.text
    assert menu(answer.json()["decision"]["suggestions"]) == checked
    cli = gatekeeper(sidecar, "deploy", MODEL, "--max-model-len", "32768", "--json")
    assert cli.returncode != 0
    assert menu(json.loads(cli.stdout)["decision"]["suggestions"]) == checked


def test_the_proxys_507_gives_checks_menu(sidecar: Sidecar, checked):
    answer = httpx.post(
        f"{sidecar.url}/v1/completions",
        json={"model": "big", "prompt": "hi", "max_tokens": 1},
        timeout=60,
    )
    assert answer.status_code == 507
    lines = answer.json()["error"]["message"].splitlines()
    offered = [line for line in lines if line.startswith("Would fit: ")]
    length = checked[0][1]["max_model_len"]
    assert offered == [
        f"Would fit: max_model_len {length} (now 32768) fits on GPUs 0, 1.",
        "Would fit: kv_cache_dtype fp8 fits on GPUs 0, 1.",
        f"Would fit: quantization {FP8} (online fp8 weights) fits on GPUs 0, 1.",
    ]


def test_the_proxys_507_shows_all_four_changes_check_finds(sidecar: Sidecar):
    """A request that pins TP=1 gets the whole menu: shorter, fp8 KV, fp8 weights, TP=2
    (the 507 showed three of them before)."""
    args = ["check", "meta-llama/Llama-3.1-8B-Instruct", "--node", "2xH100-80GB"]
    args += ["--max-model-len", "131072", "--tensor-parallel-size", "1", "--min-sequences", "4"]
    found = run_check(*args)
    assert [s["kind"] for s in found] == [*KINDS, "parallelism"]
    answer = httpx.post(
        f"{sidecar.url}/v1/completions",
        json={"model": "pinned", "prompt": "hi", "max_tokens": 1},
        timeout=60,
    )
    assert answer.status_code == 507
    offered = [line for line in answer.json()["error"]["message"].splitlines() if "Would" in line]
    assert offered == [f"Would fit: {s['text']}." for s in found]


def test_behind_a_busy_gpu_the_507_offers_the_menu_once_idle(sidecar: Sidecar, checked):
    """With a worker on GPU 0, nothing fits now: the 507 still names what fits once idle
    (before, it said nothing fits at all), and points the repo id at its configured name."""
    r = gatekeeper(sidecar, "deploy", "small")
    assert r.returncode == 0, r.stderr
    did = r.stdout.split(" as ")[1].split()[0]
    try:
        sidecar.wait_state(did, ("ready",))
        for model in ("big", MODEL):
            answer = httpx.post(
                f"{sidecar.url}/v1/completions",
                json={"model": model, "prompt": "hi", "max_tokens": 1},
                timeout=60,
            )
            assert answer.status_code == 507
            message = answer.json()["error"]["message"]
            offered = [line for line in message.splitlines() if line.startswith("Would fit: ")]
            assert offered and all("once this node's GPUs are idle" in o for o in offered)
            assert f"quantization {FP8}" in message and "No setting fits" not in message
            pointer = f"`{MODEL}` is served on this node as `big`: send that name"
            assert message.startswith(pointer) == (model == MODEL)
    finally:
        sidecar.admin.delete(f"/admin/deployments/{did}")
        sidecar.wait_state(did, ("stopped",))


def _pod(command: list[str], gpus: int, product: str) -> dict[str, Any]:
    review: dict[str, Any] = copy.deepcopy(json.loads(POD.read_text()))
    spec = review["request"]["object"]["spec"]
    container = spec["containers"][0]
    container["command"] = command
    container["image"] = f"vllm/vllm-openai:v{DEFAULT_VLLM_VERSION}"
    container["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    spec["nodeSelector"]["nvidia.com/gpu.product"] = product
    return review


def denial(review: dict[str, Any]) -> str:
    status, body, _ = webhook_from_settings(Settings()).answer(json.dumps(review).encode())
    assert status == 200 and body["response"]["allowed"] is False, body
    message: str = body["response"]["status"]["message"]
    return message


def test_the_webhook_offers_the_same_kinds():
    # vLLM's default budget (0.9 x total) is the webhook's; with 0.97 it is about the
    # sidecar's usable memory (total - 0.5 GiB - 2%), so the same changes fit
    command = ["vllm", "serve", MODEL, "--max-model-len", "32768"]
    command += ["--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.97"]
    message = denial(_pod(command, 2, "NVIDIA-H100-80GB-HBM3"))
    would = message.split("Would fit: ")[1]
    offered = would.rstrip(".").split("; or ")
    # first the larger TP an 8-GPU node has (the sidecar's two GPUs have no more), then
    # the sidecar's menu
    assert offered[0] == "--tensor-parallel-size 4 with nvidia.com/gpu: 4"
    flags = ["--max-model-len", "--kv-cache-dtype", "--quantization"]
    assert [o.split()[0] for o in offered[1:]] == flags
    assert offered[2] == "--kv-cache-dtype fp8"
    assert offered[3].startswith(f"--quantization {FP8}")


def test_the_webhook_offers_no_tp_larger_than_a_node():
    # 405B in bf16 needs 16 H100s; a node has 8: fp8 weights at TP=8, never TP=16
    command = ["vllm", "serve", "meta-llama/Llama-3.1-405B-Instruct", "--max-model-len", "8192"]
    message = denial(_pod([*command, "--tensor-parallel-size", "8"], 8, "NVIDIA-H100-80GB-HBM3"))
    assert "--tensor-parallel-size 16" not in message
    assert f"--quantization {FP8}" in message


def test_a_quantized_model_is_offered_no_fp8_weights_at_either_door():
    """An FP8 checkpoint takes no online fp8: check and the webhook both offer TP=8 only."""
    fp8 = "meta-llama/Meta-Llama-3.1-405B-Instruct-FP8"
    args = ["--max-model-len", "8192", "--tensor-parallel-size", "4"]
    found = run_check("check", fp8, "--node", "8xH100-80GB", *args)
    assert [(s["kind"], s["options"]["tensor_parallel_size"]) for s in found] == [
        ("parallelism", 8)
    ]
    message = denial(_pod(["vllm", "serve", fp8, *args], 4, "NVIDIA-H100-80GB-HBM3"))
    assert message.split("Would fit: ")[1] == "--tensor-parallel-size 8 with nvidia.com/gpu: 8."
