"""gatekeeper's own annotation names (#31 item 11): ``vllm-gatekeeper.io/*``, not OPA
Gatekeeper's look-alike ``gatekeeper.io/*``; the earlier names are read for one release,
each use warned of in the review, the new name winning when both are given."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.k8s.webhook import AdmissionWebhook
from gatekeeper.k8s.workloads import GPU_MEMORY_ANNOTATION, SKIP_ANNOTATION
from tests.k8s.test_webhook import answer, deployment, load
from tests.k8s.test_webhook import webhook as webhook  # the module's fixture

OLD_MEMORY, OLD_SKIP = "gatekeeper.io/gpu-memory", "gatekeeper.io/skip"


def deprecations(response: dict[str, Any]) -> list[str]:
    return [w for w in response.get("warnings", []) if "is deprecated" in w]


def test_the_names_are_our_own():
    assert GPU_MEMORY_ANNOTATION == "vllm-gatekeeper.io/gpu-memory"
    assert SKIP_ANNOTATION == "vllm-gatekeeper.io/skip"


@pytest.mark.parametrize("name", [GPU_MEMORY_ANNOTATION, OLD_MEMORY])
def test_both_memory_names_choose_the_gpu(webhook: AdmissionWebhook, name: str):
    assert answer(webhook, deployment(annotations={name: "H200"}))["allowed"] is True
    small = answer(webhook, deployment(annotations={name: "12GiB"}))
    assert small["allowed"] is False
    assert "does not fit on a 12.00 GiB GPU" in small["status"]["message"]


def test_only_the_old_names_are_warned_of(webhook: AdmissionWebhook):
    new = answer(webhook, deployment(annotations={GPU_MEMORY_ANNOTATION: "H200"}))
    assert deprecations(new) == []
    old = answer(webhook, deployment(annotations={OLD_MEMORY: "H200"}))
    (warning,) = deprecations(old)
    assert warning == (
        "Deployment ml-serving/llama: annotation gatekeeper.io/gpu-memory is deprecated "
        "(OPA Gatekeeper owns the gatekeeper names); rename it vllm-gatekeeper.io/gpu-memory: "
        "the old name is read until the next release"
    )


def test_the_new_name_wins_when_both_are_given(webhook: AdmissionWebhook):
    both = {GPU_MEMORY_ANNOTATION: "H200", OLD_MEMORY: "12GiB"}
    response = answer(webhook, deployment(annotations=both))
    assert response["allowed"] is True and len(deprecations(response)) == 1


@pytest.mark.parametrize("name", [SKIP_ANNOTATION, OLD_SKIP])
def test_both_skip_names_skip(webhook: AdmissionWebhook, name: str):
    review = load("deployment-denied.json")
    review["request"]["object"]["spec"]["template"]["metadata"]["annotations"] = {name: "true"}
    response = answer(webhook, review)
    assert response["allowed"] is True
    assert any(w.endswith("skipped its GPU memory check") for w in response["warnings"])
    assert len(deprecations(response)) == (name == OLD_SKIP)


# -- the manifests ----------------------------------------------------------------------

NAMESPACE = "vllm-gatekeeper"
AGENT_NAMESPACE = "vllm-gatekeeper-agent"  # the node agent's own, privileged (#39)
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "DeviceClass",
}


def test_the_manifests_use_our_namespace_and_names():
    from tests.k8s.test_manifests import ALL, DEPLOY, by_kind

    assert sorted(n["metadata"]["name"] for n in by_kind("Namespace")) == [
        NAMESPACE,
        AGENT_NAMESPACE,
    ]
    for path, doc in ALL:
        if doc["kind"] in CLUSTER_SCOPED or path.parent.name == "examples":
            continue
        agents = doc["metadata"]["name"] == "gatekeeper-agent" and doc["kind"] != "PodMonitor"
        wanted = AGENT_NAMESPACE if agents else NAMESPACE
        assert doc["metadata"].get("namespace") == wanted, (path, doc["kind"])
    text = "\n".join(p.read_text() for p in sorted(DEPLOY.rglob("*.yaml")))
    old = [line.strip() for line in text.splitlines() if " gatekeeper.io/" in f" {line}"]
    # only the namespace opt-out label still read for one release, and its comment
    assert old == [
        '# vllm-gatekeeper.io/skip: "true"). The earlier label gatekeeper.io/admission=disabled',
        "- key: gatekeeper.io/admission",
    ]
    assert "gatekeeper-webhook.gatekeeper.svc" not in text


def test_both_opt_out_labels_exclude_a_namespace():
    from tests.k8s.test_manifests import by_kind

    (config,) = by_kind("ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["name"] == "memory.vllm-gatekeeper.io"
    expressions = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
    for key in ("vllm-gatekeeper.io/admission", "gatekeeper.io/admission"):
        assert expressions[key]["operator"] == "NotIn" and expressions[key]["values"] == [
            "disabled"
        ]
    assert NAMESPACE in expressions["kubernetes.io/metadata.name"]["values"]
