"""The workload corpus (tests/fixtures/workloads/) on the session's real apiserver: the
mutating webhook's decisions with the real template store, and what it writes created as
real objects. The pure AdmissionReview path over the whole corpus is
tests/k8s/test_workload_corpus.py's."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.resource_v1 import ResourceClaimTemplate

from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.template_store import ApiTemplateStore
from gatekeeper.settings import Settings
from tests.k8s.test_workload_corpus import GROUPS, corpus
from tests.support.kube_cluster import KubeCluster
from tests.support.vllm_workloads import patched, review

pytestmark = pytest.mark.k8s

NAMESPACE = "corpus"


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    api = kube_cluster.client()
    api.create(
        from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    )
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="module")
def mutator(client: Client) -> Mutator:
    return Mutator(webhook_from_settings(Settings()), ApiTemplateStore(client))


def _here(doc: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"]["namespace"] = NAMESPACE
    return out


def _templates(client: Client) -> set[str]:
    found = client.list(ResourceClaimTemplate, namespace=NAMESPACE)
    return {t.metadata.name for t in found if t.metadata is not None and t.metadata.name}


def test_llm_d_charts_own_claim_is_read_from_the_apiserver_and_left_alone(client, mutator):
    """The chart's rendered ResourceClaimTemplate (whole GPUs, NVIDIA's driver) applied
    first, as helm applies it: read back through the API, nothing to compare, no word."""
    workload, claims = corpus("llm-d-modelservice-dra")
    for claim in claims:
        client.create(from_dict(_here(claim)))
    kind = {**GROUPS["Deployment"], "kind": "Deployment"}
    m = mutator.decide(review(kind, _here(workload), NAMESPACE))
    assert (m.outcome, m.patch, m.denials, m.warnings) == ("unchanged", [], [], [])


@pytest.mark.parametrize(
    "name", ["vllm-docs-deployment", "production-stack-deployment", "aibrix-deployment"]
)
def test_claimed_workloads_are_created_with_their_claim_templates(client, mutator, name):
    """What the mutating webhook writes for these forms is accepted by the apiserver as
    written: the claim template first (by the webhook, through the API), then the
    patched Deployment, whose container reserves exactly the claimed bytes."""
    workload = _here(corpus(name)[0])
    kind = {**GROUPS["Deployment"], "kind": "Deployment"}
    m = mutator.decide(review(kind, workload, NAMESPACE))
    assert m.outcome == "mutated" and not m.denials, m
    (template,) = m.templates
    assert template["metadata"]["name"] in _templates(client)
    created = client.create(from_dict(patched(workload, m.patch)))
    assert isinstance(created, Deployment) and created.spec is not None
    pod = created.spec.template.spec
    assert pod is not None and pod.resourceClaims is not None
    (claim,) = pod.resourceClaims
    assert claim.resourceClaimTemplateName == template["metadata"]["name"]
    words = [*(pod.containers[0].command or []), *(pod.containers[0].args or [])]
    assert any("--kv-cache-memory-bytes" in w for w in words), words


def test_a_script_it_cannot_read_is_denied_and_creates_nothing(client, mutator):
    """KServe's LLMInferenceService script: flags in variables the script sets at run
    time. Denied with the reason, and no claim template appears."""
    workload = _here(corpus("kserve-llmisvc-deployment")[0])
    before = _templates(client)
    kind = {**GROUPS["Deployment"], "kind": "Deployment"}
    m = mutator.decide(review(kind, workload, NAMESPACE))
    assert m.outcome == "denied" and not m.patch and not m.templates
    assert "shell or Kubernetes expansions gatekeeper cannot resolve" in m.denials[0]
    assert _templates(client) == before
