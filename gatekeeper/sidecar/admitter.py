"""A deployment's admission on the sidecar's event loop, bounded in time.

``Admitter.admit`` runs ``admission.admit`` (placement and reservation in one ledger
transaction) in a thread, after the ledger is in order (``LedgerKeeper.in_order``) and
with the GPU snapshot read first; it gives up after ``admission_timeout_seconds`` with a
503. The thread cannot be interrupted: an admission that finishes after its time limit
and admitted after all has its reservation released (a late release, kept in
``pending`` until done). ``calibrated`` applies the calibrator's factors for the model's
family to a request before it is admitted.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from gatekeeper.gpus.host_memory import ProcHostMemory
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.metrics.events import SidecarMetrics
from gatekeeper.placement.gpu_search import EstimateCache
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.sidecar.admission import admit
from gatekeeper.sidecar.calibrator import Calibrator
from gatekeeper.sidecar.deployment import DeploymentError, ManagerConfig
from gatekeeper.sidecar.host_admission import (
    HostBudget,
    unrealised_host_bytes,
    worker_host_bytes,
)
from gatekeeper.sidecar.ledger import Ledger, Reservation
from gatekeeper.sidecar.ledger_file import LedgerError
from gatekeeper.sidecar.ledger_keeper import LedgerKeeper

__all__ = ["Admitter"]


@dataclass(eq=False)
class Admitter:
    """Admissions of one sidecar's deployments (first ones and restarts)."""

    config: ManagerConfig
    ledger: Ledger
    keeper: LedgerKeeper
    snapshot: Callable[[], Awaitable[InventorySnapshot]]
    estimates: EstimateCache
    pending: set[asyncio.Future[int]]
    """Releases still to happen (shared with the manager's undeployments)."""
    metrics: SidecarMetrics | None
    calibrator: Calibrator | None

    def calibrated(self, request: PlacementRequest) -> PlacementRequest:
        if self.calibrator is None:
            return request
        factors = self.calibrator.factors(request.model.model_type)
        return dataclasses.replace(request, corrections=factors)

    async def _admit(
        self, deployment_id: str, request: PlacementRequest, sleep_level: Literal[0, 1, 2]
    ) -> Decision:
        await self.keeper.in_order()
        # Before the snapshot: a worker turning ready after this is counted by the
        # ledger transaction even if the snapshot missed it (Ledger.admit's since).
        since = self.ledger.now()
        snapshot = await self.snapshot()
        host = await asyncio.to_thread(self.host_budget, sleep_level)
        return await asyncio.to_thread(
            admit,
            self.ledger,
            request,
            snapshot,
            deployment_id=deployment_id,
            policy=self.config.policy,
            ttl_seconds=self.config.startup_timeout_seconds + 60,
            cache=self.estimates,
            since=since,
            host=host,
        )

    def host_budget(
        self, sleep_level: Literal[0, 1, 2] = 0, live: Sequence[Reservation] | None = None
    ) -> HostBudget:
        """The node's host memory now, less what running workers have yet to take of
        their promises (``host_admission``): read before the ledger's transaction.
        ``sleep_level``: the level the worker will sleep at when idle (0: never);
        ``live``: the ledger's live rows when the caller has read them."""
        reading = ProcHostMemory(self.config.host_memory_root).read()
        rows = self.ledger.live() if live is None else live
        unrealised = unrealised_host_bytes(rows, worker_host_bytes)
        return HostBudget(reading, self.config.host_margin_bytes, unrealised, 0, sleep_level)

    async def admit(
        self, deployment_id: str, request: PlacementRequest, *, sleep_level: Literal[0, 1, 2] = 0
    ) -> Decision:
        """``_admit`` bounded by ``admission_timeout_seconds``. The admission's thread
        cannot be interrupted: if it admits after all, its reservation is released.
        ``sleep_level``: a worker that will sleep at level 1 is promised host memory for
        its weights too."""
        limit = self.config.admission_timeout_seconds
        task = asyncio.ensure_future(self._admit(deployment_id, request, sleep_level))
        done, _ = await asyncio.wait({task}, timeout=limit)
        if task in done:
            if isinstance(task.exception(), LedgerError) and self.metrics is not None:
                self.metrics.admission("error")  # no decision: the state dir refused it
            return task.result()

        def late(t: asyncio.Task[Decision]) -> None:
            if not t.cancelled() and t.exception() is None and t.result().admitted:
                release = asyncio.to_thread(self.ledger.release, deployment_id)
                future = asyncio.ensure_future(release)
                self.pending.add(future)
                future.add_done_callback(self.pending.discard)

        task.add_done_callback(late)
        if self.metrics is not None:
            self.metrics.admission("error")
        raise DeploymentError(
            f"admission of {request.model.name!r} did not finish in {limit:g} s; nothing was "
            "reserved. Retry; if it recurs, the estimate is pathological (check the model's "
            "options) or raise GATEKEEPER_ADMISSION_TIMEOUT_SECONDS",
            status=503,
            field="admission_timeout_seconds",
            value=limit,
        )
