"""The mutating webhook's decisions (``gatekeeper.k8s.mutate.Mutator``) on reviews the
apiserver here cannot send (a LeaderWorkerSet: its CRD is not installed) or that need a
setting of their own, with the real template store on the session's apiserver: the
templates it creates and the hand-written ones it reads are real objects. The path through
a real MutatingWebhookConfiguration is ``test_mutating_webhook.py``'s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaimTemplate

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.template_store import ApiTemplateStore
from gatekeeper.settings import Settings
from tests.support.kube_cluster import KubeCluster
from tests.support.vllm_workloads import (
    APPS,
    MODEL,
    deployment,
    leaderworkerset,
    patched,
    review,
)

pytestmark = pytest.mark.k8s

NAMESPACE = "mutator"
DEPLOYMENT = {**APPS, "kind": "Deployment"}
SERVED = deployment("qwen", NAMESPACE, [MODEL, "--max-model-len", "8192", "-tp", "2"])


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    """The namespace, with a hand-written 1 GiB claim template ``small`` and a whole-GPU
    one ``whole-gpu`` of another driver's class (as llm-d's charts carry)."""
    api = kube_cluster.client()
    api.create(
        from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    )
    small = {
        "name": "gpu",
        "exactly": {"deviceClassName": DRIVER_NAME, "capacity": {"requests": {"memory": "1Gi"}}},
    }
    whole = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    for name, request in (("small", small), ("whole-gpu", whole)):
        api.create(from_dict({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }))  # fmt: skip
    try:
        yield api
    finally:
        api.close()


def _mutator(client: Client, **kwargs: Any) -> Mutator:
    return Mutator(webhook_from_settings(Settings()), ApiTemplateStore(client), **kwargs)


def _own_claim(name: str, template: str, args: list[str]) -> dict[str, Any]:
    manifest = deployment(name, NAMESPACE, args, resources={"claims": [{"name": "gpu"}]})
    manifest["spec"]["template"]["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": template}
    ]
    return manifest


def test_a_leaderworkerset_leader_gets_its_claim(client: Client):
    """LWS's vLLM example: Ray started in the leader's script, then vLLM with TP 2 x PP 2
    across the group's two pods of 2 GPUs each."""
    script = (
        f"ray start --head && exec vllm serve {MODEL} --max-model-len 4096 "
        "--tensor-parallel-size 2 --pipeline-parallel-size 2"
    )
    kind = {"group": "leaderworkerset.x-k8s.io", "version": "v1", "kind": "LeaderWorkerSet"}
    m = _mutator(client).decide(review(kind, leaderworkerset("lws", NAMESPACE, script), NAMESPACE))
    assert m.outcome == "mutated" and not m.denials, m
    paths = {op["path"] for op in m.patch}
    leader = "/spec/leaderWorkerTemplate/leaderTemplate"
    assert f"{leader}/spec/resourceClaims" in paths
    assert not any("workerTemplate" in p for p in paths)  # the worker runs Ray, not vLLM
    (edit,) = [op for op in m.patch if op["path"] == f"{leader}/spec/containers/0"]
    assert "--kv-cache-memory-bytes" in edit["value"]["command"][-1]
    (made,) = m.templates
    assert len(made["spec"]["spec"]["devices"]["requests"]) == 2  # the pod's GPUs, not TP x PP
    assert client.get(ResourceClaimTemplate, made["metadata"]["name"], namespace=NAMESPACE)


def test_an_undersized_claim_is_only_warned_about_when_so_set(client: Client):
    manifest = _own_claim("own-warn", "small", [MODEL, "--max-model-len", "4096"])
    mutator = _mutator(client, undersized="warn")
    m = mutator.decide(review(DEPLOYMENT, manifest, NAMESPACE))
    assert m.outcome == "warned" and not m.denials and not m.patch
    assert "claim template small requests 1073741824 bytes" in m.warnings[0]
    later = _own_claim("own-warn", "not-there-yet", [MODEL, "--max-model-len", "4096"])
    m = mutator.decide(review(DEPLOYMENT, later, NAMESPACE))  # applied in the same batch
    assert m.warnings == [
        "container 'vllm' of Deployment mutator/own-warn: claim template not-there-yet not "
        "found, so not checked"
    ]


def test_a_whole_gpu_claim_of_its_own_is_left_alone(client: Client):
    """llm-d's rendered charts carry a DRA claim of whole GPUs (another driver's class, no
    memory request) and argparse's spellings: nothing to compare, write or say."""
    args = [MODEL, "--max_num_batched_tokens", "8192", "--max-num-seq", "64"]
    m = _mutator(client).decide(
        review(DEPLOYMENT, _own_claim("llm-d", "whole-gpu", args), NAMESPACE)
    )
    assert (m.outcome, m.patch, m.denials, m.warnings, m.templates) == ("unchanged", [], [], [], [])


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_what_the_webhook_writes_validates_strictly(client: Client, version: str):
    """The patched workloads (a Deployment, a StatefulSet) and their claim templates, as
    the webhook writes them: before the apiserver could drop anything it does not know."""
    mutator = _mutator(client)
    stateful = {**SERVED, "kind": "StatefulSet", "spec": {**SERVED["spec"], "serviceName": "s"}}
    for kind, manifest in (("Deployment", SERVED), ("StatefulSet", stateful)):
        request = review({**APPS, "kind": kind}, manifest, NAMESPACE)
        m = mutator.decide(request.model_copy(update={"dry_run": True}))
        assert m.outcome == "mutated" and m.templates
        kubernetes_validate.validate(patched(manifest, m.patch), version, strict=True)
        for template in m.templates:
            kubernetes_validate.validate(template, version, strict=True)


def test_an_update_that_keeps_the_pod_template_is_not_mutated(client: Client):
    """A Deployment from before the webhook, relabelled: no rollout of gatekeeper's
    making. Its pods are claimed when the template next changes (or as they are made)."""
    mutator = _mutator(client)
    relabelled = {**SERVED, "metadata": {**SERVED["metadata"], "labels": {"team": "a"}}}
    kept = review(DEPLOYMENT, relabelled, NAMESPACE).model_copy(
        update={"operation": "UPDATE", "old_object": SERVED}
    )
    m = mutator.decide(kept)
    assert (m.outcome, m.patch) == ("ignored", [])
    edited = patched(SERVED, [])
    edited["spec"]["template"]["spec"]["containers"][0]["args"][2] = "4096"
    changed = kept.model_copy(update={"object": edited, "dry_run": True})
    assert mutator.decide(changed).outcome == "mutated"


def test_a_release_without_a_byte_budget_is_denied_with_the_release(client: Client):
    old = deployment("old", NAMESPACE, [MODEL, "--max-model-len", "4096"],
                     image="vllm/vllm-openai:v0.8.5")  # fmt: skip
    request = review(DEPLOYMENT, old, NAMESPACE).model_copy(update={"dry_run": True})
    m = _mutator(client).decide(request)
    assert m.outcome == "denied" and not m.patch
    assert "vLLM 0.8.5 has no --kv-cache-memory-bytes (it came in 0.10.2)" in m.denials[0]
