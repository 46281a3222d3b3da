"""The webhook reads each container as the vLLM release its image's tag names: that
release's flag table and accounting; ``latest``, a digest or a tag naming no release get
the configured default, said in the review's warnings. A speculative draft model the
webhook cannot read follows the unknown target's rule."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.webhook import AdmissionWebhook
from gatekeeper.settings import Settings
from gatekeeper.vllm.table import flag_table
from tests.k8s.test_webhook import L4, LLAMA_8B, answer, deployment

QWEN3_8B = "Qwen/Qwen3-8B"
DEFAULT_NOTE = "names no vLLM release: read as vLLM"


@pytest.fixture(scope="module")
def webhook() -> AdmissionWebhook:
    return webhook_from_settings(Settings())


def review(webhook: AdmissionWebhook, image: str, *args: str) -> dict[str, Any]:
    """The answer for deployment-allowed.json on an L4, running ``image`` with ``args``."""
    data = deployment(args=["serve", *args], affinity=None, nodeSelector=L4)
    data["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["image"] = image
    return answer(webhook, data)


def warnings(response: dict[str, Any]) -> str:
    return "\n".join(response.get("warnings", []))


@pytest.mark.parametrize(
    ("image", "known"),
    [("vllm/vllm-openai:v0.8.5", False), ("vllm/vllm-openai:v0.11.0", True),
     ("vllm/vllm-openai:latest", True)],
)  # fmt: skip
def test_a_flag_is_read_with_the_images_release(webhook, image, known):
    """--kv-cache-memory-bytes came in vLLM 0.10.2: an 0.8.5 image's vLLM would refuse it."""
    response = review(webhook, image, LLAMA_8B, "--max-model-len", "4096",
                      "--kv-cache-memory-bytes", "4G")  # fmt: skip
    assert response["allowed"] is True
    text = warnings(response)
    missing = "'--kv-cache-memory-bytes' is not a flag of vllm serve 0.8.5 (it came in vLLM 0.10.2"
    assert (missing in text) is (not known), text
    assert (DEFAULT_NOTE in text) is image.endswith(":latest"), text


@pytest.mark.parametrize(
    ("image", "known"),
    [("vllm/vllm-openai:v0.8.5", True), ("vllm/vllm-openai:v0.11.0", True),
     ("vllm/vllm-openai:latest", False)],
)  # fmt: skip
def test_a_flag_a_later_release_dropped_is_read_by_the_old_release(webhook, image, known):
    response = review(webhook, image, LLAMA_8B, "--max-model-len", "4096", "--swap-space", "4")
    assert response["allowed"] is True
    dropped = f"'--swap-space' is not a flag of vllm serve {flag_table().vllm} (vLLM had it up to"
    assert (dropped in warnings(response)) is (not known), warnings(response)


@pytest.mark.parametrize(
    ("image", "utilization"),
    [("vllm/vllm-openai:v0.8.5", "0.9"), ("vllm/vllm-openai:v0.11.0", "0.9"),
     ("vllm/vllm-openai:v0.33.0", "0.92"), ("vllm/vllm-openai:v0.34.0", "1.0"),
     ("vllm/vllm-openai:latest", "1.0"), ("vllm/vllm-openai@sha256:" + "a" * 64, "1.0")],
)  # fmt: skip
def test_the_accounting_is_the_images_release(webhook, image, utilization):
    """Qwen3-8B at 32k on an L4 is denied by every release; the budget it is judged
    against is the release's: vLLM's default utilization is 0.92 from 0.20, 0.9 before, and
    from 0.34 a cap of 1.0 on the extensible KV cache (the default release's, for an image
    that names none)."""
    response = review(webhook, image, QWEN3_8B, "--max-model-len", "32000")
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert re.search(rf"at --gpu-memory-utilization {re.escape(utilization)}(?!\d)", message)
    defaulted = DEFAULT_NOTE in warnings(response)
    assert defaulted is ("latest" in image or "@" in image), warnings(response)


def test_the_configured_default_release_reads_untagged_images():
    webhook = webhook_from_settings(Settings(default_vllm_version="0.8.5"))
    response = review(webhook, "vllm/vllm-openai:latest", LLAMA_8B, "--swap-space", "4",
                      "--max-model-len", "4096")  # fmt: skip
    assert response["allowed"] is True
    assert warnings(response) == (
        "container 'vllm' of Deployment ml-serving/llama: image 'vllm/vllm-openai:latest' "
        "names no vLLM release: read as vLLM 0.8.5 (the configured default); tag it :vX.Y.Z "
        "to read its own"
    )


def test_an_abbreviated_flag_is_read_and_an_ambiguous_one_named(webhook):
    """Published manifests spell --max-num-seq and --gpu-memory-util; vLLM reads them."""
    image = "vllm/vllm-openai:v0.11.0"
    short = review(webhook, image, QWEN3_8B, "--max-model-len", "32000", "--gpu-memory-util=0.8")
    assert "at --gpu-memory-utilization 0.8" in short["status"]["message"]
    ambiguous = review(webhook, image, LLAMA_8B, "--max-model-len", "4096", "--max", "8")
    assert ambiguous["allowed"] is True
    assert "ambiguous option: --max could match --max-cpu-loras, " in warnings(ambiguous)


def test_an_unknown_draft_warns_as_an_unknown_target_does(webhook, tmp_path: Path):
    """An offline EAGLE-3 head (not in the catalog) is not denied: like an unknown target,
    it is allowed with a warning naming it (webhook_unknown_model=deny denies both)."""
    head = str(tmp_path / "EAGLE3-LLaMA3.1-Instruct-8B")
    eagle3 = json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": 3})
    image = "vllm/vllm-openai:v0.33.0"
    response = review(webhook, image, LLAMA_8B, "--max-model-len", "4096", "-sc", eagle3)
    assert response["allowed"] is True
    assert (
        f"speculative_config's draft model '{head}' is unknown to gatekeeper (not in the "
        "catalog; " in warnings(response)
    )
    strict = webhook_from_settings(Settings(webhook_unknown_model="deny"))
    denied = review(strict, image, LLAMA_8B, "--max-model-len", "4096", "-sc", eagle3)
    assert denied["allowed"] is False
    assert "denied (webhook_unknown_model=deny)" in denied["status"]["message"]
    target = review(strict, image, "acme/unknown-13b", "--max-model-len", "4096")
    assert target["allowed"] is False


@pytest.mark.parametrize(("size", "shown"), [("12G", "12.00 GiB"), ("12g", "11.18 GiB")])
def test_an_annotated_size_reads_g_as_vllm_does(webhook, size, shown):
    """vllm-gatekeeper.io/gpu-memory: 12G is 12 x 2^30 bytes, as vLLM's flags read 12G."""
    response = answer(webhook, deployment(annotations={"vllm-gatekeeper.io/gpu-memory": size}))
    assert response["allowed"] is False
    assert (
        f"does not fit on a {shown} GPU (annotation vllm-gatekeeper.io/gpu-memory)"
        in (response["status"]["message"])
    )
