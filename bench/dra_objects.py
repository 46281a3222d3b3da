"""The apiserver objects the DRA benches write as kube-scheduler and kubelet would, for
``bench.dra_prepare`` and ``bench.llm_d_route``: no scheduler places them.

- ``allocated_claim``: a ResourceClaim of gatekeeper's DeviceClass whose allocation (the
  result's pool, device and ``consumedCapacity.memory``) is written into its status, as
  kube-scheduler writes it, and reserved for a pod when one is given;
- ``bound_pod``: a Pod bound to a node (``spec.nodeName``) that uses a claim; no kubelet
  runs it (its process is the bench's: ``bench.pod_cgroups``);
- ``device_names``: the devices the node agent published, by NVML index, as the scheduler
  reads them from its ResourceSlice.
"""

from __future__ import annotations

import time
from typing import Any

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from gatekeeper.cluster import DRIVER_NAME, slice_name
from gatekeeper.cluster.prepared import ClaimRef

__all__ = ["allocated_claim", "bound_pod", "device_names"]


def device_names(client: Client, node: str, timeout_seconds: float = 60.0) -> dict[int, str]:
    """The devices of ``node``'s ResourceSlice (the agent's) by NVML index, once published."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        for item in (s.to_dict() for s in client.list(ResourceSlice)):
            if item["metadata"]["name"] == slice_name(node):
                devices = item["spec"]["devices"]
                return {d["attributes"]["index"]["int"]: d["name"] for d in devices}
        time.sleep(0.2)
    raise RuntimeError(f"the agent published no slice {slice_name(node)} in {timeout_seconds} s")


def allocated_claim(
    client: Client,
    name: str,
    memory_bytes: int,
    device: str,
    pod: tuple[str, str] | None = None,
    *,
    namespace: str,
    node: str,
) -> ClaimRef:
    """A claim of ``memory_bytes`` with its allocation on ``node``'s ``device`` written
    into its status, and reserved for ``pod`` (name, UID: a pod that exists, or the
    resource-claim controller takes the reservation back) when one is given, as
    kube-scheduler writes both."""
    request = {
        "deviceClassName": DRIVER_NAME,
        "capacity": {"requests": {"memory": str(memory_bytes)}},
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "rank0", "exactly": request}]}},
    }
    made: Any = client.create(from_dict(claim))
    uid = str(made.metadata.uid)
    result = {
        "request": "rank0",
        "driver": DRIVER_NAME,
        "pool": node,
        "device": device,
        "consumedCapacity": {"memory": str(memory_bytes)},
        "shareID": uid,
    }
    status: dict[str, Any] = {"status": {"allocation": {"devices": {"results": [result]}}}}
    if pod is not None:
        status["status"]["reservedFor"] = [{"resource": "pods", "name": pod[0], "uid": pod[1]}]
    client.patch(
        ResourceClaim.Status, name, status, namespace=namespace, patch_type=PatchType.MERGE
    )
    return ClaimRef(namespace, name, uid)


def bound_pod(
    client: Client,
    name: str,
    claim: str,
    *,
    namespace: str,
    node: str,
    labels: dict[str, str] | None = None,
) -> tuple[str, str]:
    """A Pod bound to ``node`` that uses ``claim``: (name, UID). No kubelet runs it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "vllm", "image": "vllm", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }
    made: Any = client.create(from_dict(pod))
    return name, str(made.metadata.uid)
