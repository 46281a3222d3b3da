"""A deployment's life once admitted: launch, readiness, liveness, restart.

``Supervisor.run(d)`` is each deployment's task (``Deployment.supervisor``): it launches
the worker with the decision's arguments on the chosen GPUs, waits for readiness (then
the reservation is marked ready, NVML's figure takes over, and vLLM's own memory figures
are read from the log), watches the worker while it serves (its exit at once, its
``/health`` every ``health_interval_seconds``), and when it ends stops it, releases the
reservation and restarts it per the restart policy, each restart a fresh admission
(``Admitter``). ``watch_adopted(d)`` is the same for a worker an earlier sidecar left
running (``adoption``). An unexpected error never ends the task silently with the worker
running and its reservation held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gatekeeper.errors import GatekeeperError
from gatekeeper.metrics.events import SidecarMetrics
from gatekeeper.metrics.worker_states import FINISHED_STATES
from gatekeeper.placement.types import Prediction
from gatekeeper.sidecar.admitter import Admitter
from gatekeeper.sidecar.calibrator import Calibrator
from gatekeeper.sidecar.deployment import (
    Deployment,
    DeploymentError,
    ManagerConfig,
    State,
    free_port,
    process_start_ticks,
    worker_view,
)
from gatekeeper.sidecar.host_admission import host_sleep_level
from gatekeeper.sidecar.launcher import LaunchSpec, WorkerProcess, WorkerStartError
from gatekeeper.sidecar.ledger import Ledger
from gatekeeper.sidecar.ledger_file import LedgerError
from gatekeeper.sidecar.ledger_keeper import LedgerKeeper
from gatekeeper.sidecar.logs import deployment_context, deployment_extra
from gatekeeper.sidecar.records import write_record
from gatekeeper.sidecar.rehearsal import simulator_env
from gatekeeper.vllm.sleep_mode import DEV_MODE_ENV, SLEEP_FLAG

__all__ = ["Supervisor"]

logger = logging.getLogger(__name__)


_WATCHED = frozenset({"ready", "sleeping", "waking"})
"""States in which a launched worker is watched (its exit, its ``/health``): serving, or
asleep (vLLM answers ``/health`` asleep as awake) or waking."""


def _nothing(d: Deployment) -> None:
    return None


@dataclass(eq=False)
class Supervisor:
    """Supervises each deployment of one sidecar (the manager's ``deployments``); the
    ledger, its keeper, the configuration, metrics and calibrator are its admitter's."""

    admitter: Admitter
    client: httpx.AsyncClient
    deployments: dict[str, Deployment]
    set_state: Callable[[Deployment, State], None]
    """The manager's: logs the new state and calls its ``on_change``."""
    records_dir: Path
    base_env: dict[str, str]
    on_start_failure: Callable[[Deployment], None] = _nothing
    """Called when a launch ends before the worker is ready (set by the router)."""
    config: ManagerConfig = field(init=False)
    ledger: Ledger = field(init=False)
    keeper: LedgerKeeper = field(init=False)
    metrics: SidecarMetrics | None = field(init=False)
    calibrator: Calibrator | None = field(init=False)

    def __post_init__(self) -> None:
        a = self.admitter
        self.config, self.ledger, self.keeper = a.config, a.ledger, a.keeper
        self.metrics, self.calibrator = a.metrics, a.calibrator

    async def run(self, d: Deployment) -> None:
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
            await self.fail(d)

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
            await self.fail(d, "unhealthy" if unhealthy else "failed")
            if not ok and not d.stopping:
                self.on_start_failure(d)
            if not await self._restart_or_fail(d):
                return

    async def _launch_once(self, d: Deployment) -> bool:
        taken = {x.port for x in self.deployments.values() if x.state not in FINISHED_STATES}
        try:
            d.port = free_port(
                self.config.worker_host, self.config.port_min, self.config.port_max, taken
            )
            spec = self._spec(d)
            started = time.monotonic()
            self.set_state(d, "launching")
            d.worker = await WorkerProcess.start(spec, self.base_env)
            # Read before anything awaits: the child cannot have been reaped yet, so the
            # pid is still the worker's (a zombie's stat keeps its start time).
            d.pid_start_ticks = process_start_ticks(d.worker.pid)
            await asyncio.to_thread(self.ledger.set_pid, d.id, d.worker.pid)
            write_record(self.records_dir, d, self.config.policy.default_vllm_version)
            self.set_state(d, "loading")
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
        sleeps = d.idle.action == "sleep"
        if sleeps and SLEEP_FLAG not in args:
            args = (*args, SLEEP_FLAG)
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
                **(DEV_MODE_ENV if sleeps else {}),
                **self.config.worker_env,
            },
        )

    async def fail(self, d: Deployment, state: State = "failed") -> None:
        """Stop the worker and release its rows; the deployment is ``failed``, or stays
        ``unhealthy`` (a worker taken out by liveness) until its restart is decided."""
        if d.worker is not None:
            await d.worker.stop(self.config.stop_grace_seconds)
        await self.keeper.write(self.ledger.release, d.id)
        d.ready_event.clear()
        self.set_state(d, state)

    async def _restart_or_fail(self, d: Deployment) -> bool:
        """``_should_restart``; an ``unhealthy`` deployment that will not be restarted
        becomes ``failed``."""
        restart = await self.should_restart(d)
        if not restart and d.state == "unhealthy":
            self.set_state(d, "failed")
        return restart

    async def should_restart(self, d: Deployment) -> bool:
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
            d.request = self.admitter.calibrated(d.request)
            decision = await self.admitter.admit(
                d.id, d.request, sleep_level=host_sleep_level(d.idle)
            )
            if self.metrics is not None:
                self.metrics.decision(decision)
            if decision.admitted:
                d.use_decision(decision)
                return True
            d.error = "restart not admitted: " + "; ".join(decision.reasons[:2])
        return False

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
        d.ready_at = d.last_used = time.time()  # idle from now on (``idle_seconds``)
        d.error = None
        self.set_state(d, "ready")
        d.ready_event.set()

    async def watch_adopted(self, d: Deployment) -> None:
        assert d.worker is not None
        if d.state == "loading" and not await self._await_adopted_loading(d):
            if d.stopping:
                return
            await self.fail(d)
            self.on_start_failure(d)
            if await self.should_restart(d):
                await self.run(d)
            return
        unhealthy = await self._watch_serving(d)
        if d.stopping:
            return
        if not unhealthy:
            d.error = "adopted worker exited"
        try:
            await self.fail(d, "unhealthy" if unhealthy else "failed")
            restart = await self._restart_or_fail(d)
        except Exception as e:
            logger.exception("deployment %s: supervisor failed", d.id)
            d.error = f"supervisor failed: {type(e).__name__}: {e}"
            await self.fail(d)
            return
        if restart:
            await self.run(d)

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
            if not d.worker.alive or d.stopping or d.state not in _WATCHED:
                return False
            if self.ledger.vanished():
                with contextlib.suppress(LedgerError):  # retried next round
                    await self.keeper.rebuild()
            healthy = await self.health(d.worker.spec.host, d.port, c.health_timeout_seconds)
            failures = 0 if healthy else failures + 1
        d.error = (
            f"worker stopped answering /health: {failures} probes in a row failed (timeout "
            f"{c.health_timeout_seconds:g} s, every {c.health_interval_seconds:g} s); stopped "
            f"and restarted per restart_policy ({c.restart_policy})"
        )
        d.ready_event.clear()
        self.set_state(d, "unhealthy")
        logger.warning("deployment %s: %s", d.id, d.error, extra=deployment_extra(d.id, d.model))
        if self.metrics is not None:
            self.metrics.worker_unhealthy(d.name)
        return True

    async def health(self, host: str, port: int, timeout: float = 5.0) -> bool:
        try:
            response = await self.client.get(f"http://{host}:{port}/health", timeout=timeout)
        except httpx.TransportError:
            return False
        return response.status_code == 200
