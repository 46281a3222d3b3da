"""The webhook's Nodes' labels (``gatekeeper.k8s.published.node_labels``), listed from the
real apiserver as metadata only and in pages: the same labels as lightkube's full list of
the Nodes, page after page when there are more Nodes than a page holds."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from lightkube import Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.resources.core_v1 import Node, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType

from bench.node_list_bytes import lightkube_labels
from gatekeeper.k8s.fleet import Fleet
from gatekeeper.k8s.published import METADATA_ONLY, PublishedDevices, node_labels
from tests.support.kube_cluster import KubeCluster, ready_node
from tests.support.polling import wait_for

pytestmark = pytest.mark.k8s

NODES = [f"paged-{i}" for i in range(5)]
TAINT = {"key": "paged", "effect": "NoSchedule"}  # no other module's pod lands on them


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    """Five labelled Nodes beside whatever Nodes the session's other modules made."""
    client = kube_cluster.client()
    for i, name in enumerate(NODES):
        node = ready_node(name, (TAINT,))
        node["metadata"]["labels"].update({"nvidia.com/gpu.product": f"product-{i}", "zone": ""})
        client.create(from_dict(node))
    yield client
    for name in NODES:
        client.delete(Node, name)
    client.close()


def test_the_labels_read_as_metadata_in_pages_are_the_full_list_s(api: Client) -> None:
    pages: list[httpx2.Request] = []
    kinds: list[str] = []

    def seen(answer: httpx2.Response) -> None:
        pages.append(answer.request)
        answer.read()
        kinds.append(answer.json()["kind"])

    params = ConnectionParams(trust_env=False)
    with HttpClient(api.config, params) as http:
        http.event_hooks["response"] = [seen]
        read = node_labels(http, page_size=2)
    expected = lightkube_labels(api)
    assert read == expected and set(NODES) <= set(read)
    assert read["paged-3"] == {
        "kubernetes.io/hostname": "paged-3", "nvidia.com/gpu.product": "product-3", "zone": ""
    }  # fmt: skip
    assert len(pages) == math.ceil(len(expected) / 2) >= 3
    assert [p.url.params.get("limit") for p in pages] == ["2"] * len(pages)
    assert [p.url.params.get("continue") is not None for p in pages] == [
        False, *[True] * (len(pages) - 1)
    ]  # fmt: skip
    assert {p.headers["accept"] for p in pages} == {METADATA_ONLY}
    assert set(kinds) == {"PartialObjectMetadataList"}  # the apiserver's metadata only


def test_the_published_fleet_carries_the_labels_read_in_pages(api: Client) -> None:
    fleet = PublishedDevices(api, nodes_page_size=2)()
    assert fleet.error is None and fleet.nodes_error is None
    assert fleet.nodes == lightkube_labels(api)


READER = "published-reader"
SLICES_RULE = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}
NODES_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
RBAC = "rbac.authorization.k8s.io"
READER_OBJECTS: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "ServiceAccount",
     "metadata": {"name": READER, "namespace": "default"}},
    {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": {"name": READER},
     "rules": [SLICES_RULE, NODES_RULE]},
    {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": READER},
     "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": "default"}],
     "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": READER}},
]  # fmt: skip


@pytest.fixture
def reader_client(api: Client, kube_cluster: KubeCluster) -> Iterator[Client]:
    """A client as a ServiceAccount (a real token the apiserver signs: TokenRequest),
    bound to the ClusterRole ``READER`` (the webhook's two lists) for the test to narrow."""
    for manifest in READER_OBJECTS:
        api.create(from_dict(manifest))
    with HttpClient(api.config, ConnectionParams(trust_env=False)) as http:
        path = f"/api/v1/namespaces/default/serviceaccounts/{READER}/token"
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        answer = http.post(path, json=request)
        answer.raise_for_status()
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    for user in config["users"]:
        user["user"] = {"token": answer.json()["status"]["token"]}
    client = Client(KubeConfig.from_dict(config), trust_env=False)
    yield client
    client.close()
    api.delete(ClusterRoleBinding, READER)
    api.delete(ClusterRole, READER)
    api.delete(ServiceAccount, READER, namespace="default")


def test_nodes_refused_keep_the_last_labels_read_and_with_none_say_why(
    api: Client, reader_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The ServiceAccount's ClusterRole loses ``nodes`` list: a reader that read the labels
    before keeps them (logged), a new one has none and the apiserver's refusal."""
    reader = PublishedDevices(reader_client, refresh_seconds=0, nodes_page_size=2)
    before = reader()
    assert before.error is None and before.nodes == lightkube_labels(api)
    api.patch(ClusterRole, READER, {"rules": [SLICES_RULE]}, patch_type=PatchType.MERGE)

    def refused() -> Fleet | None:  # once the apiserver's RBAC has the narrower role
        fleet = PublishedDevices(reader_client)()
        return fleet if fleet.nodes_error is not None else None

    new = wait_for("the Nodes list refused", refused)
    assert new.error is None and new.nodes is None and new.nodes_error is not None
    assert new.nodes_error.startswith(
        "the apiserver refused to list nodes (403: nodes is forbidden: User "
        f'"system:serviceaccount:default:{READER}" cannot list resource "nodes"'
    ), new.nodes_error
    with caplog.at_level(logging.WARNING):
        kept = reader()
    assert kept.nodes == before.nodes and kept.nodes_error is None
    assert "webhook: the Nodes' labels: the apiserver refused to list nodes (403: " in caplog.text
