"""Placement across nodes through Kubernetes (issue 29; ``../shared/reference/cluster.md``).

Kubernetes' own scheduler places the pods and keeps the books, with GPU memory as DRA
consumable capacity. ``slices`` turns a node's GPUs (an ``InventorySnapshot``) into the
ResourceSlice the node agent publishes, as plain dicts.

May import: ``gatekeeper.placement`` (its types), ``gatekeeper.estimate``,
``gatekeeper.gpus`` (the inventory types), ``errors``, ``units``. The pure modules
import no Kubernetes client; that stays in the agent to come.
"""

from gatekeeper.cluster.slices import (
    DRIVER_NAME,
    REQUEST_STEP_BYTES,
    SliceError,
    device_capacity_bytes,
    gpu_device,
    resource_slice,
)

__all__ = [
    "DRIVER_NAME",
    "REQUEST_STEP_BYTES",
    "SliceError",
    "device_capacity_bytes",
    "gpu_device",
    "resource_slice",
]
