"""The admission webhook: recorded AdmissionReviews for every workload kind (allowed,
denied, warned, skipped, non-vLLM, malformed) and the rules behind the decisions."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.errors import GatekeeperError, HubError
from gatekeeper.k8s.fit import gpu_from_value
from gatekeeper.k8s.review import MAX_WARNING_CHARS
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.webhook import AdmissionWebhook, WebhookConfig
from gatekeeper.models.source import resolve_model
from gatekeeper.placement import PlacementPolicy
from gatekeeper.settings import Settings
from tests.estimator.test_mechanisms import EAGLE_LLAMA
from tests.support.sidecar_harness import running_sidecar, settings_for

FIXTURES = Path(__file__).parents[1] / "fixtures" / "admission"
KINDS = ["pod", "deployment", "statefulset", "replicaset", "job", "cronjob", "leaderworkerset"]
CASES = ["allowed", "denied", "warned", "skipped", "non-vllm", "malformed"]

DENIED: dict[str, list[str]] = {
    "pod": [
        "container 'vllm' of Pod ml-serving/qwen3-8b: Qwen/Qwen3-8B does not fit on L4 "
        "(nodeSelector nvidia.com/gpu.product=NVIDIA-L4): at TP=1 it needs 22.06 GiB per GPU",
        "KV cache 4.40 GiB sized for 1 sequence of 32000 tokens (vLLM's least)",
        "the GPU has 22.05 GiB, of which vLLM may use 20.29 GiB at --gpu-memory-utilization 0.92",
        "Would fit: --tensor-parallel-size 2 with nvidia.com/gpu: 2; or --max-model-len 16064; "
        "or --kv-cache-dtype fp8; or --quantization fp8_per_tensor (online fp8 weights).",
    ],
    "deployment": [
        "meta-llama/Llama-3.3-70B-Instruct does not fit on H100-80GB (required node affinity on "
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3): at TP=1 it needs 147.43 GiB per GPU "
        "(CUDA context 0.53 GiB outside vLLM's budget; inside it 146.89 GiB: weights 131.45 GiB",
        "Would fit: --tensor-parallel-size 2 with nvidia.com/gpu: 2 and --max-model-len 3424; "
        "or --tensor-parallel-size 4 with nvidia.com/gpu: 4.",
    ],
    "statefulset": [
        "container 'vllm' of StatefulSet ml-serving/mistral-small: --tensor-parallel-size 4 needs "
        "4 GPUs in the pod but it requests 2 nvidia.com/gpu; set resources.limits "
        "nvidia.com/gpu: 4 or lower --tensor-parallel-size to 2",
    ],
    "replicaset": [
        "Qwen/Qwen2.5-72B-Instruct does not fit on A100-40GB",
        "but the GPU has 39.38 GiB, of which vLLM may use 36.23 GiB",
        "Would fit: --tensor-parallel-size 8 with nvidia.com/gpu: 8.",
    ],
    "job": [
        "meta-llama/Llama-3.1-8B-Instruct does not fit on T4 (nodeSelector "
        "nvidia.com/gpu.product=Tesla-T4): at TP=1 it needs 16.83 GiB per GPU",
        "vLLM would refuse: weights need 14.99 GiB per GPU but only 14.03 GiB can be allocated",
        "Would fit: --tensor-parallel-size 2 with nvidia.com/gpu: 2; or --quantization "
        "fp8_per_tensor (online fp8 weights).",
    ],
    "cronjob": [
        "Qwen/Qwen2.5-14B-Instruct does not fit on A10G (annotation vllm-gatekeeper.io/gpu-memory)",
        "it needs 31.80 GiB per GPU",
    ],
    "leaderworkerset": [
        "container 'vllm' of LeaderWorkerSet ml-serving/llama-405b (leaderTemplate): "
        "meta-llama/Llama-3.1-405B-Instruct does not fit on H100-80GB",
        "at TP=8 it needs 106.79 GiB per GPU",
        "Would fit: --pipeline-parallel-size 2 (16 GPUs in the group); or --quantization "
        "fp8_per_tensor (online fp8 weights).",
    ],
}

WARNED: dict[str, str] = {
    "pod": "Qwen/Qwen3-8B fits on L4 with 0.13 GiB to spare, under the 0.94 GiB safety margin; "
    "lower --max-model-len to 16064 or use --kv-cache-dtype fp8",
    "deployment": "model 'acme-corp/private-llm-13b' is unknown to gatekeeper (not in the "
    "catalog), so it is not checked",
    "statefulset": "cannot tell whether it fits: no GPU named; set nodeSelector "
    "nvidia.com/gpu.product, annotate vllm-gatekeeper.io/gpu-memory, or set "
    "GATEKEEPER_WEBHOOK_DEFAULT_GPU",
    "replicaset": "--max-model-len 'lots': give a whole number (32k = 32,000, 32K = 32,768), or "
    "auto / -1; checked with vLLM's default instead",
    "job": "cannot tell whether it fits on 'NVIDIA-GH200-480GB' (nodeSelector "
    "nvidia.com/gpu.product): not in gatekeeper's GPU table",
    "cronjob": "cannot tell whether it fits: no model on the command line nor in a literal "
    "VLLM_MODEL, MODEL, MODEL_NAME",
    "leaderworkerset": "meta-llama/Llama-3.1-405B-Instruct fits on H100-80GB with 0.88 GiB to "
    "spare, under the 2.08 GiB safety margin; lower --max-model-len to 87824",
}

MALFORMED: dict[str, str] = {
    "pod": "request.uid: Field required",
    "deployment": "apiVersion: Input should be 'admission.k8s.io/v1' (got 'admission.k8s.io/v1beta1')",
    "statefulset": "request.object: Input should be a valid dictionary",
    "replicaset": "the body is not JSON (JSONDecodeError",
    "job": "request.operation: Input should be 'CREATE', 'UPDATE', 'DELETE' or 'CONNECT' (got 'PATCH')",
    "cronjob": "request.kind: Field required",
    "leaderworkerset": "request.uid: String should have at least 1 character",
}


@pytest.fixture(scope="module")
def webhook() -> AdmissionWebhook:
    return webhook_from_settings(Settings())


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def answer(webhook: AdmissionWebhook, review: dict[str, Any]) -> dict[str, Any]:
    status, body, _ = webhook.answer(json.dumps(review).encode())
    assert status == 200, body
    response: dict[str, Any] = body["response"]
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert response["uid"] == review["request"]["uid"]
    return response


def unaudited(response: dict[str, Any]) -> dict[str, Any]:
    """The response without the estimate every judged workload carries (test_decisions.py)."""
    return {k: v for k, v in response.items() if k != "auditAnnotations"}


def test_there_is_a_fixture_for_every_kind_and_case():
    names = {p.name for p in FIXTURES.glob("*.json")}
    assert names == {f"{k}-{c}.json" for k in KINDS for c in CASES}


@pytest.mark.parametrize("kind", KINDS)
def test_allowed(webhook, kind):
    response = answer(webhook, load(f"{kind}-allowed.json"))
    audit = response.pop("auditAnnotations")  # the estimate (test_decisions.py)
    assert response == {"uid": response["uid"], "allowed": True}
    assert audit["verdict"] == "allowed" and int(audit["estimate-bytes-per-rank"]) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_denied_with_the_reason(webhook, kind):
    response = answer(webhook, load(f"{kind}-denied.json"))
    assert response["allowed"] is False
    status = response["status"]
    assert status["code"] == 403 and status["reason"] == "Forbidden"
    for piece in DENIED[kind]:
        assert piece in status["message"]


@pytest.mark.parametrize("kind", KINDS)
def test_warned(webhook, kind):
    response = answer(webhook, load(f"{kind}-warned.json"))
    assert response["allowed"] is True
    assert any(WARNED[kind] in w for w in response["warnings"]), response["warnings"]
    assert all(len(w) <= MAX_WARNING_CHARS for w in response["warnings"])


@pytest.mark.parametrize("kind", KINDS)
def test_skipped_is_allowed_and_says_so(webhook, kind):
    response = answer(webhook, load(f"{kind}-skipped.json"))
    assert response["allowed"] is True and "status" not in response
    (warning,) = response["warnings"]
    assert warning.endswith(
        "vllm-gatekeeper.io/skip is true, so gatekeeper skipped its GPU memory check"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_non_vllm_is_allowed_silently(webhook, kind):
    response = answer(webhook, load(f"{kind}-non-vllm.json"))
    assert response == {"uid": response["uid"], "allowed": True}


@pytest.mark.parametrize("kind", KINDS)
def test_malformed_is_a_400_that_says_what_is_wrong(webhook, kind):
    status, body, outcome = webhook.answer((FIXTURES / f"{kind}-malformed.json").read_bytes())
    assert (status, outcome) == (400, "malformed")
    assert body["kind"] == "Status" and body["code"] == 400 and body["reason"] == "BadRequest"
    assert MALFORMED[kind] in body["message"]
    assert "gatekeeper takes an admission.k8s.io/v1 AdmissionReview" in body["message"]


# -- rules ------------------------------------------------------------------------------


def deployment(**changes: Any) -> dict[str, Any]:
    """deployment-allowed.json, with the pod template's parts replaced."""
    review = load("deployment-allowed.json")
    template = review["request"]["object"]["spec"]["template"]
    for key, value in changes.items():
        if key == "annotations":
            template["metadata"]["annotations"] = value
        elif key in ("args", "resources", "command", "env"):
            template["spec"]["containers"][0][key] = value
        else:
            template["spec"][key] = value
    return review


def test_annotation_wins_over_the_node_selector(webhook):
    big = deployment(annotations={"vllm-gatekeeper.io/gpu-memory": "H200"})
    assert answer(webhook, big)["allowed"] is True
    small = deployment(annotations={"vllm-gatekeeper.io/gpu-memory": "12GiB"})
    response = answer(webhook, small)
    assert response["allowed"] is False
    assert (
        "does not fit on a 12.00 GiB GPU (annotation vllm-gatekeeper.io/gpu-memory)"
        in (response["status"]["message"])
    )


def test_a_bad_annotation_is_denied_with_what_to_write(webhook):
    response = answer(webhook, deployment(annotations={"vllm-gatekeeper.io/gpu-memory": "eighty"}))
    assert response["allowed"] is False
    assert (
        "annotation vllm-gatekeeper.io/gpu-memory: 'eighty' is neither a size (79.19GiB) nor a GPU"
        in (response["status"]["message"])
    )


def test_several_products_are_judged_on_the_smallest(webhook):
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                           "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"]}]}
                ]
            }
        }
    }  # fmt: skip
    args = ["serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len=65536"]
    assert answer(webhook, deployment(args=args))["allowed"] is True
    response = answer(webhook, deployment(affinity=affinity, args=args))
    assert response["allowed"] is False
    assert (
        "does not fit on L4 (required node affinity on nvidia.com/gpu.product=NVIDIA-L4)"
        in (response["status"]["message"])
    )


def test_an_affinity_term_without_a_product_pins_nothing(webhook):
    terms = [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    ]  # fmt: skip
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}  # fmt: skip
    response = answer(webhook, deployment(affinity=affinity))
    assert response["allowed"] is True
    assert "no GPU named" in response["warnings"][0]


def test_the_configured_default_gpu(webhook):
    review = deployment(affinity=None)
    assert "no GPU named" in answer(webhook, review)["warnings"][0]
    settings = Settings(webhook_default_gpu="L4")
    defaulted = webhook_from_settings(settings)
    response = answer(defaulted, deployment(affinity=None, args=["serve", "Qwen/Qwen3-14B"]))
    assert response["allowed"] is False
    assert "does not fit on L4 (setting webhook_default_gpu)" in response["status"]["message"]


def test_a_bad_default_gpu_setting_fails_at_start():
    with pytest.raises(GatekeeperError, match="setting webhook_default_gpu: 'H1000'"):
        webhook_from_settings(Settings(webhook_default_gpu="H1000"))


def test_unknown_model_can_be_denied_by_setting():
    strict = webhook_from_settings(Settings(webhook_unknown_model="deny"))
    response = answer(strict, load("deployment-warned.json"))
    assert response["allowed"] is False
    assert "so it is denied (webhook_unknown_model=deny)" in response["status"]["message"]


def test_tp_without_a_gpu_request_warns_and_zero_gpus_is_denied(webhook):
    args = ["serve", "meta-llama/Llama-3.1-8B-Instruct", "-tp", "2"]
    response = answer(webhook, deployment(args=args, resources={}))
    assert response["allowed"] is True
    assert (
        "vLLM needs 2 GPUs (TP x PP x DP) but the pod requests no nvidia.com/gpu"
        in (response["warnings"][0])
    )
    zero = answer(webhook, deployment(resources={"limits": {"nvidia.com/gpu": 0}}))
    assert (
        "--tensor-parallel-size 1 needs 1 GPUs in the pod but it requests 0 nvidia.com/gpu"
        in (zero["status"]["message"])
    )


def test_pipeline_beyond_the_pod_warns_outside_a_leaderworkerset(webhook):
    args = ["serve", "meta-llama/Llama-3.1-8B-Instruct", "--pipeline-parallel-size=2"]
    response = answer(webhook, deployment(args=args))
    assert response["allowed"] is True
    assert "TP x PP x DP = 2 GPUs but the pod requests 1 nvidia.com/gpu" in response["warnings"][0]


def test_max_model_len_auto_lets_vllm_choose(webhook):
    args = ["serve", "Qwen/Qwen3-8B", "--max-model-len", "auto"]
    response = answer(
        webhook,
        deployment(args=args, affinity=None, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"}),
    )
    assert response["allowed"] is True


def test_operations_and_objects_that_are_not_checked(webhook):
    denied = load("deployment-denied.json")
    for change in (
        {"operation": "DELETE", "object": None, "oldObject": denied["request"]["object"]},
        {"subResource": "scale"},
        {"operation": "UPDATE", "oldObject": copy.deepcopy(denied["request"]["object"])},
    ):
        review = copy.deepcopy(denied)
        review["request"].update(change)
        assert answer(webhook, review) == {"uid": review["request"]["uid"], "allowed": True}
    deleting = copy.deepcopy(denied)
    deleting["request"]["object"]["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert answer(webhook, deleting)["allowed"] is True


def test_an_update_that_changes_the_template_is_checked(webhook):
    review = load("deployment-denied.json")
    review["request"]["operation"] = "UPDATE"
    review["request"]["oldObject"] = load("deployment-allowed.json")["request"]["object"]
    assert answer(webhook, review)["allowed"] is False


def test_every_vllm_container_is_judged_and_each_denial_is_reported(webhook):
    review = load("pod-denied.json")
    containers = review["request"]["object"]["spec"]["containers"]
    second = copy.deepcopy(containers[0])
    second["name"] = "vllm-b"
    containers.append(second)
    message = answer(webhook, review)["status"]["message"]
    assert "container 'vllm' of Pod" in message and "container 'vllm-b' of Pod" in message


def test_models_are_resolved_once():
    calls: list[str] = []

    def resolve(ref: str):
        calls.append(ref)
        return resolve_model(ref)

    hook = AdmissionWebhook(WebhookConfig(fit=PlacementPolicy()), resolve)
    for _ in range(3):
        answer(hook, load("pod-allowed.json"))
    assert calls == ["Qwen/Qwen3-8B"]


def test_a_hub_failure_is_named():
    def resolve(ref: str):
        raise HubError(f"hub: {ref} answered 503", field="model", value=ref)

    hook = AdmissionWebhook(WebhookConfig(default_gpu=gpu_from_value("L4", "test")), resolve)
    response = answer(hook, load("pod-allowed.json"))
    assert (
        "unknown to gatekeeper (the hub lookup failed: hub: Qwen/Qwen3-8B answered 503)"
        in (response["warnings"][0])
    )


def test_a_bug_admits_and_says_so():
    def resolve(ref: str):
        raise RuntimeError("boom")

    hook = AdmissionWebhook(WebhookConfig(), resolve)
    response = answer(hook, load("pod-allowed.json"))
    assert response["allowed"] is True
    assert response["warnings"] == ["gatekeeper: internal error (RuntimeError); allowed unchecked"]


def test_the_sidecar_serves_the_webhook(tmp_path):
    with running_sidecar(settings_for(tmp_path)) as sidecar:
        denied = sidecar.admin.post(
            "/k8s/validate", content=(FIXTURES / "job-denied.json").read_bytes()
        )
        assert denied.status_code == 200 and denied.json()["response"]["allowed"] is False
        bad = sidecar.admin.post("/k8s/validate", content=b"{")
        assert bad.status_code == 400 and "not JSON" in bad.json()["message"]


# -- every flag read with vLLM's table, every modelled flag counted ---------------------

L4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.3-70B-Instruct"
EAGLE_HEAD = EAGLE_LLAMA  # yuhuili/EAGLE-LLaMA3.1-Instruct-8B: one Llama decoder layer


def on_l4(webhook: AdmissionWebhook, *args: str, **changes: Any) -> dict[str, Any]:
    changes.setdefault("nodeSelector", L4)
    return answer(webhook, deployment(args=["serve", *args], affinity=None, **changes))


def test_lora_slots_are_counted(webhook):
    """8 adapters of rank 256 on Llama-3.1-8B: vLLM allocates every slot's A and B for
    every projection at start-up, 11.01 GiB at TP=1, which an L4 cannot hold beside the
    14.99 GiB of weights."""
    assert on_l4(webhook, LLAMA_8B, "--max-model-len", "4096")["allowed"] is True
    lora = ["--enable-lora", "--max-loras", "8", "--max-lora-rank", "256"]
    response = on_l4(webhook, LLAMA_8B, "--max-model-len", "4096", *lora)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "weights 26.00 GiB with LoRA slots 11.01 GiB" in message
    assert "weights need 26.00 GiB per GPU but only 21.52 GiB can be allocated" in message
    assert "Would fit: --tensor-parallel-size 2 with nvidia.com/gpu: 2." in message
    few = on_l4(webhook, LLAMA_8B, "--max-model-len", "4096", "--enable-lora", "--max-loras=2")
    assert few["allowed"] is True  # 2 slots of vLLM's default rank 16


def test_speculative_decoding_ngram_is_free_and_an_eagle_draft_is_counted(webhook, tmp_path):
    """At --max-model-len 28000 an L4 holds Llama-3.1-8B's KV cache (29,520 tokens fit,
    under the safety margin); ngram proposals cost no GPU memory; an EAGLE head (one
    decoder layer and fc, 0.47 GiB, and its KV page per token) leaves room for 24,768."""
    base = on_l4(webhook, LLAMA_8B, "--max-model-len", "28000")
    assert base["allowed"] is True
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    with_ngram = on_l4(
        webhook, LLAMA_8B, "--max-model-len", "28000", "--speculative-config", json.dumps(ngram)
    )
    assert with_ngram == base  # the same answer, the same warnings: nothing more to hold
    head = tmp_path / "eagle-llama3.1-8b"
    head.mkdir()
    (head / "config.json").write_text(json.dumps(EAGLE_HEAD))
    eagle = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    response = on_l4(
        webhook, LLAMA_8B, "--max-model-len", "28000", "--speculative-config", json.dumps(eagle)
    )
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "weights 15.46 GiB with draft model 0.47 GiB" in message
    assert "only 3.12 GiB is available (24768 tokens)" in message
    assert "or --max-model-len 17280;" in message  # with the safety margin left
    shorter = on_l4(webhook, LLAMA_8B, "--max-model-len", "17280", "-sc", json.dumps(eagle))
    assert unaudited(shorter) == {"uid": shorter["uid"], "allowed": True}


def test_a_draft_that_cannot_be_read_is_warned_about_naming_it(webhook, tmp_path):
    """As an unknown target is (tests/k8s/test_webhook_versions.py has the deny rule)."""
    missing = tmp_path / "no-such-eagle"
    eagle = {"model": str(missing), "method": "eagle", "num_speculative_tokens": 3}
    response = on_l4(webhook, LLAMA_8B, "-sc", json.dumps(eagle))
    assert response["allowed"] is True
    assert (
        f"speculative_config's draft model '{missing}' is unknown to gatekeeper (not in the "
        "catalog; model:" in response["warnings"][0]
    )


def test_the_draft_is_resolved_with_the_targets_resolver_once():
    calls: list[str] = []

    def resolve(ref: str):
        calls.append(ref)
        return resolve_model(ref)

    hook = AdmissionWebhook(WebhookConfig(default_gpu=gpu_from_value("H100-80GB", "test")), resolve)
    draft = {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}
    args = ["serve", LLAMA_8B, "--speculative-config", json.dumps(draft)]
    for _ in range(2):
        assert answer(hook, deployment(args=args, affinity=None))["allowed"] is True
    assert calls == [LLAMA_8B, "meta-llama/Llama-3.2-1B-Instruct"]


def test_cpu_offload_lets_a_70b_model_start_on_an_l4(webhook):
    """131.45 GiB of weights; --cpu-offload-gb 120 keeps 120 GiB (and up to one parameter
    more) of decoder layers in host memory (UVA), as vLLM's offloader does; 100 is too
    little for an L4."""
    denied = on_l4(webhook, LLAMA_70B, "--max-model-len", "4096")
    assert denied["allowed"] is False
    assert "weights need 131.45 GiB per GPU" in denied["status"]["message"]
    allowed = on_l4(webhook, LLAMA_70B, "--max-model-len", "4096", "--cpu-offload-gb", "120")
    assert unaudited(allowed) == {"uid": allowed["uid"], "allowed": True}
    short = on_l4(webhook, LLAMA_70B, "--max-model-len", "4096", "--cpu-offload-gb", "100")
    # vLLM moves whole parameters until the limit is crossed: a little over 100 GiB
    assert re.search(r"with 100\.\d\d GiB more offloaded to CPU memory", short["status"]["message"])


def test_an_unknown_flag_is_a_warning_not_a_denial(webhook):
    response = on_l4(webhook, LLAMA_8B, "--max-model-len", "4096", "--frobnicate", "yes")
    assert response["allowed"] is True
    assert response["warnings"] == [
        "container 'vllm' of Deployment ml-serving/llama: '--frobnicate' is not a flag of vllm "
        "serve 0.33.0; vLLM would refuse an unknown flag unless the image's "
        "release has it; checked without it"  # the fixture's image: vllm-openai:v0.33.0
    ]
    # the flags around it are still read: the length that does not fit is still denied
    long = on_l4(webhook, LLAMA_8B, "--frobnicate", "yes", "--max-model-len", "64k")
    assert long["allowed"] is False and "1 sequence of 64000 tokens" in long["status"]["message"]


def test_data_parallel_times_tensor_parallel_gpus(webhook):
    args = (LLAMA_8B, "-dp", "2", "-tp", "2")
    four = on_l4(webhook, *args, resources={"limits": {"nvidia.com/gpu": 4}})
    assert unaudited(four) == {"uid": four["uid"], "allowed": True}
    two = on_l4(webhook, *args, resources={"limits": {"nvidia.com/gpu": 2}})
    assert two["allowed"] is True
    assert "TP x PP x DP = 4 GPUs but the pod requests 2 nvidia.com/gpu" in two["warnings"][0]
    none = on_l4(webhook, *args, resources={})
    assert "vLLM needs 4 GPUs (TP x PP x DP)" in none["warnings"][0]
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    big = on_l4(webhook, LLAMA_70B, "-dp", "2", "--max-model-len", "8192", nodeSelector=h100,
                resources={"limits": {"nvidia.com/gpu": 2}})  # fmt: skip
    assert "or --tensor-parallel-size 4 with nvidia.com/gpu: 8." in big["status"]["message"]


def test_hf_overrides_reach_the_models_config(webhook):
    """Llama-3.1-8B derives 131,072 tokens; asking 200,000 is refused by vLLM unless
    --hf-overrides raises the config's length, which the webhook now reads as vLLM does."""
    h100 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    longer = ["--max-model-len", "200000"]
    denied = answer(webhook, deployment(args=["serve", LLAMA_8B, *longer], affinity=None, **h100))
    assert denied["allowed"] is False
    assert "derived maximum 131072" in denied["status"]["message"]
    override = ["--hf-overrides", '{"max_position_embeddings": 262144}']
    allowed = answer(
        webhook, deployment(args=["serve", LLAMA_8B, *longer, *override], affinity=None, **h100)
    )
    assert allowed["allowed"] is True, allowed
