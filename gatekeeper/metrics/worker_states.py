"""A worker's lifecycle states, and which of them hold what: written once for the
sidecar, which moves its deployments through them, and for the metrics, which label and
count workers by them (``gatekeeper.metrics`` may not import the sidecar).

``admitted -> launching -> loading -> ready``; a ready worker that stops answering
``/health`` is ``unhealthy`` (no traffic; stopped and restarted, or ``failed``);
``stopping -> stopped`` when undeployed; with ``idle_action = "sleep"`` an idle ready
worker goes ``ready -> sleeping`` (vLLM's sleep mode) and ``sleeping -> waking -> ready``
when a request names it (``gatekeeper.sidecar.sleep``). See ``gatekeeper.sidecar.manager``.

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
    "admitted",
    "launching",
    "loading",
    "ready",
    "sleeping",
    "waking",
    "unhealthy",
    "failed",
    "stopping",
    "stopped",
]
"""``unhealthy``: a ready worker that stopped answering ``/health`` (liveness); no
traffic goes to it, it is stopped, and the deployment stays ``unhealthy`` until its
restart (``launching``), or becomes ``failed`` when it will not be restarted.
``sleeping``: put to sleep by vLLM's sleep mode (its ledger rows ready, holding what vLLM
keeps asleep); ``waking``: its wake admitted (its rows pending at its awake size) and
``/wake_up`` called; neither gets traffic: requests wait for ``ready``."""

WORKER_STATES: tuple[State, ...] = get_args(State)
"""Every state, in lifecycle order."""

PENDING_STATES: frozenset[State] = frozenset({"admitted", "launching", "loading", "waking"})
"""States in which a worker's promise is outstanding: its ledger rows are pending (not
yet ready), and the bytes it has yet to take are counted as promised."""

SERVING_STATES: frozenset[State] = frozenset({"ready", "unhealthy", "sleeping"})
"""States whose worker's memory is in NVML's figure (its ledger rows are ready)."""

RESERVING_STATES: frozenset[State] = PENDING_STATES | SERVING_STATES
"""States whose deployment holds a reservation, pending or ready."""

FINISHED_STATES: frozenset[State] = frozenset({"stopped", "failed"})
"""States of a deployment that is over: its worker has exited (its port is free), ``ps``
lists it with ``--all`` only and ``forget`` drops it; every other state is live."""
