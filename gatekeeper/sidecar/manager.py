"""Deployments: admit, launch, supervise, stop and adopt vLLM workers.

One ``DeploymentManager`` per sidecar, on its event loop. A deployment goes
``admitted -> launching -> loading -> ready``, or ends ``failed`` or ``stopped``:

- **deploy**: an admission (placement + reservation in one ledger transaction, bounded
  in time: ``admitter``), then the deployment's task (``supervisor``) launches a worker
  with the decision's arguments on the chosen GPUs and awaits readiness. When ready, the
  reservation is marked ready (NVML's figure takes over) and vLLM's own memory figures
  are read from the log.
- **supervise** (``supervisor``): the worker's exit is seen at once; the reservation is
  released and the worker restarted per the restart policy, with a fresh admission.
- **stop**: drain in-flight requests (bounded), SIGTERM the process group, SIGKILL after
  the grace period, release the reservation.
- **adopt**: each deployment is recorded in ``state_dir/deployments/ID.json``
  (``records``); a new sidecar adopts the workers whose reservations are live, whose
  process group is alive and whose ``/health`` answers, and releases the rest
  (``adoption`` decides; the manager registers what it adopts and the supervisor
  watches it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot
from gatekeeper.metrics.events import SidecarMetrics
from gatekeeper.metrics.worker_states import FINISHED_STATES
from gatekeeper.placement.gpu_search import EstimateCache
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.sidecar.admitter import Admitter
from gatekeeper.sidecar.adoption import adopt_all
from gatekeeper.sidecar.calibrator import Calibrator
from gatekeeper.sidecar.deployment import (
    Deployment,
    DeploymentError,
    ManagerConfig,
    State,
    check_name,
    slug,
)
from gatekeeper.sidecar.host_admission import host_sleep_level, pending_host_bytes
from gatekeeper.sidecar.ledger import Ledger, Reservation
from gatekeeper.sidecar.ledger_file import LedgerError
from gatekeeper.sidecar.ledger_keeper import LedgerKeeper
from gatekeeper.sidecar.logs import deployment_extra
from gatekeeper.sidecar.records import remove_record
from gatekeeper.sidecar.rejection import log_rejection, rejection_fields
from gatekeeper.sidecar.sleep import Sleeper
from gatekeeper.sidecar.supervisor import Supervisor
from gatekeeper.vllm.sleep_mode import IdlePolicy, release_sleep_problem

__all__ = [
    "FINISHED",
    "DeploymentManager",
]

logger = logging.getLogger(__name__)

FINISHED = FINISHED_STATES
"""The states of a deployment that is over (``worker_states.FINISHED_STATES``)."""


class DeploymentManager:
    """Owns every deployment of this sidecar."""

    def __init__(
        self,
        config: ManagerConfig,
        inventory: GpuInventory,
        ledger: Ledger,
        client: httpx.AsyncClient,
        *,
        base_env: dict[str, str] | None = None,
        on_change: Callable[[Deployment], None] | None = None,
        metrics: SidecarMetrics | None = None,
        calibrator: Calibrator | None = None,
    ) -> None:
        self.metrics = metrics
        self.calibrator = calibrator
        self.config = config
        self.inventory = inventory
        self.ledger = ledger
        self.client = client
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.deployments: dict[str, Deployment] = {}
        self.on_change = on_change or (lambda d: None)
        self.in_flight: Callable[[str], int] = lambda deployment_id: 0
        """Requests the proxy has in flight to a deployment (set by the app)."""
        self.records_dir = config.state_dir / "deployments"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.estimates = EstimateCache()
        """Estimates kept across admissions (the same model is placed again and again)."""
        self._lock = asyncio.Lock()
        self._late_releases: set[asyncio.Future[int]] = set()
        """Releases still to happen: of admissions that finished after their time limit,
        and of undeployments whose release the ledger refused (retried)."""
        self.keeper = LedgerKeeper(ledger, self.deployments.values, self.snapshot, config)
        pending, estimates = self._late_releases, self.estimates
        self._admitter = Admitter(
            config, ledger, self.keeper, self.snapshot, estimates, pending, metrics, calibrator
        )
        self._supervisor = Supervisor(
            self._admitter, client, self.deployments, self._set, self.records_dir, self.base_env
        )
        self.sleeper = Sleeper(
            config,
            ledger,
            self.keeper,
            client,
            self.deployments,
            self._set,
            self.snapshot,
            lambda deployment_id: self.in_flight(deployment_id),
            self.undeploy,
            metrics.sleep if metrics is not None else None,
        )
        """Puts idle ``sleep`` deployments to sleep and wakes them (``sidecar.sleep``)."""

    @property
    def on_start_failure(self) -> Callable[[Deployment], None]:
        """Called when a launch ends before the worker is ready (set by the router)."""
        return self._supervisor.on_start_failure

    @on_start_failure.setter
    def on_start_failure(self, callback: Callable[[Deployment], None]) -> None:
        self._supervisor.on_start_failure = callback

    # -- queries ------------------------------------------------------------------------

    def by_name(self, name: str) -> list[Deployment]:
        return [
            d for d in self.deployments.values() if d.name == name and d.state not in ("stopped",)
        ]

    def get(self, deployment_id: str) -> Deployment:
        d = self.deployments.get(deployment_id)
        if d is None:
            raise DeploymentError(
                f"deployment {deployment_id!r} does not exist; list them with GET /admin/deployments",
                status=404,
                field="id",
                value=deployment_id,
            )
        return d

    async def snapshot(self) -> InventorySnapshot:
        return await asyncio.to_thread(self.inventory.snapshot)

    # -- deploy -------------------------------------------------------------------------

    async def deploy(
        self,
        name: str,
        request: PlacementRequest,
        *,
        body: dict[str, Any] | None = None,
        idle: IdlePolicy | None = None,
    ) -> tuple[Decision, Deployment | None]:
        """Admit and launch; returns the decision and, when admitted, the deployment.
        ``body``: the admin API's deploy body, kept with it (``Deployment.body``);
        ``idle``: its idle policy (the global one when None)."""
        check_name(name)
        idle = self.idle_policy(request, idle)
        request = self._admitter.calibrated(request)
        async with self._lock:
            live = [d for d in self.by_name(name) if d.state != "failed"]
            if live:
                if self.metrics is not None:
                    self.metrics.admission("conflict")
                conflict = DeploymentError(
                    f"model name {name!r} is already deployed as {live[0].id} ({live[0].state}); "
                    "undeploy it first or choose another name",
                    status=409,
                    field="name",
                    value=name,
                )
                log_rejection({"event": "sidecar_rejection", "status": 409, "name": name,
                               "model": request.model.name, "reason": str(conflict)})  # fmt: skip
                raise conflict
            deployment_id = f"{slug(name)}-{uuid.uuid4().hex[:8]}"
            decision = await self._admitter.admit(
                deployment_id, request, sleep_level=host_sleep_level(idle)
            )
            if self.metrics is not None:
                self.metrics.decision(decision)
            if not decision.admitted:
                log_rejection(rejection_fields(name, decision))
                return decision, None
            d = Deployment.admitted(deployment_id, name, request, decision, body)
            d.idle = idle
            self.deployments[d.id] = d
        logger.info(
            "deployment %s: admitted as %s on GPU %s",
            d.id,
            name,
            ",".join(map(str, d.gpu_indices)),
            extra=deployment_extra(d.id, d.model),
        )
        d.supervisor = asyncio.get_running_loop().create_task(self._supervisor.run(d))
        if idle.action == "sleep":
            self.sleeper.start()
        return decision, d

    def idle_policy(self, request: PlacementRequest, idle: IdlePolicy | None) -> IdlePolicy:
        """``idle`` (else the global policy), refused with 400 when the worker's vLLM
        release has no sleep mode: at deploy time, not at the first idle."""
        idle = idle or self.config.idle
        if idle.action != "sleep":
            return idle
        release = request.options.vllm_version or self.config.policy.default_vllm_version
        problem = release_sleep_problem(release)
        if problem is not None:
            raise DeploymentError(
                f"idle_action = 'sleep': {problem}", status=400, field="idle_action", value="sleep"
            )
        return idle

    async def wake(self, d: Deployment) -> None:
        """Wake a sleeping deployment (``Sleeper.wake``)."""
        await self.sleeper.wake(d)

    async def host_usable_bytes(self, live: Sequence[Reservation]) -> int | None:
        """Host bytes an admission would find usable now, counted from the ledger's
        ``live`` rows as admission counts them (``Admitter.host_budget``, the starting
        workers' promises too); None when the node's memory cannot be read."""
        budget = await asyncio.to_thread(self._admitter.host_budget, 0, live)
        pending = pending_host_bytes(r for r in live if r.state == "pending")
        found = dataclasses.replace(budget, pending_bytes=pending)
        return found.usable_bytes if found.reading.ok else None

    # -- stop ---------------------------------------------------------------------------

    async def undeploy(self, deployment_id: str) -> Deployment:
        """Drain (bounded), stop the worker, release the reservation."""
        d = self.get(deployment_id)
        if d.stopping or d.state == "stopped":
            return d
        d.stopping = True
        self._set(d, "stopping")
        deadline = time.monotonic() + self.config.drain_seconds
        while self.in_flight(d.id) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if d.worker is not None:
            await d.worker.stop(self.config.stop_grace_seconds)
        if d.supervisor is not None:
            d.supervisor.cancel()
            await asyncio.gather(d.supervisor, return_exceptions=True)
        if d.worker is not None and d.worker.alive:
            # A restart may have launched a new worker while the old one was stopped.
            await d.worker.stop(self.config.stop_grace_seconds)
        d.ready_event.clear()
        try:
            await asyncio.to_thread(self.ledger.release, d.id)
        except LedgerError as e:
            # The worker is gone but its reservation could not be released (a full or
            # read-only state directory): keep retrying, and say so, rather than leave
            # the GPU promised to nobody until the row expires.
            d.error = f"worker stopped, reservation not yet released: {e}"
            self._set(d, "stopping")
            retry = asyncio.get_running_loop().create_task(self._release_until_done(d))
            self._late_releases.add(retry)
            retry.add_done_callback(self._late_releases.discard)
            raise DeploymentError(
                f"deployment {d.id}: the worker is stopped but its reservation could not be "
                f"released ({e}); it is retried in the background. Free space in or fix the "
                f"permissions of {self.config.state_dir}",
                status=503,
                field="state_dir",
                value=str(self.config.state_dir),
            ) from e
        self._stopped(d)
        return d

    def forget(self, deployment_id: str) -> Deployment:
        """Drop a stopped or failed deployment from the list (and its record, if one is
        left); a live one is refused with 409: undeploy it first."""
        d = self.get(deployment_id)
        if d.state not in FINISHED:
            raise DeploymentError(
                f"deployment {deployment_id!r} is {d.state}, not stopped or failed; stop it "
                "first (DELETE /admin/deployments/ID, gatekeeper undeploy ID), then forget it",
                status=409,
                field="id",
                value=deployment_id,
            )
        del self.deployments[deployment_id]
        remove_record(self.records_dir, d.id)
        return d

    def _stopped(self, d: Deployment) -> None:
        self._set(d, "stopped")
        remove_record(self.records_dir, d.id)

    async def _release_until_done(self, d: Deployment, first_wait: float = 0.5) -> int:
        """Release a stopped deployment's reservation, retrying with back-off (at most a
        minute apart) until the ledger takes the write."""
        wait = first_wait
        while True:
            await asyncio.sleep(wait)
            try:
                count = await asyncio.to_thread(self.ledger.release, d.id)
            except LedgerError as e:
                logger.warning("deployment %s: release failed again: %s", d.id, e)
                wait = min(wait * 2, 60.0)
                continue
            d.error = None
            self._stopped(d)
            return count

    async def close(self, *, stop_workers: bool) -> None:
        """Sidecar shutdown: stop the workers, or leave them running to be adopted."""
        await self.sleeper.close()
        for d in list(self.deployments.values()):
            if stop_workers:
                try:
                    await self.undeploy(d.id)
                except DeploymentError as e:  # the worker is stopped; the row waits
                    logger.warning("deployment %s: %s", d.id, e)
            elif d.supervisor is not None:
                d.supervisor.cancel()
                await asyncio.gather(d.supervisor, return_exceptions=True)

    # -- records and adoption -----------------------------------------------------------

    async def adopt(self, resolve: Callable[[str], PlacementRequest]) -> list[str]:
        """Adopt the workers an earlier sidecar left running; release the rest
        (``adoption.adopt_all``); admissions open once their rows are in the ledger.
        ``resolve`` rebuilds a deployment's request from its recorded model and options.
        """
        adopted = await adopt_all(
            self.records_dir,
            resolve,
            ledger=self.ledger,
            config=self.config,
            health=self._supervisor.health,
            snapshot=self.snapshot,
            resume=self._resume,
            restore=self.keeper.restore,
        )
        for d in [self.deployments[i] for i in adopted if i in self.deployments]:
            if d.idle.action == "sleep" and d.state == "ready":
                await self.sleeper.adopt(d)
                self.sleeper.start()
        self.keeper.restoring = None
        return adopted

    def _resume(self, d: Deployment, healthy: bool) -> None:
        """An adopted deployment: listed, ``ready`` (serving) or ``loading``, supervised."""
        self.deployments[d.id] = d
        if healthy:
            self._set(d, "ready")
            d.ready_event.set()
        else:
            self._set(d, "loading")
        d.supervisor = asyncio.get_running_loop().create_task(self._supervisor.watch_adopted(d))

    def _set(self, d: Deployment, state: State) -> None:
        d.state = state
        logger.info("deployment %s: %s", d.id, state, extra=deployment_extra(d.id, d.model))
        self.on_change(d)
