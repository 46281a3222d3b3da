"""Admission: a placement decision and its reservation, written in one transaction.

The GPU snapshot is read, and the estimates computed, before the transaction (neither
NVML calls nor the estimator belong inside it);
inside, the ledger hands the outstanding promises to the pure ``placement.decide``,
together with the rows that turned ready since ``since`` (taken before the snapshot:
a worker turning ready in between is counted by the snapshot, the ledger, or both),
and an admitted decision's promises are written before the transaction commits. Two
admissions, from threads or from processes, can therefore never promise the same
bytes. Suggestions for a rejection are worked out after the transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.placement.decision import decide
from gatekeeper.placement.gpu_search import EstimateCache, search
from gatekeeper.placement.types import Decision, PlacementPolicy, PlacementRequest
from gatekeeper.sidecar.ledger import Ledger, Promise, Reservation
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
) -> Decision:
    """Decide and reserve atomically; a rejection comes back with its suggestions.
    ``cache`` keeps estimates across admissions. ``since`` is ``ledger.now()`` read
    before ``snapshot`` was: rows that became ready from then on count as promised
    (``Ledger.admit``).

    The estimates are computed before the ledger's write lock is taken (a search against
    the promises as they stand), so that the decision inside the transaction only adds
    up bytes: no estimate runs while other admissions wait for the lock."""
    view = ledger.view()
    workers = view.workers
    cache = cache if cache is not None else EstimateCache()
    search(request, snapshot, reserved=view.promised, workers=workers, policy=policy, cache=cache)
    counted: dict[str, int] = {}
    decision = ledger.admit(
        deployment_id,
        request.model.name,
        _decide_locked(request, snapshot, workers, policy, cache, counted),
        ttl_seconds=ttl_seconds,
        payload=lambda d: json.dumps(d.to_json()),
        since=since,
    )
    if decision.admitted:
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
        return d, tuple(Promise(gpu, num_bytes) for gpu, num_bytes in d.promises())

    return decide_locked
