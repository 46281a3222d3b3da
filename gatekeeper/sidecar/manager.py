"""Deployments: admit, launch, supervise, stop and adopt vLLM workers.

One ``DeploymentManager`` per sidecar, on its event loop. A deployment goes
``admitted -> launching -> loading -> ready``, or ends ``failed`` or ``stopped``:

- **deploy**: an admission (placement + reservation in one ledger transaction), then a
  worker launched with the decision's arguments on the chosen GPUs; readiness is awaited
  in the background. When ready, the reservation is marked ready (NVML's figure takes
  over) and vLLM's own memory figures are read from the log.
- **supervise**: the worker's exit is seen at once; the reservation is released and the
  worker restarted per the restart policy, with a fresh admission.
- **stop**: drain in-flight requests (bounded), SIGTERM the process group, SIGKILL after
  the grace period, release the reservation.
- **adopt**: each deployment is recorded in ``state_dir/deployments/ID.json``
  (``records``); a new sidecar adopts the workers whose reservations are live, whose
  process group is alive and whose ``/health`` answers, and releases the rest
  (``adoption`` decides; the manager registers and supervises what it adopts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot
from gatekeeper.metrics.events import SidecarMetrics
from gatekeeper.placement.gpu_search import EstimateCache
from gatekeeper.placement.types import Decision, PlacementRequest, Prediction
from gatekeeper.sidecar.admission import admit
from gatekeeper.sidecar.adoption import adopt_all
from gatekeeper.sidecar.calibrator import Calibrator
from gatekeeper.sidecar.deployment import (
    Deployment,
    DeploymentError,
    ManagerConfig,
    State,
    check_name,
    free_port,
    process_start_ticks,
    slug,
    worker_view,
)
from gatekeeper.sidecar.launcher import LaunchSpec, WorkerProcess, WorkerStartError
from gatekeeper.sidecar.ledger import Ledger
from gatekeeper.sidecar.ledger_file import LedgerError
from gatekeeper.sidecar.ledger_keeper import LedgerKeeper
from gatekeeper.sidecar.logs import deployment_context, deployment_extra
from gatekeeper.sidecar.records import remove_record, write_record
from gatekeeper.sidecar.rehearsal import simulator_env

__all__ = [
    "FINISHED",
    "DeploymentManager",
]

logger = logging.getLogger(__name__)

FINISHED = ("stopped", "failed")
"""The states of a deployment that is over: ``ps`` lists them with ``--all`` only, and
``forget`` drops them."""


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
        self.on_start_failure: Callable[[Deployment], None] = lambda d: None
        """Called when a launch ends before the worker is ready (set by the router)."""
        self.records_dir = config.state_dir / "deployments"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.estimates = EstimateCache()
        """Estimates kept across admissions (the same model is placed again and again)."""
        self._lock = asyncio.Lock()
        self._late_releases: set[asyncio.Future[int]] = set()
        """Releases still to happen: of admissions that finished after their time limit,
        and of undeployments whose release the ledger refused (retried)."""
        self.keeper = LedgerKeeper(ledger, self.deployments.values, self.snapshot, config)

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

    def _calibrated(self, request: PlacementRequest) -> PlacementRequest:
        if self.calibrator is None:
            return request
        factors = self.calibrator.factors(request.model.model_type)
        return dataclasses.replace(request, corrections=factors)

    async def deploy(
        self, name: str, request: PlacementRequest, *, body: dict[str, Any] | None = None
    ) -> tuple[Decision, Deployment | None]:
        """Admit and launch; returns the decision and, when admitted, the deployment.
        ``body``: the admin API's deploy body, kept with it (``Deployment.body``)."""
        check_name(name)
        request = self._calibrated(request)
        async with self._lock:
            live = [d for d in self.by_name(name) if d.state != "failed"]
            if live:
                if self.metrics is not None:
                    self.metrics.admission("conflict")
                raise DeploymentError(
                    f"model name {name!r} is already deployed as {live[0].id} ({live[0].state}); "
                    "undeploy it first or choose another name",
                    status=409,
                    field="name",
                    value=name,
                )
            deployment_id = f"{slug(name)}-{uuid.uuid4().hex[:8]}"
            decision = await self._admit_within_limit(deployment_id, request)
            if self.metrics is not None:
                self.metrics.decision(decision)
            if not decision.admitted:
                return decision, None
            d = Deployment.admitted(deployment_id, name, request, decision, body)
            self.deployments[d.id] = d
        logger.info(
            "deployment %s: admitted as %s on GPU %s",
            d.id,
            name,
            ",".join(map(str, d.gpu_indices)),
            extra=deployment_extra(d.id, d.model),
        )
        d.supervisor = asyncio.get_running_loop().create_task(self._run(d))
        return decision, d

    async def _admit(self, deployment_id: str, request: PlacementRequest) -> Decision:
        await self.keeper.in_order()
        # Before the snapshot: a worker turning ready after this is counted by the
        # ledger transaction even if the snapshot missed it (Ledger.admit's since).
        since = self.ledger.now()
        snapshot = await self.snapshot()
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
        )

    async def _admit_within_limit(self, deployment_id: str, request: PlacementRequest) -> Decision:
        """``_admit`` bounded by ``admission_timeout_seconds``. The admission's thread
        cannot be interrupted: if it admits after all, its reservation is released."""
        limit = self.config.admission_timeout_seconds
        task = asyncio.ensure_future(self._admit(deployment_id, request))
        done, _ = await asyncio.wait({task}, timeout=limit)
        if task in done:
            if isinstance(task.exception(), LedgerError) and self.metrics is not None:
                self.metrics.admission("error")  # no decision: the state dir refused it
            return task.result()

        def late(t: asyncio.Task[Decision]) -> None:
            if not t.cancelled() and t.exception() is None and t.result().admitted:
                release = asyncio.to_thread(self.ledger.release, deployment_id)
                future = asyncio.ensure_future(release)
                self._late_releases.add(future)
                future.add_done_callback(self._late_releases.discard)

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

    async def _run(self, d: Deployment) -> None:
        """Launch, wait for readiness, watch the worker, restart per policy.

        An unexpected error never ends the task silently with the worker running and
        its reservation held: it is logged, the worker stopped and the reservation
        released."""
        deployment_context.set(deployment_extra(d.id, d.model))  # this task's lines
        try:
            await self._supervise(d)
        except Exception as e:
            logger.exception("deployment %s: supervisor failed", d.id)
            d.error = f"supervisor failed: {type(e).__name__}: {e}"
            await self._fail(d)

    async def _supervise(self, d: Deployment) -> None:
        while True:
            ok, unhealthy = await self._launch_once(d), False
            if ok:
                assert d.worker is not None
                unhealthy = await self._watch_serving(d)
                if d.stopping:
                    return
                if not unhealthy:
                    d.error = f"worker exited with code {d.worker.returncode} while serving"
            await self._fail(d, "unhealthy" if unhealthy else "failed")
            if not ok and not d.stopping:
                self.on_start_failure(d)
            if not await self._restart_or_fail(d):
                return

    async def _launch_once(self, d: Deployment) -> bool:
        taken = {x.port for x in self.deployments.values() if x.state not in ("stopped", "failed")}
        try:
            d.port = free_port(
                self.config.worker_host, self.config.port_min, self.config.port_max, taken
            )
            spec = self._spec(d)
            started = time.monotonic()
            self._set(d, "launching")
            d.worker = await WorkerProcess.start(spec, self.base_env)
            # Read before anything awaits: the child cannot have been reaped yet, so the
            # pid is still the worker's (a zombie's stat keeps its start time).
            d.pid_start_ticks = process_start_ticks(d.worker.pid)
            await asyncio.to_thread(self.ledger.set_pid, d.id, d.worker.pid)
            write_record(self.records_dir, d, self.config.policy.default_vllm_version)
            self._set(d, "loading")
            log = await d.worker.wait_ready(self.client, self.config.startup_timeout_seconds)
        except (WorkerStartError, DeploymentError, GatekeeperError) as e:
            d.error = str(e)
            return False
        except Exception as e:  # e.g. OSError writing the record: the worker must not leak
            logger.exception("deployment %s: launch failed", d.id)
            d.error = f"launch failed: {type(e).__name__}: {e}"
            return False
        d.actual = log.memory
        if d.stopping:  # undeployed while loading: never announce it ready
            return True
        await self._became_ready(d, self.ledger.mark_ready)
        try:
            await self._observe_ready(d, time.monotonic() - started)
        except Exception:  # metrics or calibration must not end the supervision
            logger.exception("deployment %s: recording the ready worker failed", d.id)
        return True

    async def _observe_ready(self, d: Deployment, launch_seconds: float) -> None:
        view = worker_view(d)
        if self.metrics is not None:
            self.metrics.worker_ready(view, launch_seconds)
        if self.calibrator is not None:
            await asyncio.to_thread(
                self.calibrator.record_worker,
                view.family,
                {str(k): v for k, v in view.predicted.items()},
                {str(k): v for k, v in view.actual.items()},
                view.applied_factors,
            )

    def _spec(self, d: Deployment) -> LaunchSpec:
        args = (*d.args, "--served-model-name", d.name)
        return LaunchSpec(
            worker_id=d.id,
            command=self.config.worker_command,
            args=args,
            host=self.config.worker_host,
            port=d.port,
            gpu_indices=d.gpu_indices,
            log_path=self.config.state_dir / "logs" / f"{d.id}.log",
            work_dir=self.config.state_dir / "work" / d.id,
            env={
                **(
                    simulator_env(d.prediction or Prediction(), d.promise_bytes)
                    if self.config.rehearsal
                    else {}
                ),
                **self.config.worker_env,
            },
        )

    async def _fail(self, d: Deployment, state: State = "failed") -> None:
        """Stop the worker and release its rows; the deployment is ``failed``, or stays
        ``unhealthy`` (a worker taken out by liveness) until its restart is decided."""
        if d.worker is not None:
            await d.worker.stop(self.config.stop_grace_seconds)
        await self.keeper.write(self.ledger.release, d.id)
        d.ready_event.clear()
        self._set(d, state)

    async def _restart_or_fail(self, d: Deployment) -> bool:
        """``_should_restart``; an ``unhealthy`` deployment that will not be restarted
        becomes ``failed``."""
        restart = await self._should_restart(d)
        if not restart and d.state == "unhealthy":
            self._set(d, "failed")
        return restart

    async def _should_restart(self, d: Deployment) -> bool:
        c = self.config
        if c.restart_policy == "never":
            return False
        # A refused admission (the GPU momentarily busy) is retried with the same
        # back-off, each try counting against restart_limit (#13 item 10).
        while not d.stopping and d.restarts < c.restart_limit:
            await asyncio.sleep(c.restart_backoff_seconds * (2**d.restarts))
            if d.stopping:
                return False
            d.restarts += 1
            d.request = self._calibrated(d.request)
            decision = await self._admit_within_limit(d.id, d.request)
            if self.metrics is not None:
                self.metrics.decision(decision)
            if decision.admitted:
                d.use_decision(decision)
                return True
            d.error = "restart not admitted: " + "; ".join(decision.reasons[:2])
        return False

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
            health=self._health,
            snapshot=self.snapshot,
            resume=self._resume,
            restore=self.keeper.restore,
        )
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
        d.supervisor = asyncio.get_running_loop().create_task(self._watch_adopted(d))

    async def _await_adopted_loading(self, d: Deployment) -> bool:
        """An adopted worker that was still loading: wait for it as a launch would (the
        rest of its start-up time); True once it is ready and its row is."""
        assert d.worker is not None
        elapsed = time.time() - d.created_at
        remaining = max(1.0, self.config.startup_timeout_seconds - elapsed)
        try:
            log = await d.worker.wait_ready(self.client, remaining)
        except WorkerStartError as e:
            d.error = str(e)
            return False
        d.actual = log.memory
        if not d.stopping:
            await self._became_ready(d, self.ledger.adopt_ready)
        return True

    async def _became_ready(self, d: Deployment, mark: Callable[[str], int]) -> None:
        """The worker serves: its rows become ready (``mark``), then the deployment."""
        await self.keeper.write(mark, d.id)
        d.ready_at = time.time()
        d.error = None
        self._set(d, "ready")
        d.ready_event.set()

    async def _watch_adopted(self, d: Deployment) -> None:
        assert d.worker is not None
        if d.state == "loading" and not await self._await_adopted_loading(d):
            if d.stopping:
                return
            await self._fail(d)
            self.on_start_failure(d)
            if await self._should_restart(d):
                await self._run(d)
            return
        unhealthy = await self._watch_serving(d)
        if d.stopping:
            return
        if not unhealthy:
            d.error = "adopted worker exited"
        try:
            await self._fail(d, "unhealthy" if unhealthy else "failed")
            restart = await self._restart_or_fail(d)
        except Exception as e:
            logger.exception("deployment %s: supervisor failed", d.id)
            d.error = f"supervisor failed: {type(e).__name__}: {e}"
            await self._fail(d)
            return
        if restart:
            await self._run(d)

    async def _watch_serving(self, d: Deployment) -> bool:
        """While the worker serves: probe its ``/health`` every ``health_interval_seconds``
        (liveness; each probe bounded by ``health_timeout_seconds``), and see a lost
        ledger file on the way. Returns False when the worker exits (or is being
        stopped), True when it missed ``health_failures`` probes in a row: it is then
        ``unhealthy``, gets no traffic, and the caller stops and restarts it as it
        would a worker that exited (the restart policy). vLLM's ``/health`` answers
        200 while its engine lives (vllm/entrypoints/serve/instrumentator/health.py)."""
        assert d.worker is not None
        c, failures = self.config, 0
        while failures < c.health_failures:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(d.worker.exited.wait(), c.health_interval_seconds)
            if not d.worker.alive or d.stopping or d.state != "ready":
                return False
            if self.ledger.vanished():
                with contextlib.suppress(LedgerError):  # retried next round
                    await self.keeper.rebuild()
            healthy = await self._health(d.worker.spec.host, d.port, c.health_timeout_seconds)
            failures = 0 if healthy else failures + 1
        d.error = (
            f"worker stopped answering /health: {failures} probes in a row failed (timeout "
            f"{c.health_timeout_seconds:g} s, every {c.health_interval_seconds:g} s); stopped "
            f"and restarted per restart_policy ({c.restart_policy})"
        )
        d.ready_event.clear()
        self._set(d, "unhealthy")
        logger.warning("deployment %s: %s", d.id, d.error, extra=deployment_extra(d.id, d.model))
        if self.metrics is not None:
            self.metrics.worker_unhealthy(d.name)
        return True

    async def _health(self, host: str, port: int, timeout: float = 5.0) -> bool:
        try:
            response = await self.client.get(f"http://{host}:{port}/health", timeout=timeout)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    def _set(self, d: Deployment, state: State) -> None:
        d.state = state
        logger.info("deployment %s: %s", d.id, state, extra=deployment_extra(d.id, d.model))
        self.on_change(d)
