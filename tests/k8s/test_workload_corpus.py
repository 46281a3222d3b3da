"""Workloads as the projects write them (tests/fixtures/workloads/*.yaml, each naming its
source repository, path and commit) through both webhooks' AdmissionReview answers: the
validating webhook judges each or names what it could not read; the mutating webhook
writes a claim whose flags read back, leaves it alone for a stated reason, or denies with
the reason. The same corpus through the real apiserver: tests/cluster/test_workload_corpus_apiserver.py."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.webhook import AdmissionWebhook
from gatekeeper.k8s.workloads import (
    gpu_product_constraint,
    pod_templates,
    vllm_containers,
)
from gatekeeper.settings import Settings
from gatekeeper.vllm.command import parse_vllm_command
from tests.support.vllm_workloads import patched

CORPUS = Path(__file__).parents[1] / "fixtures" / "workloads"
GROUPS = {
    "Deployment": {"group": "apps", "version": "v1"},
    "Pod": {"group": "", "version": "v1"},
    "LeaderWorkerSet": {"group": "leaderworkerset.x-k8s.io", "version": "v1"},
}
NO_GPU = "cannot tell whether it fits: no GPU named"
LATEST = "names no vLLM release: read as vLLM"
NO_BUDGET = "has no --kv-cache-memory-bytes (it came in 0.10.2)"
UNRESOLVED = "shell or Kubernetes expansions gatekeeper cannot resolve"


@dataclass(frozen=True)
class Expected:
    """What each webhook answers: its outcome and text every answer must hold."""

    validate: str
    says: tuple[str, ...]
    mutate: str
    mutate_says: tuple[str, ...] = ()


EXPECTED: dict[str, Expected] = {
    "vllm-docs-deployment": Expected("warned", (LATEST, NO_GPU), "mutated"),
    "production-stack-deployment": Expected("warned", (LATEST, NO_GPU), "mutated"),
    "aibrix-deployment": Expected("warned", (NO_GPU,), "mutated"),
    "gke-gemma-deployment": Expected(
        "warned",
        ("the worker would hold 22.19 GiB on a 22.05 GiB GPU",),
        "denied",
        ("vLLM 0.10.0 " + NO_BUDGET,),
    ),
    "gke-llama3-405b-lws": Expected("allowed", (), "denied", ("vLLM 0.8.5 " + NO_BUDGET,)),
    "lws-vllm-gpu": Expected("warned", (NO_GPU,), "denied", ("vLLM 0.8.5 " + NO_BUDGET,)),
    "llm-d-modelservice-dra": Expected(
        "warned",
        ("vLLM needs 2 GPUs (TP x PP x DP) but the pod requests no nvidia.com/gpu",),
        "unchanged",
    ),
    "llm-d-wide-ep-lws": Expected(
        "warned",
        ("--data-parallel-size '$((LWS_GROUP_SIZE * DP_SIZE_LOCAL))': give a whole number",),
        "denied",
        (UNRESOLVED, "'$START_RANK'"),
    ),
    "kserve-llmisvc-deployment": Expected(
        "warned",
        (
            "'${ACCESS_LOG_ARGS}': a shell expansion the container's literal env does not give",
            "model '/mnt/models' is unknown to gatekeeper",
        ),
        "denied",
        (UNRESOLVED, "'${KV_TRANSFER_ARGS}'"),
    ),
    # Dynamo's worker takes vLLM's engine arguments; its image's tag is Dynamo's release.
    "dynamo-worker-pod": Expected(
        "warned",
        ("image 'nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.7.1' " + LATEST, NO_GPU),
        "mutated",
    ),
    # Not read as vLLM (KAITO's own wrapper and config file): each webhook says so.
    "kaito-workspace-deployment": Expected(
        "warned",
        ("no vllm serve line gatekeeper can read, so it is not judged",),
        "warned",
        ("no claim is written",),
    ),
}


class RenderedTemplates:
    """The ResourceClaimTemplates the manifest's chart rendered beside the workload, read
    as the apiserver would hand them back; reviews are dry runs, so nothing is created."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.templates = {d["metadata"]["name"]: d for d in docs}

    def ensure(self, template: Any) -> None:
        raise AssertionError(f"a dry run created {template['metadata']['name']}")

    def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.templates.get(name)

    def to_bytes(self, quantity: str) -> int:
        return quantity_bytes(quantity)


def corpus(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The workload of a corpus file and the claim templates that come with it."""
    docs = [d for d in yaml.safe_load_all((CORPUS / f"{name}.yaml").read_text()) if d]
    claims = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
    (workload,) = [d for d in docs if d["kind"] != "ResourceClaimTemplate"]
    return workload, claims


def review_body(workload: dict[str, Any]) -> bytes:
    kind = {**GROUPS[workload["kind"]], "kind": workload["kind"]}
    request = {"uid": "corpus", "kind": kind, "operation": "CREATE", "namespace": "corpus",
               "object": workload, "dryRun": True}  # fmt: skip
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode()


@pytest.fixture(scope="module")
def webhook() -> AdmissionWebhook:
    return webhook_from_settings(Settings())


def test_every_corpus_file_names_its_source_and_has_an_expectation():
    names = {p.stem for p in CORPUS.glob("*.yaml")}
    assert names == set(EXPECTED)
    for name in names:
        head = (CORPUS / f"{name}.yaml").read_text().split("\n", 3)
        assert head[0].startswith("# Source: ") and "commit" in " ".join(head), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_validating_webhook_judges_or_names_what_it_could_not_read(webhook, name):
    workload, _ = corpus(name)
    status, body, outcome = webhook.answer(review_body(workload))
    response = body["response"]
    text = "\n".join([response.get("status", {}).get("message", ""), *response.get("warnings", [])])
    assert (status, outcome) == (200, EXPECTED[name].validate), text
    for piece in EXPECTED[name].says:
        assert piece in text, (name, text)
    assert "unexpected argument" not in text  # an expansion is never taken for a bad flag


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_mutating_webhook_claims_leaves_alone_or_denies_with_the_reason(webhook, name):
    workload, claims = corpus(name)
    mutator = Mutator(webhook, RenderedTemplates(claims))
    status, body, outcome = mutator.answer(review_body(workload))
    response = body["response"]
    assert (status, outcome) == (200, EXPECTED[name].mutate), response
    said = "\n".join([response.get("status", {}).get("message", ""), *response.get("warnings", [])])
    for piece in EXPECTED[name].mutate_says:
        assert piece in said, (name, response)
    if outcome != "mutated":
        assert "patch" not in response
        return
    ops = json.loads(base64.b64decode(response["patch"]))
    after = patched(workload, ops)
    kubernetes_validate.validate(after, "1.34", strict=True)
    (template,) = pod_templates(after["kind"], after)
    record = json.loads(template.annotations[CLAIM_ANNOTATION])
    for container in vllm_containers(template):
        written = record[container.name]
        options = container.command.options
        assert options.kv_cache_memory_bytes == written["kvCacheMemoryBytes"]
        assert options.gpu_memory_utilization == written["gpuMemoryUtilization"]
        assert container.gpus == written["ranks"]


def test_env_flags_expanded_in_a_script_are_read_as_flags():
    """KServe's ${VLLM_ADDITIONAL_ARGS}: an unquoted expansion is split into words, as the
    shell splits it, and read with argparse's spellings (--max_num_batched_tokens,
    --max-num-seq as an abbreviation of --max-num-seqs)."""
    workload, _ = corpus("kserve-llmisvc-deployment")
    (template,) = pod_templates("Deployment", workload)
    (container,) = vllm_containers(template)
    options = container.command.options
    assert (options.max_num_batched_tokens, options.max_num_seqs) == (4096, 32)
    assert options.tensor_parallel_size == 2 and container.command.model == "/mnt/models"
    script = "exec vllm serve $MODEL $EXTRA_ARGS"
    env = {"MODEL": "Qwen/Qwen3-8B", "EXTRA_ARGS": "--max-model-len 8192 --enforce-eager"}
    read = parse_vllm_command(["sh", "-c"], [script], "vllm/vllm-openai:v0.11.0", env)
    assert read is not None and not read.unknown and not read.problems
    assert (read.model, read.options.max_model_len, read.options.enforce_eager) == (
        "Qwen/Qwen3-8B", 8192, True,
    )  # fmt: skip


def test_gke_accelerator_labels_name_the_gpu():
    """GKE's samples pin a node pool with cloud.google.com/gke-accelerator, in a node
    selector or a required node affinity: read as the product it names."""
    workload, _ = corpus("gke-llama3-405b-lws")
    leader = pod_templates("LeaderWorkerSet", workload)[0].spec
    assert gpu_product_constraint(leader) == (
        ["H100-80GB"],
        "nodeSelector cloud.google.com/gke-accelerator: nvidia-h100-80gb, the product",
    )
    expression = {"key": "cloud.google.com/gke-accelerator", "operator": "In",
                  "values": ["nvidia-l4", "nvidia-gb300"]}  # fmt: skip
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}  # fmt: skip
    assert gpu_product_constraint({"affinity": affinity}) == (
        ["L4", "nvidia-gb300"],
        "required node affinity on cloud.google.com/gke-accelerator: nvidia-l4, the product",
    )


def _deployment(*containers: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": "x"}
    spec = {"containers": list(containers)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "namespace": "corpus"},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    }  # fmt: skip


def test_a_script_naming_vllm_that_cannot_be_split_is_said_by_both_webhooks(webhook):
    """An unbalanced quote: the validating webhook warns that it did not judge it (it used
    to pass in silence), the mutating one denies it; a router beside it is not named."""
    script = "exec vllm serve 'Qwen/Qwen3-8B --max-model-len 4096"
    workload = _deployment(
        {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "command": ["sh", "-c", script]},
        {"name": "router", "image": "lmcache/lmstack-router", "command": ["vllm-router"]},
    )
    status, body, outcome = webhook.answer(review_body(workload))
    warnings = body["response"].get("warnings", [])
    assert (status, outcome) == (200, "warned"), body
    assert len(warnings) == 1 and warnings[0].startswith(
        "container 'engine' of Deployment corpus/x: no vllm serve line gatekeeper can read, "
        "so it is not judged"
    ), warnings
    status, body, outcome = Mutator(webhook, RenderedTemplates([])).answer(review_body(workload))
    assert (status, outcome) == (200, "denied"), body
    assert "cannot be split as the shell would" in body["response"]["status"]["message"]
    assert not body["response"].get("warnings"), "said twice"
