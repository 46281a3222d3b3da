"""Rehearsal: a declared node whose free memory follows gatekeeper's own workers.

A declared node has no driver to report memory, so once a worker is ready (and its
reservation stops counting) the node would look empty again. ``RehearsalInventory``
subtracts what the ready workers were promised, as NVML's used memory would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from gatekeeper.gpus import GpuInventory, InventorySnapshot

__all__ = ["RehearsalInventory"]


class RehearsalInventory:
    def __init__(self, declared: GpuInventory, held: Callable[[], Mapping[str, int]]) -> None:
        self.declared = declared
        self.held = held

    def snapshot(self) -> InventorySnapshot:
        base = self.declared.snapshot()
        held = self.held()
        gpus = tuple(
            dataclasses.replace(
                g,
                free_bytes=max(0, g.free_bytes - held.get(g.uuid, 0)),
                used_bytes=g.used_bytes + held.get(g.uuid, 0),
            )
            for g in base.gpus
        )
        return dataclasses.replace(base, gpus=gpus, source=f"{base.source} (rehearsal)")
