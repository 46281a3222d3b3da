"""``CachedInventory``: one reading shared by the readers of one moment (the collectors
of one scrape), so that NVML is read once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot

__all__ = ["CachedInventory"]


class CachedInventory:
    """A ``GpuInventory`` that reuses a snapshot younger than ``max_age_seconds``, so
    that the collectors of one scrape read NVML once. Exceptions pass through."""

    def __init__(
        self,
        inventory: GpuInventory,
        max_age_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inventory = inventory
        self._max_age_seconds = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, InventorySnapshot] | None = None

    def snapshot(self) -> InventorySnapshot:
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self._max_age_seconds:
                return self._cached[1]
            snap = self._inventory.snapshot()
            self._cached = (now, snap)
            return snap
