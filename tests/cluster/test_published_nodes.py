"""The webhook's Nodes' labels (``gatekeeper.k8s.published.node_labels``), listed from the
real apiserver as metadata only and in pages: the same labels as lightkube's full list of
the Nodes, page after page when there are more Nodes than a page holds."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx2
import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.resources.core_v1 import Node

from gatekeeper.k8s.published import METADATA_ONLY, PublishedDevices, node_labels
from tests.support.kube_cluster import KubeCluster, ready_node

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


def full_list(api: Client) -> dict[str, dict[str, str]]:
    """What the webhook read before: lightkube's list of the whole Node objects."""
    return {
        str(n.metadata.name): dict(n.metadata.labels or {}) for n in api.list(Node) if n.metadata
    }


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
    expected = full_list(api)
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
    assert fleet.nodes == full_list(api)
