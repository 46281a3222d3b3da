"""Rehearsal: the sidecar with the gatekeeper simulator as its worker and a declared node
as its GPUs. The one module that knows the simulator's protocol.

- ``SIMULATOR`` is the worker command (``python -m gatekeeper.simulator serve``) and
  ``is_simulator`` recognises it in the settings.
- ``simulator_env`` tells a simulator worker to report the prediction as its memory
  (``GATEKEEPER_SIM_*``, the variables of ``gatekeeper.simulator.env``); the operator's own
  ``worker_env`` still overrides it, to rehearse a wrong prediction.
- A declared node has no driver to report memory, so once a worker is ready (and its
  reservation stops counting) the node would look empty again. ``RehearsalInventory``
  subtracts what the ready workers were promised, as NVML's used memory would; the
  sidecar feeds it the ledger's ready rows, so a worker is held from the moment its
  row stops being outstanding.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence

from gatekeeper.estimator.components import MEMORY_COMPONENTS
from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot
from gatekeeper.placement.types import Prediction
from gatekeeper.simulator.env import ACTUAL_BYTES_VAR, COMPONENT_VARS

__all__ = ["SIMULATOR", "RehearsalInventory", "is_simulator", "simulator_env"]

SIMULATOR = (sys.executable, "-m", "gatekeeper.simulator", "serve")
"""The worker command of a rehearsal."""

_REPORTED = {("kv" if c.name == "kv_cache" else c.name): c.field for c in MEMORY_COMPONENTS}
"""The simulator's component (``COMPONENT_VARS``; it says ``kv`` for the KV cache) -> the
prediction's field."""


def is_simulator(worker_command: Sequence[str]) -> bool:
    """Whether ``worker_command`` runs the gatekeeper simulator."""
    return tuple(worker_command[1:3]) == SIMULATOR[1:3]


def simulator_env(prediction: Prediction, promise_bytes: Sequence[int]) -> dict[str, str]:
    """The variables that make a simulator worker report ``prediction`` and hold the
    promise of its first GPU."""
    env = {}
    for component, var in COMPONENT_VARS.items():
        value = getattr(prediction, _REPORTED[component])
        if value:
            env[var] = str(int(value))
    if promise_bytes:
        env[ACTUAL_BYTES_VAR] = str(promise_bytes[0])
    return env


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
