"""Admission: a placement decision and its reservation, written in one transaction.

The GPU snapshot is read, and the estimates computed, before the transaction (neither
NVML calls nor the estimator belong inside it);
inside, the ledger hands the outstanding promises to the pure ``placement.decide``,
together with the rows that turned ready since ``since`` (taken before the snapshot:
a worker turning ready in between is counted by the snapshot, the ledger, or both),
and an admitted decision's promises are written before the transaction commits. Two
admissions, from threads or from processes, can therefore never promise the same
bytes. Suggestions for a rejection are worked out after the transaction.

With a ``HostBudget`` (``gatekeeper.sidecar.host_admission``), host memory is checked in
the same transaction: a failed host reading refuses before anything is decided, and an
admitting decision whose worker's host bytes exceed what is usable (the pending rows'
host promises counted inside) becomes a refusal with the numbers and what would fit;
the admitted rows carry the deployment's host bytes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.placement.decision import decide
from gatekeeper.placement.gpu_search import EstimateCache, search
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.sidecar.host_admission import (
    HostBudget,
    pending_host_bytes,
    refuse,
    unreadable,
)
from gatekeeper.sidecar.ledger import Ledger, Promise, Reservation, host_promises
from gatekeeper.sidecar.ledger_view import promised_bytes

__all__ = ["admit"]


def admit(
    ledger: Ledger,
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    *,
    deployment_id: str,
    policy: PlacementPolicy,
    ttl_seconds: float,
    cache: EstimateCache | None = None,
    since: float | None = None,
    host: HostBudget | None = None,
) -> Decision:
    """Decide and reserve atomically; a rejection comes back with its suggestions.
    ``host``: the node's host memory as read before the transaction (None: not checked).
    ``cache`` keeps estimates across admissions. ``since`` is ``ledger.now()`` read
    before ``snapshot`` was: rows that became ready from then on count as promised
    (``Ledger.admit``).

    The estimates are computed before the ledger's write lock is taken (a search against
    the promises as they stand), so that the decision inside the transaction only adds
    up bytes: no estimate runs while other admissions wait for the lock."""
    if host is not None and not host.reading.ok:
        return unreadable(request, host.reading)
    view = ledger.view()
    workers = view.workers
    cache = cache if cache is not None else EstimateCache()
    search(request, snapshot, reserved=view.promised, workers=workers, policy=policy, cache=cache)
    counted: dict[str, int] = {}
    refused: list[Decision] = []
    decide_locked = _decide_locked(request, snapshot, workers, policy, cache, counted)
    decision = ledger.admit(
        deployment_id,
        request.model.name,
        _host_checked(decide_locked, host, refused),
        ttl_seconds=ttl_seconds,
        payload=lambda d: json.dumps(d.to_json()),
        since=since,
    )
    if decision.admitted or refused:
        return decision
    # The suggestions are worked out against what the transaction counted: re-reading
    # the ledger could find less (rows released or turned ready since) and turn the
    # refusal into an admission that reserved nothing.
    return decide(request, snapshot, reserved=counted, workers=workers, policy=policy, cache=cache)


def _decide_locked(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    workers: Mapping[str, int],
    policy: PlacementPolicy,
    cache: EstimateCache,
    counted: dict[str, int],
) -> Callable[[tuple[Reservation, ...]], tuple[Decision, tuple[Promise, ...]]]:
    """The decision ``Ledger.admit`` runs inside its transaction, without suggestions;
    it leaves in ``counted`` the promised bytes per GPU it decided against."""

    def decide_locked(outstanding: tuple[Reservation, ...]) -> tuple[Decision, tuple[Promise, ...]]:
        counted.clear()
        counted.update(promised_bytes(outstanding))
        d = decide(
            request,
            snapshot,
            reserved=counted,
            workers=workers,
            policy=policy,
            suggest=False,
            cache=cache,
        )
        host_bytes = d.placement.estimate.host.host_bytes if d.placement is not None else 0
        return d, host_promises(d.promises(), host_bytes)

    return decide_locked


def _host_checked(
    decide_locked: Callable[[tuple[Reservation, ...]], tuple[Decision, tuple[Promise, ...]]],
    host: HostBudget | None,
    refused: list[Decision],
) -> Callable[[tuple[Reservation, ...]], tuple[Decision, tuple[Promise, ...]]]:
    """``decide_locked`` with the host check after it: an admitting decision the host
    cannot hold is refused (and left in ``refused``), nothing reserved."""

    def checked(outstanding: tuple[Reservation, ...]) -> tuple[Decision, tuple[Promise, ...]]:
        d, promises = decide_locked(outstanding)
        if host is None or d.placement is None:
            return d, promises
        budget = dataclasses.replace(host, pending_bytes=pending_host_bytes(outstanding))
        need = d.placement.estimate.host.at_sleep_level(host.sleep_level)
        refusal = refuse(d, need, budget)
        if refusal is None:  # the decision records the host bytes promised
            estimate = dataclasses.replace(d.placement.estimate, host=need)
            placed = dataclasses.replace(
                d, placement=dataclasses.replace(d.placement, estimate=estimate)
            )
            return placed, host_promises(d.promises(), need.host_bytes)
        refused.append(refusal)
        return refusal, ()

    return checked
