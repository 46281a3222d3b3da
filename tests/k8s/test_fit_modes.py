"""The validating webhook's texts speak of what the operator changes in the webhook's mode
(gatekeeper.k8s.gpu_terms): ``nvidia.com/gpu`` counts without claims, one claimed GPU of
the DeviceClass per rank in the claims modes, HAMi's ``nvidia.com/gpu`` and
``nvidia.com/gpumem`` in hami mode; reviews in, reviews out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gatekeeper.cluster.claims import ClaimsMode
from gatekeeper.k8s.fit import gpu_count_finding
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.settings import Settings
from gatekeeper.vllm.command import VllmCommand, parse_vllm_command
from tests.k8s.test_fleet import review

QWEN_14B = ["Qwen/Qwen2.5-14B-Instruct", "--max-model-len", "8192"]
LLAMA_70B = ["meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192"]
MODES: tuple[ClaimsMode | None, ...] = (None, "gatekeeper", "nvidia-dra", "hami")
TP2 = {
    None: "--tensor-parallel-size 2 with nvidia.com/gpu: 2",
    "gatekeeper": "--tensor-parallel-size 2 (2 ranks, one GPU of DeviceClass gpu.gatekeeper.dev "
    "claimed for each)",
    "nvidia-dra": "--tensor-parallel-size 2 (2 ranks, one GPU of DeviceClass gpu.nvidia.com "
    "claimed for each)",
    "hami": "--tensor-parallel-size 2 with nvidia.com/gpu: 2 and nvidia.com/gpumem per GPU",
}


def denial(mode: ClaimsMode | None, args: list[str], **settings: Any) -> str:
    """The message denying ``args`` pinned to an L4 by the webhook in ``mode``."""
    webhook = webhook_from_settings(Settings(**settings), claims=mode)
    body = json.dumps(review(args, selector="NVIDIA-L4")).encode()
    _, payload, outcome = webhook.answer(body)
    assert outcome == "denied", payload
    message: str = payload["response"]["status"]["message"]
    return message


def counted(gpus: int | None, mode: ClaimsMode | None, *args: str) -> str:
    command = parse_vllm_command(["vllm", "serve", "m", *args], [], "vllm/vllm-openai:v0.11.0", {})
    assert isinstance(command, VllmCommand)
    finding = gpu_count_finding("pod", command, gpus, claims=mode)
    assert finding is not None and finding.message is not None
    return finding.message


@pytest.mark.parametrize("mode", MODES)
def test_the_suggested_tensor_parallel_size_says_how_the_gpus_are_had(
    mode: ClaimsMode | None,
) -> None:
    message = denial(mode, QWEN_14B)
    assert f"Would fit: {TP2[mode]}; or --quantization fp8" in message
    if mode in ("gatekeeper", "nvidia-dra"):  # no nvidia.com/gpu count where claims give them
        assert "nvidia.com/gpu:" not in message and "nvidia.com/gpumem" not in message


@pytest.mark.parametrize(
    ("mode", "end"),
    [
        (None, "Nothing nearby fits: pin a larger GPU (nodeSelector nvidia.com/gpu.product) or "
         "use more GPUs with --tensor-parallel-size."),
        ("hami", "Nothing nearby fits: pin a larger GPU (nodeSelector nvidia.com/gpu.product) "
         "or use more GPUs with --tensor-parallel-size."),
        ("gatekeeper", "Nothing nearby fits: pin a larger GPU (nodeSelector "
         "nvidia.com/gpu.product) or add nodes with larger GPUs to DeviceClass "
         "gpu.gatekeeper.dev, or claim more ranks with --tensor-parallel-size."),
    ],
)  # fmt: skip
def test_nothing_nearby_says_where_larger_gpus_come_from(mode: ClaimsMode | None, end: str) -> None:
    assert denial(mode, LLAMA_70B, webhook_max_gpus_per_node=2).endswith(end)


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (None, "pod: --tensor-parallel-size 4 needs 4 GPUs in the pod but it requests 2 "
         "nvidia.com/gpu; set resources.limits nvidia.com/gpu: 4 or lower "
         "--tensor-parallel-size to 2"),
        ("gatekeeper", "pod: --tensor-parallel-size 4 needs 4 GPUs in the pod but it claims 2 "
         "GPUs of DeviceClass gpu.gatekeeper.dev; let gatekeeper's mutating webhook claim 4 "
         "GPUs of DeviceClass gpu.gatekeeper.dev, one per rank (it leaves a claim written by "
         "hand alone: remove that claim), or lower --tensor-parallel-size to 2"),
        ("hami", "pod: --tensor-parallel-size 4 needs 4 GPUs in the pod but it requests 2 "
         "nvidia.com/gpu; set resources.limits nvidia.com/gpu: 4 and nvidia.com/gpumem (MiB "
         "per GPU), or leave both to gatekeeper's mutating webhook, or lower "
         "--tensor-parallel-size to 2"),
    ],
)  # fmt: skip
def test_tp_above_the_pod_s_gpus_is_denied_in_the_mode_s_words(
    mode: ClaimsMode | None, text: str
) -> None:
    assert counted(2, mode, "--tensor-parallel-size", "4") == text


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (None, "but the pod requests no nvidia.com/gpu; set resources.limits nvidia.com/gpu: 2 "
         "unless a DRA claim provides them"),
        ("nvidia-dra", "but the pod claims no GPUs of DeviceClass gpu.nvidia.com; let "
         "gatekeeper's mutating webhook claim 2 GPUs of DeviceClass gpu.nvidia.com, one per rank"),
        ("hami", "but the pod requests no nvidia.com/gpu; set resources.limits nvidia.com/gpu: 2 "
         "and nvidia.com/gpumem (MiB per GPU)"),
    ],
)  # fmt: skip
def test_no_gpus_for_several_ranks_are_warned_of_in_the_mode_s_words(
    mode: ClaimsMode | None, text: str
) -> None:
    message = counted(None, mode, "--tensor-parallel-size", "2")
    assert message.startswith("pod: vLLM needs 2 GPUs (TP x PP x DP) ") and text in message
    world = counted(1, mode, "--pipeline-parallel-size", "2")
    one = "the pod claims 1 GPU of DeviceClass" if mode == "nvidia-dra" else "requests 1 nvidia"
    assert one in world and world.endswith("vLLM starts only if a Ray cluster provides the rest")
