"""Where the GPUs come from: the one reading of the ``gpus`` setting (and of the CLI's
``--node``).

``nvml`` means the NVIDIA driver, read through ``NvmlInventory``; anything else is a
declared node (``2xH100-80GB``, ``1xA100-40GB,1xL4``, or the path of a JSON file of
GPUs), parsed once by ``gatekeeper.gpus.declared`` and served by ``StaticInventory``.
A bad declaration raises ``GatekeeperError`` naming the value; NVML is opened only when
asked for, so planning on a declared node never touches the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.static import StaticInventory

__all__ = ["GpuSource", "parse_gpu_source"]


@dataclass(frozen=True, slots=True)
class GpuSource:
    """The GPUs named by a setting: the driver, or a declared node's snapshot."""

    declared: InventorySnapshot | None
    """The declared node; ``None`` for the driver (NVML)."""

    @property
    def is_declared(self) -> bool:
        return self.declared is not None

    def inventory(self, *, visible_devices: str | None) -> GpuInventory:
        """An inventory to read snapshots from; the caller closes an NVML one."""
        if self.declared is not None:
            return StaticInventory(self.declared)
        return NvmlInventory(visible_devices=visible_devices)

    def snapshot(self, *, visible_devices: str | None) -> InventorySnapshot:
        """One snapshot; a driver that cannot be read gives a failed snapshot."""
        if self.declared is not None:
            return self.declared
        with NvmlInventory(visible_devices=visible_devices) as inventory:
            return inventory.snapshot()


def parse_gpu_source(text: str) -> GpuSource:
    """``nvml`` or a declared node; raises ``GatekeeperError`` for a bad declaration."""
    if text.strip().lower() == "nvml":
        return GpuSource(None)
    return GpuSource(parse_declared_node(text))
