"""What the ledger means for placement, read once: ``Ledger.view()``.

One ``SELECT`` of the live rows (ready ones and unexpired pending ones) gives every
figure the sidecar reads from the ledger, per GPU UUID:

- ``promised``: bytes promised to workers still starting (the pending rows), the
  ``reserved`` map placement subtracts from NVML's free figure;
- ``held``: bytes of the workers that are ready (their memory is in NVML's figure;
  a declared node counts it as used);
- ``workers``: live gatekeeper workers (one per deployment and GPU), which placement
  counts against ``max_workers_per_gpu``.

Imports nothing of gatekeeper: a row is anything with ``deployment_id``, ``gpu_uuid``,
``bytes`` and ``state`` (``gatekeeper.sidecar.ledger.Reservation``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LedgerRow", "LedgerView", "promised_bytes", "workers_per_gpu"]


class LedgerRow(Protocol):
    """What the view reads of a reservation."""

    @property
    def deployment_id(self) -> str: ...
    @property
    def gpu_uuid(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def state(self) -> str: ...


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The ledger's live rows summed per GPU UUID, read at one moment."""

    promised: Mapping[str, int]
    """Bytes promised to workers still starting (pending, unexpired rows)."""
    held: Mapping[str, int]
    """Bytes of ready workers (ready rows)."""
    workers: Mapping[str, int]
    """Live gatekeeper workers (one per deployment and GPU)."""
    outstanding: int
    """Pending, unexpired rows (``gatekeeper_reservations_outstanding``)."""

    @classmethod
    def of(cls, live: Iterable[LedgerRow]) -> LedgerView:
        """The view of ``live`` rows (``Ledger.live()``: ready and unexpired pending)."""
        rows = tuple(live)
        pending = [r for r in rows if r.state == "pending"]
        return cls(
            promised=promised_bytes(pending),
            held=promised_bytes(r for r in rows if r.state == "ready"),
            workers=workers_per_gpu(rows),
            outstanding=len(pending),
        )


def promised_bytes(rows: Iterable[LedgerRow]) -> dict[str, int]:
    """Bytes of ``rows`` per GPU UUID (of the outstanding ones: the ``reserved`` map
    placement subtracts)."""
    totals: dict[str, int] = {}
    for r in rows:
        totals[r.gpu_uuid] = totals.get(r.gpu_uuid, 0) + r.bytes
    return totals


def workers_per_gpu(rows: Iterable[LedgerRow]) -> dict[str, int]:
    """Gatekeeper workers per GPU UUID in ``rows`` (one per deployment and GPU)."""
    seen = {(r.deployment_id, r.gpu_uuid) for r in rows}
    counts: dict[str, int] = {}
    for _, gpu in seen:
        counts[gpu] = counts.get(gpu, 0) + 1
    return counts
