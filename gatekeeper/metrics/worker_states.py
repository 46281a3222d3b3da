"""A worker's lifecycle states, and which of them hold what: written once for the
sidecar, which moves its deployments through them, and for the metrics, which label and
count workers by them (``gatekeeper.metrics`` may not import the sidecar).

``admitted -> launching -> loading -> ready``; a ready worker that stops answering
``/health`` is ``unhealthy`` (no traffic; stopped and restarted, or ``failed``);
``stopping -> stopped`` when undeployed. See ``gatekeeper.sidecar.manager``.

Imports nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "FINISHED_STATES",
    "PENDING_STATES",
    "RESERVING_STATES",
    "SERVING_STATES",
    "WORKER_STATES",
    "State",
]

State = Literal[
    "admitted", "launching", "loading", "ready", "unhealthy", "failed", "stopping", "stopped"
]
"""``unhealthy``: a ready worker that stopped answering ``/health`` (liveness); no
traffic goes to it, it is stopped, and the deployment stays ``unhealthy`` until its
restart (``launching``), or becomes ``failed`` when it will not be restarted."""

WORKER_STATES: tuple[State, ...] = get_args(State)
"""Every state, in lifecycle order."""

PENDING_STATES: frozenset[State] = frozenset({"admitted", "launching", "loading"})
"""States in which a worker's promise is outstanding: its ledger rows are pending (not
yet ready), and the bytes it has yet to take are counted as promised."""

SERVING_STATES: frozenset[State] = frozenset({"ready", "unhealthy"})
"""States whose worker's memory is in NVML's figure (its ledger rows are ready)."""

RESERVING_STATES: frozenset[State] = PENDING_STATES | SERVING_STATES
"""States whose deployment holds a reservation, pending or ready."""

FINISHED_STATES: frozenset[State] = frozenset({"stopped", "failed"})
"""States of a deployment that is over: its worker has exited (its port is free), ``ps``
lists it with ``--all`` only and ``forget`` drops it; every other state is live."""
