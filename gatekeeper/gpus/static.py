"""``StaticInventory``: the inventory that serves a fixed snapshot, shipped in the
package as httpx ships ``MockTransport``, for tests, demos, rehearsals and planning on a
declared node."""

from __future__ import annotations

from pathlib import Path

from gatekeeper.gpus.inventory import InventorySnapshot, read_json_object

__all__ = ["StaticInventory"]


class StaticInventory:
    """A ``GpuInventory`` that always returns the same snapshot.

    For tests, demos and planning without GPUs::

        inventory = StaticInventory.from_json("tests/fixtures/gpus/h100_80g_x8.json")
        inventory.snapshot().gpus[0].free_bytes
    """

    __slots__ = ("_snapshot",)

    def __init__(self, snapshot: InventorySnapshot) -> None:
        self._snapshot = snapshot

    @classmethod
    def from_json(cls, path: str | Path) -> StaticInventory:
        """Load a snapshot recorded with ``gatekeeper gpus --json``."""
        return cls(InventorySnapshot.from_dict(read_json_object(Path(path)), where=str(path)))

    def snapshot(self) -> InventorySnapshot:
        return self._snapshot
