"""One sizing rule at every door (issue 39 item 3): the mutating webhook's claim, the
validating webhook's denial, ``gatekeeper check`` and ``gatekeeper plan`` size a rank of the
same vLLM line the same way and say so in the same words, "sized for N sequences of M
tokens" (``gatekeeper.placement.sizing``).

The issue's case: a production-stack Deployment of Llama-3.3-70B-Instruct (TP 2,
--max-model-len 8192, fp8 KV cache, two H100s) was denied by the webhook as needing a
figure "with a KV cache for one request" that was sized for more sequences, while ``check``
with sharing on admitted the same line."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.webhook import AdmissionWebhook
from gatekeeper.settings import Settings
from tests.cli.test_check import gatekeeper
from tests.k8s.test_workload_corpus import RenderedTemplates, corpus, review_body
from tests.support.vllm_workloads import patched

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
LINE = [MODEL, "--tensor-parallel-size", "2", "--max-model-len", "8192", "--kv-cache-dtype", "fp8"]
RELEASE = "0.34.0"


@pytest.fixture
def sharing(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Turns share_gpus on or off for the commands run next (GATEKEEPER_SHARE_GPUS)."""
    return lambda on: monkeypatch.setenv("GATEKEEPER_SHARE_GPUS", "true" if on else "false")


def check(line: list[str]) -> dict[str, Any]:
    out = gatekeeper("check", *line, "--node", "2xH100-80GB", "--vllm-version", RELEASE, "--json")
    assert out.returncode in (0, 1), out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def deployment(line: list[str]) -> dict[str, Any]:
    """production-stack's Deployment (tests/fixtures/workloads) serving ``line`` on two
    H100s."""
    workload, _ = corpus("production-stack-deployment")
    spec = workload["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    (container,) = spec["containers"]
    container["image"] = f"vllm/vllm-openai:v{RELEASE}"
    container["command"] = ["vllm", "serve", *line, "--host", "0.0.0.0", "--port", "8000"]
    return workload


@pytest.fixture(scope="module")
def webhook() -> AdmissionWebhook:
    return webhook_from_settings(Settings())


def mutate(webhook: AdmissionWebhook, line: list[str]) -> dict[str, Any]:
    workload = deployment(line)
    status, body, _ = Mutator(webhook, RenderedTemplates([])).answer(review_body(workload))
    assert status == 200
    response: dict[str, Any] = body["response"]
    if response.get("patch"):
        after = patched(workload, json.loads(base64.b64decode(response["patch"])))
        annotations = after["spec"]["template"]["metadata"]["annotations"]
        response["record"] = json.loads(annotations[CLAIM_ANNOTATION])["vllm"]
    return response


def test_the_issue_case_claim_and_check_with_sharing_give_the_same_bytes_and_words(
    webhook, sharing
):
    response = mutate(webhook, LINE)
    assert response["allowed"], response
    claimed = response["record"]
    sharing(True)
    placed = check(LINE)
    assert placed["admitted"], placed["reasons"]
    p = placed["placement"]
    assert claimed["memoryBytes"] >= max(p["promise_bytes"])  # rounded up to the 1 MiB step
    assert claimed["memoryBytes"] - max(p["promise_bytes"]) < 2**20
    assert claimed["kvCacheMemoryBytes"] == p["flags"]["kv_cache_memory_bytes"]
    # the KV cache is sized for as many sequences as fit (up to shared_kv_sequences), said so
    assert p["kv_sequences"] == 5
    assert p["sizing"] == "KV cache 3.13 GiB sized for 5 sequences of 8192 tokens"


def test_a_line_no_rank_holds_is_refused_by_both_doors_in_the_same_words(webhook, sharing):
    line = [*LINE[:3], "--max-model-len", "131072", *LINE[5:]]
    response = mutate(webhook, line)
    assert not response["allowed"]
    denial = response["status"]["message"]
    sharing(True)
    placed = check(line)
    assert not placed["admitted"]
    (need,) = [r for r in placed["reasons"] if " at TP=2 needs " in r]
    assert need in denial, (need, denial)
    assert "KV cache 10.00 GiB sized for 1 sequence of 131072 tokens" in need
    assert "for one request" not in denial


def test_the_validating_webhook_and_check_give_the_same_bytes_and_words(webhook, sharing):
    """The validating webhook asks whether vLLM starts (the need inside its budget against
    ``u x total``), and heads its denial with what the GPU holds for a rank, as placement
    counts it: the same figure and KV cache as check's refusal of the line."""
    line = [*LINE[:3], "--max-model-len", "131072", *LINE[5:]]
    status, body, outcome = webhook.answer(review_body(deployment(line)))
    assert (status, outcome) == (200, "denied"), body
    denial = body["response"]["status"]["message"]
    sharing(False)
    placed = check(line)
    (need,) = [r for r in placed["reasons"] if " at TP=2 needs " in r]
    per_gpu = need.split(" needs ")[1].split(" per GPU")[0]
    assert f"at TP=2 it needs {per_gpu} per GPU (CUDA context " in denial
    kv = "KV cache 10.00 GiB sized for 1 sequence of 131072 tokens"
    assert kv in need and f"{kv} (vLLM's least)" in denial


FIRST_DAY = """node = "1xH200"
[[deployments]]
model = "Qwen/Qwen3-0.6B"
max_model_len = 8192
[[deployments]]
model = "Qwen/Qwen2.5-7B-Instruct-AWQ"
max_model_len = 16384
"""


def test_plan_names_share_gpus_where_sharing_would_place_the_refused(tmp_path, sharing):
    """The issue's plan: a 0.6B model takes a whole H200 and a 7B AWQ model is refused.
    The refusal names share_gpus with what sharing gives it, computed by running the plan
    again with sharing on; the plan says what it would place that way."""
    path = tmp_path / "plan.toml"
    path.write_text(FIRST_DAY)
    sharing(False)
    out = gatekeeper("plan", str(path))
    assert out.returncode == 1, out.stderr
    assert "REJECTED 1:Qwen/Qwen2.5-7B-Instruct-AWQ" in out.stdout
    assert "GPU 0 in use by another gatekeeper worker (sharing is off)" in out.stdout
    assert (
        "share_gpus = true (GATEKEEPER_SHARE_GPUS=true) fits it on GPU 0 as this plan places "
        "it: KV cache 7.00 GiB sized for 8 sequences of 16384 tokens (--kv-cache-memory-bytes"
    ) in out.stdout
    assert "this plan places 2 of 2 deployments on 1 GPU(s); now 1 on 1" in out.stdout
    assert "0.00 GiB is held" not in out.stdout
    result = json.loads(gatekeeper("plan", str(path), "--json").stdout)
    assert result["with_share_gpus"]["admitted"] == 2
    kinds = [s["kind"] for s in result["deployments"][1]["suggestions"]]
    assert kinds[0] == "share_gpus"
    sharing(True)
    shared = gatekeeper("plan", str(path))
    assert shared.returncode == 0 and "share_gpus = true" not in shared.stdout
    assert "KV cache 7.00 GiB sized for 8 sequences of 16384 tokens" in shared.stdout


def test_a_refusal_sharing_would_not_admit_does_not_name_it(sharing):
    sharing(False)
    placed = check([MODEL, "--max-model-len", "131072"])
    assert not placed["admitted"]
    assert all(s["kind"] != "share_gpus" for s in placed["suggestions"])
