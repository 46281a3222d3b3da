"""Per-pod predicted components from the node agent (issue 30 item 3), on the real
apiserver and kube-scheduler with the NVML stand-in.

The mutating webhook (``Mutator``, the real template store) writes a Pod's claim, flags
and record (``vllm-gatekeeper.io/claim``, with the rank's components); the scheduler
allocates the claim's two ranks on a slice of the stand-in's H100s; the pod's processes
hold memory on both. ``gatekeeper.cli.agent.pod_collector``, the agent's own wiring
(lightkube client, the claims listed, each pod read for its record), then exports
``gatekeeper_worker_predicted_bytes{component}`` per device with the record's bytes,
beside the claim and NVML's usage. A pod with a claim of its own and no record has the
claim's series and no component series. A process's pod comes from cgroup files under a
temporary proc root (``tests.support.dra_kubelet.cgroups``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from prometheus_client import CollectorRegistry

from bench.cluster_fleet import device_class
from gatekeeper.cli.agent import pod_collector
from gatekeeper.cluster import DRIVER_NAME, device_name, resource_slice, slice_name
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.agent_metrics import PodComponents
from gatekeeper.cluster.attribution import pod_claims
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.estimator.components import COMPONENTS
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, FakeProcess, h100
from gatekeeper.k8s.mutate import Mutator
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.k8s.template_store import ApiTemplateStore
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.settings import Settings
from tests.support import vllm_workloads
from tests.support.dra_kubelet import cgroups
from tests.support.kube_cluster import KubeCluster, create_unless_present, ready_node

pytestmark = pytest.mark.k8s

GiB = 2**30
NODE, NAMESPACE = "components-node", "pod-components"
TAINT = {"key": "gatekeeper-test", "value": "components", "effect": "NoSchedule"}
POD = {"group": "", "version": "v1", "kind": "Pod"}
PINNED = {"tolerations": [{**TAINT, "operator": "Equal"}],
          "nodeSelector": {"kubernetes.io/hostname": NODE}}  # fmt: skip
TIMEOUT_SECONDS = 60.0


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    """The node (tainted: only this module's pods land there), the DeviceClass and the
    namespace; the node and its slice are deleted at the end."""
    api = kube_cluster.client()
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    for manifest in (device_class(), ready_node(NODE, (TAINT,)), namespace):
        create_unless_present(api, manifest)
    try:
        yield api
    finally:
        api.deletecollection(Pod, namespace=NAMESPACE)
        with contextlib.suppress(ApiError):  # made by the test, unless it failed first
            api.delete(ResourceSlice, slice_name(NODE))
        api.delete(Node, NODE)
        api.close()


def sized_pod(client: Client) -> dict[str, Any]:
    """vLLM's docs' container with TP 2, mutated by the webhook, created."""
    args = [vllm_workloads.MODEL, "--max-model-len", "8192", "-tp", "2"]
    template = vllm_workloads.deployment("qwen", NAMESPACE, args, pod=PINNED)["spec"]["template"]
    metadata = {**template["metadata"], "name": "qwen", "namespace": NAMESPACE}
    pod = {"apiVersion": "v1", "kind": "Pod", **template, "metadata": metadata}
    mutator = Mutator(webhook_from_settings(Settings()), ApiTemplateStore(client))
    m = mutator.decide(vllm_workloads.review(POD, pod, NAMESPACE))
    assert m.outcome == "mutated" and not m.denials, m
    made: Any = client.create(from_dict(vllm_workloads.patched(pod, m.patch)))
    return dict(made.to_dict())


def unrecorded_pod(client: Client) -> None:
    """A pod with a hand-written claim template of 1 GiB: no webhook, no record."""
    request = {"name": "rank0", "exactly": {"deviceClassName": DRIVER_NAME,
               "capacity": {"requests": {"memory": str(GiB)}}}}  # fmt: skip
    client.create(from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "own", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }))  # fmt: skip
    client.create(from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "own", "namespace": NAMESPACE},
        "spec": {**PINNED, "containers": [{"name": "app", "image": "busybox",
                 "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "own"}]},
    }))  # fmt: skip


def reserved_devices(client: Client, pods: int) -> dict[str, list[str]]:
    """Each pod's allocated devices, once its claim is reserved for it (bound)."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    found: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        found = {}
        for claim in (c.to_dict() for c in client.list(ResourceClaim, namespace=NAMESPACE)):
            status = claim.get("status") or {}
            for reserved in status.get("reservedFor") or []:
                results = status["allocation"]["devices"]["results"]
                found[reserved["name"]] = [r["device"] for r in results]
        if len(found) == pods:
            return found
        time.sleep(0.05)
    raise AssertionError(f"claims reserved for {sorted(found)}, not {pods} pods")


def test_the_webhook_s_components_reach_the_agent_s_series_per_pod(
    client: Client, fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    gpus = [h100(0), h100(1)]
    fake_nvml.set(gpus=gpus)
    inventory = NvmlInventory()
    try:
        client.create(from_dict(resource_slice(NODE, inventory.snapshot(), PlacementPolicy())))
        made = sized_pod(client)
        unrecorded_pod(client)
        devices = reserved_devices(client, 2)
        index = {device_name(inventory.snapshot().gpus[i]): i for i in range(2)}
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(client)}
        pids = {5001: "qwen", 5002: "qwen", 5003: "own"}
        places = [(index[devices["qwen"][0]], 5001), (index[devices["qwen"][1]], 5002),
                  (index[devices["own"][0]], 5003)]  # fmt: skip
        fake_nvml.set(gpus=gpus, processes=[FakeProcess(g, pid, 3 * GiB) for g, pid in places])
        pod_of = cgroups(tmp_path, {pid: uids[name] for pid, name in pids.items()})
        registry = CollectorRegistry()
        registry.register(pod_collector(client, NODE, DRIVER_NAME, inventory.snapshot, pod_of))
        record = json.loads(made["metadata"]["annotations"][CLAIM_ANNOTATION])["vllm"]
        assert set(record["components"]) == set(COMPONENTS)
        claims = {p: _claim_of(client, p) for p in ("qwen", "own")}
        value = registry.get_sample_value
        for device in devices["qwen"]:
            labels = {
                "namespace": NAMESPACE,
                "pod": "qwen",
                "claim": claims["qwen"],
                "device": device,
            }
            assert value("gatekeeper_worker_predicted_total_bytes", labels) == record["memoryBytes"]
            assert value("gatekeeper_worker_actual_bytes", labels) == 3 * GiB
            for component, expected in record["components"].items():
                assert (
                    value("gatekeeper_worker_predicted_bytes", {**labels, "component": component})
                    == expected
                )
        (own,) = devices["own"]
        labels = {"namespace": NAMESPACE, "pod": "own", "claim": claims["own"], "device": own}
        assert value("gatekeeper_worker_predicted_total_bytes", labels) == GiB
        assert (
            value("gatekeeper_worker_predicted_bytes", {**labels, "component": "weights"}) is None
        )
        samples = [s for f in registry.collect() for s in f.samples]
        by_component = [s for s in samples if s.name == "gatekeeper_worker_predicted_bytes"]
        assert {s.labels["pod"] for s in by_component} == {"qwen"}
        assert len(by_component) == 2 * len(COMPONENTS)
        read_once(client)
    finally:
        inventory.close()


def read_once(client: Client) -> None:
    """The agent's ``PodComponents`` on this node's claims: three scrapes, each pod read
    once; a pod no longer in a claim is forgotten, and read again when it comes back."""
    claims = [c.to_dict() for c in client.list(ResourceClaim, namespace=NAMESPACE)]
    found = pod_claims(claims, DRIVER_NAME, NODE, quantity_bytes)
    reads: list[str] = []

    def read(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        pod: dict[str, Any] = client.get(Pod, name, namespace=namespace).to_dict()
        return pod

    components = PodComponents(read)
    for _ in range(3):
        recorded = components.of(found)
    assert sorted(reads) == ["own", "qwen"]
    assert sorted(bool(v) for v in recorded.values()) == [False, True]
    components.of([c for c in found if c.pod == "qwen"])
    components.of(found)
    assert sorted(reads) == ["own", "own", "qwen"]


def _pods(client: Client) -> list[dict[str, Any]]:
    return [p.to_dict() for p in client.list(Pod, namespace=NAMESPACE)]


def _claim_of(client: Client, pod: str) -> str:
    for claim in client.list(ResourceClaim, namespace=NAMESPACE):
        raw = claim.to_dict()
        if raw["metadata"]["ownerReferences"][0]["name"] == pod:
            return str(raw["metadata"]["name"])
    raise AssertionError(f"no claim of pod {pod}")
