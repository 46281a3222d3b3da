"""A node's GPUs as one DRA ResourceSlice (``resource.k8s.io/v1``), as plain dicts.

Pure: an ``InventorySnapshot`` and the placement policy in, the object the node agent
publishes out (design: ``../shared/reference/cluster.md``). One slice per node, its pool
named after the node; one device per placeable GPU, named after its uuid
(``device_name``: ``gpu-`` and the uuid's letters and digits, lower case, so a GPU keeps
its name across restarts, reorders and the loss of another GPU), with:

- attributes ``uuid``, ``productName``, ``index``, ``memoryTotal`` (the bytes vLLM sees as
  the GPU's total, which the validating webhook judges a worker against), ``node`` (the node's name: the same on
  every device of the pool, so a claim's ``matchAttribute: gpu.gatekeeper.dev/node`` keeps
  a TP group on one node), ``cudaComputeCapability`` when the GPU table knows the product
  (``9.0.0`` for an H100) and ``driverVersion`` when the snapshot knows it (both as
  semantic versions, so CEL selectors can compare them);
- a ``memory`` capacity: what a gatekeeper worker may use there, the figure placement
  sizes by on an empty GPU::

      capacity = round_down(visible_total - policy.margin_for(visible_total), 1 MiB)

  e.g. an H100 80GB (79.19 GiB visible) under the default policy (512 MiB + 2 %):
  79.19 - 0.5 - 1.58 = 77.10 GiB. A rank's claim request is placement's per-rank need,
  CUDA context included (``gatekeeper.placement.gpu_search``), so the context is not
  subtracted here a second time;
- ``allowMultipleAllocations: true`` and a ``requestPolicy`` in 1 MiB steps from 1 MiB
  to the capacity; a request that names no memory takes the whole capacity (the
  default), so an unsized claim never shares the GPU by accident.

The API's rules this keeps (kubernetes ``pkg/apis/resource/validation/validation.go``,
``validateRequestPolicyRange``): ``min``, ``max`` and ``default`` within the capacity and
``(value - min)`` a multiple of ``step`` for each; device names DNS labels.
"""

from __future__ import annotations

import re
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot
from gatekeeper.gpus.products import best_capability
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.units import MIB

__all__ = [
    "DRIVER_NAME",
    "REQUEST_STEP_BYTES",
    "SliceError",
    "device_capacity_bytes",
    "device_name",
    "gpu_device",
    "resource_slice",
    "slice_name",
    "uuid_device_name",
]

DRIVER_NAME = "gpu.gatekeeper.dev"
"""The DRA driver name gatekeeper publishes under (a DNS subdomain)."""
REQUEST_STEP_BYTES = MIB
"""Claims' memory requests are rounded up to this step by the scheduler."""
_MAX_NAME = 253
_MAX_LABEL = 63
_UUID_PREFIX = re.compile(r"^(GPU|MIG)-", re.IGNORECASE)
_NOT_LABEL = re.compile(r"[^a-z0-9]")
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


class SliceError(GatekeeperError):
    """A node's GPUs cannot be published as a ResourceSlice."""


def device_name(gpu: GpuInfo) -> str:
    """The device's name in the slice: ``uuid_device_name(gpu.uuid)``, the one mapping of a
    GPU to its device that the agent, the kubelet plugin and the accounting all use."""
    return uuid_device_name(gpu.uuid)


def uuid_device_name(uuid: str) -> str:
    """``gpu-`` and the uuid's letters and digits after its ``GPU-``/``MIG-`` prefix, lower
    case: ``GPU-00000000-aaaa-bbbb-cccc-000000000000`` is
    ``gpu-00000000aaaabbbbcccc000000000000`` (36 characters, a DNS label as the v1 API
    requires of device names: at most 63, ``[a-z0-9]`` and ``-``).

    NVML's index is a position (when GPU 0 vanishes the old GPU 1 is index 0), a uuid is
    not: a GPU keeps its name across restarts, reorders and the loss of another GPU.
    Raises ``SliceError`` for a uuid with no letter or digit, or one too long for a label.
    """
    body = _UUID_PREFIX.sub("", uuid.strip())
    name = "gpu-" + _NOT_LABEL.sub("", body.lower())
    if name == "gpu-" or len(name) > _MAX_LABEL:
        raise SliceError(
            f"GPU uuid {uuid!r} gives the device name {name!r}, not a DNS label of 5 to "
            f"{_MAX_LABEL} characters; give the GPU a uuid of letters and digits (a declared "
            "GPU's 'uuid' field)",
            field="uuid",
            value=uuid,
        )
    return name


def slice_name(node_name: str, driver: str = DRIVER_NAME) -> str:
    """The name of ``node_name``'s one ResourceSlice under ``driver``."""
    return f"{node_name}-{driver}"


def device_capacity_bytes(gpu: GpuInfo, policy: PlacementPolicy) -> int:
    """The ``memory`` capacity published for ``gpu``: visible total less the policy's
    margin, rounded down to the request step; 0 when nothing is left."""
    total = gpu.visible_total_bytes
    usable = max(0, total - policy.margin_for(total))
    return usable - usable % REQUEST_STEP_BYTES


def _semver(driver_version: str) -> str | None:
    """NVIDIA's ``535.104.05`` as ``535.104.5`` (semver has no leading zeros); None
    when the text is not two or three numbers."""
    match = _VERSION.match(driver_version.strip())
    if match is None:
        return None
    return ".".join(str(int(part or 0)) for part in match.groups())


def gpu_device(
    gpu: GpuInfo, capacity_bytes: int, driver_version: str | None, node_name: str
) -> dict[str, Any]:
    """One GPU of ``node_name`` as a ResourceSlice device with ``capacity_bytes`` of
    shareable memory."""
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.name},
        "index": {"int": gpu.index},
        "memoryTotal": {"int": gpu.visible_total_bytes},
        "node": {"string": node_name},
    }
    capability = best_capability([gpu.name])
    if capability is not None:
        attributes["cudaComputeCapability"] = {"version": f"{capability[0]}.{capability[1]}.0"}
    version = _semver(driver_version) if driver_version else None
    if version is not None:
        attributes["driverVersion"] = {"version": version}
    policy = {
        "default": str(capacity_bytes),
        "validRange": {
            "min": str(REQUEST_STEP_BYTES),
            "max": str(capacity_bytes),
            "step": str(REQUEST_STEP_BYTES),
        },
    }
    return {
        "name": device_name(gpu),
        "attributes": attributes,
        "capacity": {"memory": {"value": str(capacity_bytes), "requestPolicy": policy}},
        "allowMultipleAllocations": True,
    }


def _published(gpu: GpuInfo, policy: PlacementPolicy) -> bool:
    """Placeable, allowed by the policy, and with room for more than one step."""
    allowed = policy.allowed_gpus
    if allowed is not None and str(gpu.index) not in allowed and gpu.uuid not in allowed:
        return False
    return gpu.placeable and device_capacity_bytes(gpu, policy) > REQUEST_STEP_BYTES


def resource_slice(
    node_name: str,
    snapshot: InventorySnapshot,
    policy: PlacementPolicy,
    *,
    generation: int = 1,
    driver: str = DRIVER_NAME,
) -> dict[str, Any]:
    """The ResourceSlice of ``node_name``'s GPUs: pool ``node_name`` at ``generation``.

    GPUs that are unhealthy, fenced, outside ``policy.allowed_gpus`` or too small to hold
    one step after the margin are left out. A failed snapshot is refused: publishing an
    empty pool would tell the scheduler the node has no GPUs.
    """
    if not snapshot.ok:
        raise SliceError(
            f"node {node_name}: the GPU reading failed ({snapshot.error}); "
            "keep the published slice and read the GPUs again",
            field="snapshot.ok",
            value=snapshot.ok,
        )
    name = slice_name(node_name, driver)
    if len(name) > _MAX_NAME:
        raise SliceError(
            f"node {node_name}: the slice name {name!r} has {len(name)} characters, over "
            f"Kubernetes' {_MAX_NAME}; use a shorter driver name than {driver!r}",
            field="driver",
            value=driver,
        )
    devices = [
        gpu_device(gpu, device_capacity_bytes(gpu, policy), snapshot.driver_version, node_name)
        for gpu in snapshot.gpus
        if _published(gpu, policy)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
