"""The webhook's menu of nearby configurations, bounded by the node and the GPU:
``webhook_max_gpus_per_node`` caps a suggested TP, and a GPU below compute capability
7.5 (vLLM's ``Fp8Config.get_min_capability``) is offered no fp8 weights."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.placement.nearby import online_fp8_flag
from gatekeeper.settings import Settings
from tests.proxy.test_suggestion_doors import _pod

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
