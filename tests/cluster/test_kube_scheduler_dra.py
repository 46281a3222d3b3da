"""GPU memory as DRA consumable capacity, allocated by the real kube-scheduler (issue 29).

Two Nodes (no kubelet, Ready by their registered status), each publishing the
ResourceSlice ``gatekeeper.cluster.resource_slice`` makes of two recorded H100s: a
``memory`` capacity of 77.1 GiB each, ``allowMultipleAllocations`` and a 1 MiB-step
request policy. Pods ask for bytes through ResourceClaimTemplates; the controller manager's
resource-claim controller makes the claims, the scheduler's DynamicResources plugin
allocates them (k8s.io/dynamic-resource-allocation/structured, allocator.go) and binds the
pods. The tests read what the scheduler wrote: ``spec.nodeName``, ``status.allocation`` and
its ``consumedCapacity``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.utils.quantity import parse_quantity

from bench.cluster_fleet import device_class
from gatekeeper.cluster import DRIVER_NAME, device_name, resource_slice
from gatekeeper.gpus import InventorySnapshot, StaticInventory
from gatekeeper.placement.policy import PlacementPolicy
from tests.support.kube_cluster import KubeCluster, create_unless_present, ready_node

pytestmark = pytest.mark.k8s

DRIVER = DRIVER_NAME
NODES = ("node-a", "node-b")
GPUS_PER_NODE = 2
GiB = 2**30
MiB = 2**20
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"
POLICY = PlacementPolicy()
RANK_BYTES = 12 * GiB
PODS = 20
BIND_TIMEOUT_SECONDS = 60.0


def node_gpus(node_name: str) -> InventorySnapshot:
    """Two of the recorded H100s, with UUIDs of this node's own."""
    recorded = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json").snapshot()
    gpus = tuple(
        dataclasses.replace(gpu, uuid=f"GPU-{node_name}-{gpu.index:04d}")
        for gpu in recorded.gpus[:GPUS_PER_NODE]
    )
    return dataclasses.replace(recorded, gpus=gpus)


def claim_template(name: str, namespace: str, memory_bytes: int) -> dict[str, Any]:
    request = {
        "name": "rank0",
        "exactly": {
            "deviceClassName": DRIVER,
            "capacity": {"requests": {"memory": str(memory_bytes)}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pod(name: str, namespace: str, template: str) -> dict[str, Any]:
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.32.0",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


@pytest.fixture(scope="module")
def cluster_client(kube_cluster: KubeCluster) -> Iterator[Client]:
    """A client on a cluster with the two nodes, the DeviceClass and the two slices."""
    client = kube_cluster.client()
    slices = [resource_slice(name, node_gpus(name), POLICY) for name in NODES]
    create_unless_present(client, device_class())  # another module may have made it
    for manifest in (*map(ready_node, NODES), *slices):
        client.create(from_dict(manifest))
    yield client
    client.close()


def _namespace(client: Client, name: str) -> str:
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    return name


def _wait_bound(client: Client, name: str, namespace: str) -> str:
    deadline = time.monotonic() + BIND_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = client.get(Pod, name, namespace=namespace)
        if found.spec is not None and found.spec.nodeName:
            return found.spec.nodeName
        time.sleep(0.02)
    raise AssertionError(f"pod {namespace}/{name} was not bound in {BIND_TIMEOUT_SECONDS} s")


def _claim_results(client: Client, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """Each pod's claim's allocation results, by pod name, as plain dicts."""
    results: dict[str, list[dict[str, Any]]] = {}
    for claim in client.list(ResourceClaim, namespace=namespace):
        raw = claim.to_dict()
        owner = raw["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"]
        assert owner == "gpu"
        pod_name = raw["metadata"]["ownerReferences"][0]["name"]
        results[pod_name] = raw["status"]["allocation"]["devices"]["results"]
    return results


def _published_capacity(client: Client) -> dict[str, Decimal]:
    """Each device's ``memory`` capacity as the apiserver holds it, by pool/device, for
    this module's nodes (other modules' slices may be in the session too)."""
    capacity: dict[str, Decimal] = {}
    for published in client.list(ResourceSlice):
        spec = published.to_dict()["spec"]
        if spec["pool"]["name"] not in NODES:
            continue
        for device in spec["devices"]:
            memory = parse_quantity(device["capacity"]["memory"]["value"])
            assert memory is not None
            capacity[f"{spec['pool']['name']}/{device['name']}"] = memory
    return capacity


def _consumed_per_device(results: dict[str, list[dict[str, Any]]]) -> dict[str, Decimal]:
    consumed: dict[str, Decimal] = defaultdict(Decimal)
    for pod_results in results.values():
        for result in pod_results:
            memory = parse_quantity(result["consumedCapacity"]["memory"])
            assert memory is not None
            consumed[f"{result['pool']}/{result['device']}"] += memory
    return consumed


@pytest.fixture(scope="module")
def bound(cluster_client: Client) -> dict[str, Any]:
    """Twenty pods of one 12 GiB rank each, created one after another, each waited for.

    Returns each pod's node, the seconds from create to bound (polled every 20 ms), and
    every claim's allocation results.
    """
    namespace = _namespace(cluster_client, "fill")
    cluster_client.create(from_dict(claim_template("rank-12g", namespace, RANK_BYTES)))
    nodes: dict[str, str] = {}
    seconds: list[float] = []
    for i in range(PODS):
        name = f"worker-{i:02d}"
        start = time.monotonic()
        cluster_client.create(from_dict(pod(name, namespace, "rank-12g")))
        nodes[name] = _wait_bound(cluster_client, name, namespace)
        seconds.append(time.monotonic() - start)
    results = _claim_results(cluster_client, namespace)
    capacity = _published_capacity(cluster_client)
    return {"nodes": nodes, "seconds": seconds, "results": results, "capacity": capacity}


def test_the_published_slices_keep_the_consumable_capacity_fields(cluster_client: Client) -> None:
    """The apiserver drops fields of a disabled feature gate: these must survive."""
    for name in NODES:
        sent = resource_slice(name, node_gpus(name), POLICY)
        kept = cluster_client.get(ResourceSlice, sent["metadata"]["name"]).to_dict()
        for device in kept["spec"]["devices"]:
            assert device["allowMultipleAllocations"] is True
            policy = device["capacity"]["memory"]["requestPolicy"]
            assert parse_quantity(policy["validRange"]["step"]) == MiB
        assert len(kept["spec"]["devices"]) == GPUS_PER_NODE


def test_scheduler_binds_every_pod_to_a_published_node(bound: dict[str, Any]) -> None:
    assert len(bound["nodes"]) == PODS
    assert set(bound["nodes"].values()) <= set(NODES)
    p50 = statistics.median(bound["seconds"])
    print(f"create to bound: p50 {p50 * 1000:.0f} ms, max {max(bound['seconds']) * 1000:.0f} ms")


def test_claims_name_the_device_and_consume_the_requested_bytes(bound: dict[str, Any]) -> None:
    assert set(bound["results"]) == set(bound["nodes"])
    for pod_name, results in bound["results"].items():
        (result,) = results
        assert result["request"] == "rank0"
        assert result["driver"] == DRIVER
        assert result["pool"] == bound["nodes"][pod_name]
        names = {device_name(gpu) for gpu in node_gpus(result["pool"]).gpus}  # from the uuids
        assert result["device"] in names
        assert parse_quantity(result["consumedCapacity"]["memory"]) == RANK_BYTES
        assert result.get("shareID"), "a shared device's allocation carries a shareID"


def test_consumed_capacity_never_exceeds_a_device(bound: dict[str, Any]) -> None:
    consumed = _consumed_per_device(bound["results"])
    capacity = bound["capacity"]
    assert sum(consumed.values()) == PODS * RANK_BYTES
    assert all(total <= capacity[device] for device, total in consumed.items()), consumed
    # An H100's 77.1 GiB holds six 12 GiB ranks: twenty need all four devices.
    assert set(consumed) == set(capacity)
    assert len(capacity) == len(NODES) * GPUS_PER_NODE


def test_a_request_off_the_step_is_rounded_up(cluster_client: Client) -> None:
    namespace = _namespace(cluster_client, "round")
    cluster_client.create(from_dict(claim_template("odd", namespace, GiB + 1)))
    cluster_client.create(from_dict(pod("odd", namespace, "odd")))
    _wait_bound(cluster_client, "odd", namespace)
    (result,) = _claim_results(cluster_client, namespace)["odd"]
    assert parse_quantity(result["consumedCapacity"]["memory"]) == GiB + MiB


def _scheduled_condition(client: Client, name: str, namespace: str) -> dict[str, Any]:
    deadline = time.monotonic() + BIND_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        status = client.get(Pod, name, namespace=namespace).to_dict().get("status", {})
        for condition in status.get("conditions", []):
            if condition["type"] == "PodScheduled":
                return dict(condition)
        time.sleep(0.1)
    raise AssertionError(f"pod {namespace}/{name} got no PodScheduled condition")


def test_a_rank_beyond_every_devices_remaining_bytes_stays_pending(
    cluster_client: Client, bound: dict[str, Any]
) -> None:
    consumed = _consumed_per_device(bound["results"])
    capacity = bound["capacity"]
    largest_free = max(capacity[device] - total for device, total in consumed.items())
    assert largest_free + MiB <= min(capacity.values()), "a fresh device would hold it"
    namespace = _namespace(cluster_client, "too-big")
    cluster_client.create(from_dict(claim_template("big", namespace, int(largest_free) + MiB)))
    cluster_client.create(from_dict(pod("big", namespace, "big")))
    condition = _scheduled_condition(cluster_client, "big", namespace)
    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert f"{len(NODES)} cannot allocate all claims" in condition["message"]
    print(f"pending: {condition['message']}")
    found = cluster_client.get(Pod, "big", namespace=namespace)
    assert found.spec is not None and not found.spec.nodeName
    (claim,) = cluster_client.list(ResourceClaim, namespace=namespace)
    assert claim.status is None or claim.status.allocation is None
