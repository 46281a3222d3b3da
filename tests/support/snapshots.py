"""Small ``GpuInfo`` builders shared by the tests of code that reads snapshots."""

from __future__ import annotations

from gatekeeper.gpus.inventory import GpuInfo, GpuProcess
from gatekeeper.units import GIB


def busy_gpu(index: int, used: int, *processes: tuple[int, int | None]) -> GpuInfo:
    """A healthy 80 GiB GPU with ``used`` bytes in use and (pid, bytes) processes."""
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index}",
        name="H100",
        pci_bus_id="",
        total_bytes=80 * GIB,
        free_bytes=80 * GIB - used,
        used_bytes=used,
        processes=tuple(GpuProcess(pid, b) for pid, b in processes),
    )
