"""The webhook's menu of nearby configurations, bounded by the node and the GPU:
``webhook_max_gpus_per_node`` caps a suggested TP, and a GPU below compute capability
7.5 (vLLM's ``Fp8Config.get_min_capability``) is offered no fp8 weights."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.gpus.products import best_capability, gpu_products, lookup_gpu
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.placement.nearby import online_fp8_flag
from gatekeeper.settings import Settings
from tests.proxy.test_suggestion_doors import _pod, run_check

FP8 = online_fp8_flag(DEFAULT_VLLM_VERSION)


def _denial(review: dict[str, Any], settings: Settings) -> str:
    status, body, _ = webhook_from_settings(settings).answer(json.dumps(review).encode())
    assert status == 200 and body["response"]["allowed"] is False, body
    message: str = body["response"]["status"]["message"]
    return message


def test_a_four_gpu_node_setting_stops_tp8_suggestions():
    """405B-FP8 at TP=4 on H100s: TP=8 fits, and is offered unless nodes carry 4 GPUs."""
    fp8 = "meta-llama/Meta-Llama-3.1-405B-Instruct-FP8"
    command = ["vllm", "serve", fp8, "--max-model-len", "8192", "--tensor-parallel-size", "4"]
    review = _pod(command, 4, "NVIDIA-H100-80GB-HBM3")
    tp8 = "--tensor-parallel-size 8 with nvidia.com/gpu: 8"
    assert tp8 in _denial(review, Settings())
    message = _denial(review, Settings(webhook_max_gpus_per_node=4))
    assert "--tensor-parallel-size 8" not in message
    assert "Nothing nearby fits" in message


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GATEKEEPER_WEBHOOK_MAX_GPUS_PER_NODE", "2")
    assert Settings().webhook_max_gpus_per_node == 2
    assert webhook_from_settings(Settings()).config.max_node_gpus == 2


def _offered(message: str) -> list[str]:
    return message.split("Would fit: ")[1].rstrip(".").split("; or ")


def test_a_v100_is_offered_no_fp8_weights_and_an_h100_is():
    """Qwen3-8B's bf16 weights overflow a V100-16GB; fp8 weights would fit in its bytes
    (offered for a bare size of the same memory, whose capability is unknown) but vLLM
    runs none on a 7.0 GPU, so the V100 itself is offered none; an H100 (9.0) is."""
    command = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "4096"]
    review = _pod(command, 1, "Tesla-V100-SXM2-16GB")
    fp8_weights = f"--quantization {FP8} (online fp8 weights)"
    assert not [o for o in _offered(_denial(review, Settings())) if "--quantization" in o]
    total = lookup_gpu("V100-16GB").total_bytes
    review["request"]["object"]["metadata"].setdefault("annotations", {})[
        "vllm-gatekeeper.io/gpu-memory"
    ] = str(total)
    assert fp8_weights in _offered(_denial(review, Settings()))
    big = ["vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct", "--max-model-len", "32768"]
    big += ["--tensor-parallel-size", "2"]
    assert fp8_weights in _offered(_denial(_pod(big, 2, "NVIDIA-H100-80GB-HBM3"), Settings()))


def test_online_fp8_weights_asked_on_a_v100_are_denied():
    command = ["vllm", "serve", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"]
    command += ["--quantization", FP8]
    message = _denial(_pod(command, 1, "Tesla-V100-SXM2-16GB"), Settings())
    assert f"--quantization {FP8} needs a GPU of compute capability 7.5" in message
    assert "has 7.0" in message
    status, body, _ = webhook_from_settings(Settings()).answer(
        json.dumps(_pod(command, 1, "Tesla-T4")).encode()
    )
    assert status == 200 and body["response"]["allowed"] is True, body


def test_check_offers_fp8_weights_on_a_t4_and_none_on_a_larger_v100():
    """The sidecar's menu (``gatekeeper check`` on a declared node) follows the same rule:
    a T4 (7.5, 14.56 GiB) is offered fp8 weights for Qwen3-8B, a V100-16GB (7.0) none."""
    args = ["Qwen/Qwen3-8B", "--max-model-len", "4096", "--node"]
    t4 = run_check("check", *args, "1xT4")
    assert [s["kind"] for s in t4] == ["quantization"]
    v100 = run_check("check", *args, "1xV100-16GB")
    assert "quantization" not in [s["kind"] for s in v100]


def test_every_gpu_in_the_table_has_its_compute_capability():
    # AMD Instinct parts have no CUDA compute capability (declared-only in the table)
    assert {p.name for p in gpu_products() if not p.compute_capability} == {
        "MI300X",
        "MI325X",
        "MI355X",
    }
    named = {n: lookup_gpu(n).compute_capability for n in ("H100", "V100-32GB", "T4", "B200")}
    assert named == {"H100": (9, 0), "V100-32GB": (7, 0), "T4": (7, 5), "B200": (10, 0)}
    assert best_capability(["NVIDIA H100 80GB HBM3", "Tesla-T4"]) == (9, 0)
    assert best_capability(["Tesla-T4", "a GPU not in the table"]) is None
