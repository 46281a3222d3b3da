"""Host memory in admission: a deployment the node's host memory cannot hold is refused,
as one whose GPU bytes do not fit is.

What is counted (``HostBudget``), from one host reading (``gatekeeper.gpus.host_memory``)
and the ledger's live rows: the node's available host memory, less the margin
(``host_margin_bytes``), less the host bytes promised to workers still starting (pending
rows: their memory is not yet taken), less, for each ready worker, the part of its
promise it has not taken yet (promised less what its process tree holds now: offload
buffers and sleeping weights can grow after ``/health``). The admitted deployment's own
promise is its estimate's ``host_bytes`` (``gatekeeper.estimator.host``), spread over
its rows (``ledger.host_promises``).

A reading that failed refuses the deployment with the reason (``unreadable``): the
sidecar never guesses the node's memory. ``refuse`` turns an admitting decision into a
refusal with the numbers and what would fit: less CPU offload, less KV offloading, or
(for a worker asleep at level 1) sleep level 2, which keeps no weights on the host.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gatekeeper.estimator.host import HostEstimate
from gatekeeper.gpus.host_memory import HostMemory
from gatekeeper.gpus.host_usage import tree_host_bytes
from gatekeeper.gpus.proctree import process_tree
from gatekeeper.metrics.host import HostWorkerView
from gatekeeper.metrics.worker_states import FINISHED_STATES
from gatekeeper.placement.types import Decision, PlacementRequest, Suggestion
from gatekeeper.sidecar.deployment import Deployment
from gatekeeper.sidecar.ledger import Ledger, Reservation
from gatekeeper.units import GIB, format_gib
from gatekeeper.vllm.sleep_mode import IdlePolicy

__all__ = [
    "HostBudget",
    "host_promised_by_deployment",
    "host_reserved_bytes",
    "host_sleep_level",
    "host_views",
    "pending_host_bytes",
    "refuse",
    "unreadable",
    "unrealised_host_bytes",
    "worker_host_bytes",
]


@dataclass(frozen=True, slots=True)
class HostBudget:
    """The node's host memory as one admission counts it."""

    reading: HostMemory
    margin_bytes: int
    unrealised_bytes: int
    """Promised to ready workers and not yet taken by them (``unrealised_host_bytes``)."""
    pending_bytes: int = 0
    """Promised to workers still starting (set inside the ledger's transaction)."""
    sleep_level: Literal[0, 1, 2] = 0
    """The level the admitted worker is put to sleep at when idle (0: never): at level 1
    its promise holds its weights too (``HostEstimate.at_sleep_level``)."""

    @property
    def usable_bytes(self) -> int:
        return max(
            0,
            self.reading.available_bytes
            - self.margin_bytes
            - self.unrealised_bytes
            - self.pending_bytes,
        )

    def text(self) -> str:
        r = self.reading
        return (
            f"host memory: {format_gib(self.usable_bytes)} usable (available "
            f"{format_gib(r.available_bytes)}, from {r.bound_by}; - promised to starting "
            f"workers {format_gib(self.pending_bytes)} - not yet taken by running workers "
            f"{format_gib(self.unrealised_bytes)} - margin {format_gib(self.margin_bytes)})"
        )


def pending_host_bytes(rows: Iterable[Reservation]) -> int:
    """Host bytes of the rows a transaction counts as promised (pending, and ready since
    the caller's snapshot)."""
    return sum(r.host_bytes for r in rows)


def host_promised_by_deployment(rows: Iterable[Reservation]) -> dict[str, int]:
    """Each deployment's host promise: the host bytes of its rows among ``rows``, summed."""
    promised: dict[str, int] = {}
    for r in rows:
        promised[r.deployment_id] = promised.get(r.deployment_id, 0) + r.host_bytes
    return promised


def unrealised_host_bytes(live: Sequence[Reservation], actual: Callable[[int], int]) -> int:
    """For each ready deployment of ``live``, its host promise less what its worker's
    process tree holds now (``actual(pid)``; a row without a pid: nothing taken)."""
    ready = [r for r in live if r.state == "ready"]
    promised = host_promised_by_deployment(ready)
    pids: dict[str, int | None] = {}
    for r in ready:
        pids[r.deployment_id] = pids.get(r.deployment_id) or r.pid
    total = 0
    for deployment_id, host in promised.items():
        pid = pids[deployment_id]
        taken = actual(pid) if pid is not None and host else 0
        total += max(0, host - taken)
    return total


def host_sleep_level(idle: IdlePolicy) -> Literal[0, 1, 2]:
    """The sleep level a deployment's host promise is sized for: 1 when it is put to
    sleep at level 1 when idle (its weights then sit in host memory), else 0 (it never
    sleeps, or sleeps at level 2 and keeps nothing there)."""
    return 1 if idle.action == "sleep" and idle.sleep_level == 1 else 0


def worker_host_bytes(pid: int) -> int:
    """What a worker's process tree holds in host memory now (PSS, ``/proc``)."""
    return tree_host_bytes(process_tree(pid))


def host_reserved_bytes(ledger: Ledger, margin_bytes: int) -> int:
    """What admission counts against the available host memory now: the margin, the
    starting workers' host promises and what the running ones have yet to take
    (``gatekeeper_host_headroom_bytes`` is the available memory less this)."""
    live = ledger.live()
    pending = pending_host_bytes(r for r in live if r.state == "pending")
    return margin_bytes + pending + unrealised_host_bytes(live, worker_host_bytes)


def host_views(deployments: Iterable[Deployment]) -> list[HostWorkerView]:
    """The live deployments as the host collector sees them: predicted host bytes by
    part from the admission's decision (its record's, for an adopted worker)."""
    out = []
    for d in deployments:
        if d.state in FINISHED_STATES:
            continue
        placement = d.decision_record().get("placement") or {}
        host = placement.get("host") if isinstance(placement, dict) else None
        pid = d.worker.pid if d.worker is not None else None
        out.append(
            HostWorkerView.from_json(d.id, d.name, pid, host if isinstance(host, dict) else {})
        )
    return out


def unreadable(request: PlacementRequest, reading: HostMemory) -> Decision:
    """The refusal when the node's host memory could not be read."""
    return Decision(
        model=request.model.name,
        admitted=False,
        placement=None,
        reasons=(
            f"{request.model.name}: the node's host memory could not be read ({reading.error}),"
            " so admission refuses rather than guess; fix the reading (host_memory_root, "
            "GATEKEEPER_HOST_MEMORY_ROOT) and retry",
        ),
        gpus=(),
        suggestions=(Suggestion("none", "the host memory reading failed"),),
    )


def refuse(decision: Decision, host: HostEstimate, budget: HostBudget) -> Decision | None:
    """``decision`` refused for host memory when its worker's ``host`` bytes exceed what
    ``budget`` leaves usable; ``None`` when they fit."""
    need, usable = host.host_bytes, budget.usable_bytes
    if need <= usable:
        return None
    short = need - usable
    parts = ", ".join(
        f"{k.removesuffix('_bytes')} {format_gib(v)}" for k, v in host.parts().items() if v
    )
    reason = (
        f"{decision.model} needs {format_gib(need)} of host memory ({parts}); the node has "
        f"{format_gib(usable)} usable, short by {format_gib(short)}. {budget.text()}"
    )
    lines = tuple(
        dataclasses.replace(g, status="fits") if g.status == "chosen" else g for g in decision.gpus
    )
    return dataclasses.replace(
        decision,
        admitted=False,
        placement=None,
        reasons=(reason,),
        gpus=lines,
        suggestions=_suggestions(decision, host, short),
    )


def _suggestions(decision: Decision, host: HostEstimate, short: int) -> tuple[Suggestion, ...]:
    out: list[Suggestion] = []
    p = decision.placement
    gpus = len(p.gpu_uuids) if p is not None else 1
    if host.kv_offload_bytes > short:
        gib = math.floor((host.kv_offload_bytes - short) / GIB * 100) / 100
        if gib > 0:
            out.append(
                Suggestion(
                    "host",
                    f"--kv-offloading-size {gib:g} (now {host.kv_offload_bytes / GIB:g} GiB)",
                    {"kv_offloading_size": gib},
                )
            )
    if host.cpu_offload_bytes > short:
        per_gpu = math.floor((host.cpu_offload_bytes - short) / gpus / GIB * 100) / 100
        out.append(
            Suggestion(
                "host",
                f"--cpu-offload-gb {per_gpu:g} per GPU (now about "
                f"{host.cpu_offload_bytes / gpus / GIB:.2f}), if the GPUs hold the weights "
                "kept on them",
                {"cpu_offload_gb": per_gpu},
            )
        )
    if host.sleeping_weights_bytes > short:
        out.append(
            Suggestion(
                "host",
                f"sleep level 2 instead of 1 (drops the {format_gib(host.sleeping_weights_bytes)} "
                "of weights level 1 keeps on the host; a wake then reloads them)",
                {"sleep_level": 2},
            )
        )
    if not out:
        out.append(
            Suggestion(
                "none",
                f"no lighter host configuration frees {format_gib(short)}: stop another "
                "worker, or free host memory on the node",
            )
        )
    return tuple(out)
