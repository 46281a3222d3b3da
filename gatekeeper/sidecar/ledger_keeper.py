"""Keeps the ledger's promises whole (#27 item 4): a ledger file that was lost (moved
aside before a start, or removed or replaced under a running sidecar) is rebuilt from
the deployments that run, before an admission counts on it.

``LedgerKeeper`` belongs to the ``DeploymentManager`` and runs on its event loop. It
refuses admissions (503, ``Retry-After``) until adoption has written back the rows of
every adopted worker (``restoring``), recreates a vanished file (``Ledger.vanished``,
``Ledger.reopen``) and writes back each live deployment's rows (``Ledger.restore``:
the bytes its admission promised per GPU, else NVML's figure of its process tree), and
retries once a write that met the loss midway. See docs/ledger.md."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable

from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.gpus.proctree import process_tree
from gatekeeper.metrics.worker_states import RESERVING_STATES, SERVING_STATES
from gatekeeper.sidecar.deployment import (
    Deployment,
    DeploymentError,
    ManagerConfig,
    restored_promises,
)
from gatekeeper.sidecar.ledger import Ledger
from gatekeeper.sidecar.ledger_file import LedgerError, LedgerLostError

__all__ = ["LedgerKeeper"]

logger = logging.getLogger(__name__)


class LedgerKeeper:
    """Rebuilds the ledger's rows from the live deployments when its file is lost."""

    def __init__(
        self,
        ledger: Ledger,
        deployments: Callable[[], Iterable[Deployment]],
        snapshot: Callable[[], Awaitable[InventorySnapshot]],
        config: ManagerConfig,
    ) -> None:
        self.ledger = ledger
        self._deployments = deployments
        self._snapshot = snapshot
        self._state_dir = config.state_dir
        self._ttl_seconds = config.startup_timeout_seconds + 60
        """A loading worker's written-back rows expire as an admission's would."""
        self._lock = asyncio.Lock()
        self.restoring: str | None = (
            "the sidecar is starting: the reservations of the workers an earlier sidecar "
            "left running are being written back to the ledger"
        )
        """Why admissions are refused (503) until the ledger holds every running
        worker's reservation; None once it does (the manager's ``adopt`` is done)."""

    async def in_order(self) -> None:
        """Make sure the ledger holds every running worker's reservation before an
        admission counts on it: a file that vanished under the sidecar is recreated and
        refilled first; while that cannot be done (or adoption is not over), 503 with
        the reason and Retry-After."""
        try:
            if self.ledger.vanished():
                await self.rebuild()
        except LedgerError as e:
            raise self._refusal(
                f"the ledger {self.ledger.path} vanished and cannot be recreated ({e}); "
                "admissions wait until it is",
                retry_after=5,
            ) from e
        if self.restoring is not None:
            raise self._refusal(f"{self.restoring}; retry in a few seconds", retry_after=2)

    def _refusal(self, message: str, *, retry_after: float) -> DeploymentError:
        return DeploymentError(
            message,
            status=503,
            field="state_dir",
            value=str(self._state_dir),
            retry_after=retry_after,
        )

    async def rebuild(self) -> int:
        """The ledger file was removed, moved aside or replaced while the sidecar ran:
        open (create) the file at its path again and write back the reservation of
        every deployment that holds or is about to hold GPU memory (``Ledger.restore``:
        one the new file already knows is left alone). Returns the rows written."""
        async with self._lock:
            if not self.ledger.vanished():
                return 0
            logger.warning(
                "the ledger %s was removed or replaced while the sidecar ran: recreating "
                "it and writing back the reservations of the running deployments",
                self.ledger.path,
            )
            await asyncio.to_thread(self.ledger.reopen)
            snapshot = await self._snapshot()
            written = 0
            for d in list(self._deployments()):
                written += await self.restore(d, snapshot)
            logger.warning("the ledger %s was recreated with %d rows", self.ledger.path, written)
            return written

    async def restore(self, d: Deployment, snapshot: InventorySnapshot) -> int:
        """Write back a live deployment's rows if the ledger has none (``Ledger.restore``):
        ready for a serving worker, pending for one still starting."""
        if d.state not in RESERVING_STATES or not d.gpu_uuids or (d.worker and not d.worker.alive):
            return 0
        pid = d.worker.pid if d.worker is not None else None
        pids = await asyncio.to_thread(process_tree, pid) if pid is not None else frozenset()
        return await asyncio.to_thread(
            self.ledger.restore,
            d.id,
            d.model,
            restored_promises(d, snapshot, pids),
            ready=d.state in SERVING_STATES,
            ttl_seconds=self._ttl_seconds,
            pid=pid,
            payload=json.dumps(d.decision_record()),
        )

    async def write(self, write: Callable[[str], int], deployment_id: str) -> int:
        """``write(deployment_id)`` in a thread; a ledger file lost under the sidecar is
        rebuilt and the write tried once more."""
        try:
            return await asyncio.to_thread(write, deployment_id)
        except LedgerLostError:
            await self.rebuild()
            return await asyncio.to_thread(write, deployment_id)
