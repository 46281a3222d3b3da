"""Admission: a placement decision and its reservation, written in one transaction.

The GPU snapshot is read before the transaction (NVML calls do not belong inside it);
inside, the ledger hands the outstanding promises to the pure ``placement.decide``,
and an admitted decision's promises are written before the transaction commits. Two
admissions, from threads or from processes, can therefore never promise the same
bytes. Suggestions for a rejection are worked out after the transaction.
"""

from __future__ import annotations

import json

from gatekeeper.gpus import InventorySnapshot
from gatekeeper.ledger import Ledger, Promise, Reservation, promised_bytes
from gatekeeper.placement import Decision, PlacementPolicy, PlacementRequest, decide

__all__ = ["admit", "workers_per_gpu"]


def workers_per_gpu(reservations: tuple[Reservation, ...]) -> dict[str, int]:
    """Live gatekeeper workers per GPU UUID (one per deployment and GPU)."""
    seen = {(r.deployment_id, r.gpu_uuid) for r in reservations}
    counts: dict[str, int] = {}
    for _, gpu in seen:
        counts[gpu] = counts.get(gpu, 0) + 1
    return counts


def admit(
    ledger: Ledger,
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    *,
    deployment_id: str,
    policy: PlacementPolicy,
    ttl_seconds: float,
) -> Decision:
    """Decide and reserve atomically; a rejection comes back with its suggestions."""
    workers = workers_per_gpu(ledger.live())

    def decide_locked(outstanding: tuple[Reservation, ...]) -> tuple[Decision, tuple[Promise, ...]]:
        d = decide(
            request,
            snapshot,
            reserved=promised_bytes(outstanding),
            workers=workers,
            policy=policy,
            suggest=False,
        )
        return d, tuple(Promise(gpu, num_bytes) for gpu, num_bytes in d.promises())

    decision = ledger.admit(
        deployment_id,
        request.model.name,
        decide_locked,
        ttl_seconds=ttl_seconds,
        payload=lambda d: json.dumps(d.to_json()),
    )
    if decision.admitted:
        return decision
    return decide(
        request,
        snapshot,
        reserved=promised_bytes(ledger.outstanding()),
        workers=workers,
        policy=policy,
    )
