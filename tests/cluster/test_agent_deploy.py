"""deploy/kubernetes/components/cluster: the agent's DaemonSet arguments parse, and its RBAC,
applied to the real apiserver, allows exactly what ``gatekeeper agent`` does (issue 29); the
same for the mutating webhook (``gatekeeper webhook --mutate``) and its RBAC.

The apiserver's own RBAC authorizer answers: a SubjectAccessReview per request the agent
makes (gatekeeper/cluster/agent.py), as the agent's ServiceAccount, and per request the
webhook makes (gatekeeper/k8s/template_store.py), as the webhook's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.resource_v1 import DeviceClass

from gatekeeper.cli.entry import build_parser
from gatekeeper.cluster import DRIVER_NAME
from tests.support.kube_cluster import KubeCluster, create_unless_present

pytestmark = pytest.mark.k8s

COMPONENT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "components" / "cluster"
AGENT = "system:serviceaccount:vllm-gatekeeper-agent:gatekeeper-agent"
WEBHOOK = "system:serviceaccount:vllm-gatekeeper:gatekeeper-webhook"
# (verb, group, resource): each call gatekeeper/cluster/agent.py makes.
AGENT_CALLS = [
    ("get", "resource.k8s.io", "resourceslices"),
    ("create", "resource.k8s.io", "resourceslices"),
    ("update", "resource.k8s.io", "resourceslices"),
    ("list", "resource.k8s.io", "resourceclaims"),
    ("create", "", "events"),
    ("get", "", "pods"),  # the kubelet plugin: the vLLM flags of a claim's pods
    ("list", "", "pods"),  # the pods of its node holding nvidia.com/gpu in no claim
]
NOT_THE_AGENTS = [
    ("update", "resource.k8s.io", "resourceclaims"),
    ("delete", "resource.k8s.io", "resourceslices"),
    ("delete", "", "pods"),
    ("update", "", "nodes"),
    ("get", "", "secrets"),
]


CLUSTER_SCOPED = ("resourceslices", "nodes", "namespaces", "mutatingwebhookconfigurations")


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((COMPONENT / name).read_text()) if d]


@pytest.fixture(scope="module")
def rbac_client(kube_cluster: KubeCluster) -> Iterator[Client]:
    client = kube_cluster.client()
    for namespace in ("vllm-gatekeeper", "vllm-gatekeeper-agent"):  # the agent's own (#39)
        create_unless_present(client, {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})  # fmt: skip
    for doc in [*docs("agent-rbac.yaml"), *docs("webhook-rbac.yaml")]:
        client.create(from_dict(doc))
    yield client
    client.close()


def allowed(client: Client, verb: str, group: str, resource: str, user: str = AGENT) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}"],
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "namespace": "" if resource in CLUSTER_SCOPED else "agent-test",
            },
        },
    }
    answer = client.create(from_dict(review))
    assert isinstance(answer, SubjectAccessReview) and answer.status is not None
    return bool(answer.status.allowed)


@pytest.mark.parametrize("call", AGENT_CALLS, ids=lambda c: f"{c[0]}-{c[2]}")
def test_the_agents_rbac_allows_each_call_it_makes(
    rbac_client: Client, call: tuple[str, ...]
) -> None:
    assert allowed(rbac_client, *call)


@pytest.mark.parametrize("call", NOT_THE_AGENTS, ids=lambda c: f"{c[0]}-{c[2]}")
def test_the_agents_rbac_allows_nothing_else(rbac_client: Client, call: tuple[str, ...]) -> None:
    assert not allowed(rbac_client, *call)


def test_the_device_class_selects_the_agents_driver(rbac_client: Client) -> None:
    (device_class,) = docs("deviceclass.yaml")
    assert device_class["metadata"]["name"] == DRIVER_NAME
    (selector,) = device_class["spec"]["selectors"]
    assert selector["cel"]["expression"] == f'device.driver == "{DRIVER_NAME}"'
    try:  # the apiserver compiles the CEL expression on create
        rbac_client.create(from_dict(device_class))
    except ApiError as e:
        assert e.status.code == 409, e  # another cluster test made the same class
    else:  # the other cluster modules create it as their own
        rbac_client.delete(DeviceClass, DRIVER_NAME)


def test_the_daemonsets_arguments_are_the_agents() -> None:
    (daemonset,) = docs("agent-daemonset.yaml")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "agent"
    assert (args.gpus, args.interval, args.tolerance_mib) == ("nvml", 10.0, 512)
    (port,) = container["ports"]
    assert port == {"name": "metrics", "containerPort": args.metrics_port}
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "gatekeeper-agent"


WEBHOOK_CALLS = [
    ("create", "resource.k8s.io", "resourceclaimtemplates"),
    ("get", "resource.k8s.io", "resourceclaimtemplates"),
    # the template store's watch, the used-at stamp and the sweep (k8s/template_store.py,
    # k8s/template_sweep.py)
    ("list", "resource.k8s.io", "resourceclaimtemplates"),
    ("watch", "resource.k8s.io", "resourceclaimtemplates"),
    ("patch", "resource.k8s.io", "resourceclaimtemplates"),
    ("delete", "resource.k8s.io", "resourceclaimtemplates"),
    # the sweep keeps a template any workload in its namespace names
    ("list", "", "pods"),
    ("list", "apps", "replicasets"),
    ("list", "apps", "deployments"),
    ("list", "batch", "jobs"),
    ("list", "resource.k8s.io", "resourceslices"),  # --published-devices
    ("list", "", "nodes"),  # --published-devices: the labels a pod's node selector matches
    # --mutate: the namespaces its configuration's selector selects
    ("list", "admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    ("get", "", "namespaces"),
]
NOT_THE_WEBHOOKS = [
    ("update", "resource.k8s.io", "resourceclaimtemplates"),
    ("create", "resource.k8s.io", "resourceclaims"),
    ("delete", "", "pods"),
    ("get", "apps", "deployments"),
    ("create", "resource.k8s.io", "resourceslices"),
    ("create", "", "pods"),
    ("get", "", "secrets"),
    ("update", "", "nodes"),
    ("update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    ("list", "", "namespaces"),
]


@pytest.mark.parametrize("call", WEBHOOK_CALLS, ids=lambda c: f"{c[0]}-{c[2]}")
def test_the_webhooks_rbac_allows_each_call_it_makes(
    rbac_client: Client, call: tuple[str, ...]
) -> None:
    assert allowed(rbac_client, call[0], call[1], call[2], user=WEBHOOK)


@pytest.mark.parametrize("call", NOT_THE_WEBHOOKS, ids=lambda c: f"{c[0]}-{c[2]}")
def test_the_webhooks_rbac_allows_nothing_else(rbac_client: Client, call: tuple[str, ...]) -> None:
    assert not allowed(rbac_client, call[0], call[1], call[2], user=WEBHOOK)


def test_the_component_runs_the_webhook_with_mutate() -> None:
    """The component's patch, applied to the base Deployment's arguments, parses as
    ``gatekeeper webhook --mutate`` with the in-cluster client (no --kubeconfig)."""
    text = (COMPONENT.parents[1] / "webhook-deployment.yaml").read_text()
    (base,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    (container,) = base["spec"]["template"]["spec"]["containers"]
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    (patch,) = [p for p in kustomization["patches"] if p["target"]["kind"] == "Deployment"]
    ops = yaml.safe_load(patch["patch"])
    added = [o["value"] for o in ops if o["path"] == "/spec/template/spec/containers/0/args/-"]
    args = build_parser().parse_args([*container["args"], *added])
    assert (args.command, args.mutate, args.kubeconfig) == ("webhook", True, None)
    assert args.undersized_claims is None  # the setting webhook_undersized_claims decides
    token = [o for o in ops if o["path"].endswith("automountServiceAccountToken")]
    assert token == [{"op": "replace", "path": token[0]["path"], "value": True}]
