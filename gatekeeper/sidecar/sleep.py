"""Idle workers put to sleep instead of stopped, and woken by the next request.

A deployment whose idle policy is ``sleep`` (``idle_action``; launched with vLLM's
``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``: ``gatekeeper.vllm.sleep_mode``)
goes ``ready -> sleeping`` once it has had no request for ``idle_seconds`` (the
``Sleeper``'s idle loop), or at once when its room is needed (``make_room``):

- **sleep**: no traffic goes to it from then on; ``POST /sleep?level=N&mode=wait``
  (requests that slipped in finish first); then its ledger rows keep only what vLLM keeps
  asleep (``Deployment.kept_asleep``: the promise less the weights and KV cache). The
  worker sleeps before the ledger is written, so a crash in between leaves the larger
  figure, and the next sidecar's adoption writes the smaller one (``adopt``).
- **wake** (a request names it; one wake at a time per deployment, the requests wait):
  admission checks, in one ledger transaction (``Ledger.wake``), that each of its GPUs
  has room for the bytes it takes back (NVML free less the outstanding promises and the
  margin); if not, other idle workers on those GPUs are put to sleep, or stopped by
  their policy (``idle_eviction``), never one with requests in flight, and the check is
  made once more; still short, the request gets 503 with Retry-After. Admitted, its rows
  are pending at its awake size, ``POST /wake_up`` is called (bounded by
  ``wake_timeout_seconds``), and once awake the rows are ready and traffic resumes. A
  wake that fails or hangs stops the worker: its supervisor restarts it per
  ``restart_policy``, and the waiting requests are answered by the restarted worker or
  with 503.
- **adopt**: a worker an earlier sidecar left asleep answers ``GET /is_sleeping`` true;
  it is listed ``sleeping`` and its rows shrunk (``adopt``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.metrics.sleep import SleepMetrics
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.settings import ModelEntry
from gatekeeper.sidecar.deployment import Deployment, DeploymentError, ManagerConfig, State
from gatekeeper.sidecar.ledger import Ledger, Promise, Reservation
from gatekeeper.sidecar.ledger_keeper import LedgerKeeper
from gatekeeper.sidecar.ledger_view import promised_bytes
from gatekeeper.sidecar.logs import deployment_extra
from gatekeeper.units import format_gib
from gatekeeper.vllm.sleep_mode import IdlePolicy

__all__ = ["SleepError", "Sleeper", "entry_idle", "freed_bytes", "wake_shortfall"]

logger = logging.getLogger(__name__)

SLEEP_SECONDS = 60.0
"""How long ``/sleep`` may take (it waits for requests in flight, then unmaps memory)."""
WAKE_RETRY_AFTER_SECONDS = 5.0


def entry_idle(entry: ModelEntry, default: IdlePolicy) -> IdlePolicy:
    """A ``[[models]]`` entry's idle policy: its own fields, else the global ones."""
    return IdlePolicy(
        entry.idle_action or default.action,
        entry.sleep_level if entry.sleep_level is not None else default.sleep_level,
    )


class SleepError(Exception):
    """A worker's ``/sleep``, ``/wake_up`` or ``/is_sleeping`` failed."""


def wake_shortfall(
    d: Deployment,
    snapshot: InventorySnapshot,
    outstanding: tuple[Reservation, ...],
    policy: PlacementPolicy,
) -> dict[int, int]:
    """Bytes missing per GPU index for ``d`` to wake (empty when it fits): on each of its
    GPUs, what it takes back (awake less kept) against NVML free less the outstanding
    promises and the margin."""
    promised = promised_bytes(outstanding)
    gpus = {g.uuid: g for g in snapshot.gpus}
    short: dict[int, int] = {}
    for index, uuid, full, kept in zip(
        d.gpu_indices, d.gpu_uuids, d.promise_bytes, d.kept_asleep(), strict=False
    ):
        gpu = gpus.get(uuid)
        if gpu is None or not gpu.placeable:
            short[index] = full - kept
            continue
        usable = gpu.free_bytes - promised.get(uuid, 0) - policy.margin_for(gpu.visible_total_bytes)
        if usable < full - kept:
            short[index] = full - kept - usable
    return short


@dataclass(eq=False)
class Sleeper:
    """Puts a manager's idle ``sleep`` deployments to sleep and wakes them."""

    config: ManagerConfig
    ledger: Ledger
    keeper: LedgerKeeper
    client: httpx.AsyncClient
    deployments: dict[str, Deployment]
    set_state: Callable[[Deployment, State], None]
    snapshot: Callable[[], Awaitable[InventorySnapshot]]
    in_flight: Callable[[str], int]
    undeploy: Callable[[str], Awaitable[Deployment]]
    metrics: SleepMetrics | None = None
    idle_eviction: bool = False
    """Whether idle ``stop`` workers may be stopped to make room for a wake."""
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    _loop: asyncio.Task[None] | None = None

    # -- the worker's sleep API ---------------------------------------------------------

    def _url(self, d: Deployment, path: str) -> str:
        return f"http://{self.config.worker_host}:{d.port}{path}"

    async def _call(
        self, d: Deployment, method: str, path: str, timeout: float, **params: Any
    ) -> dict[str, Any]:
        try:
            r = await self.client.request(
                method, self._url(d, path), params=params or None, timeout=timeout
            )
        except httpx.HTTPError as e:
            raise SleepError(f"{method} {path}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise SleepError(f"{method} {path} answered {r.status_code}: {r.text[:300]}")
        try:
            answer = r.json()
        except ValueError as e:
            raise SleepError(f"{method} {path} answered no JSON: {r.text[:300]}") from e
        if not isinstance(answer, dict):
            raise SleepError(f"{method} {path} answered {answer!r}, not an object")
        return answer

    async def is_sleeping(self, d: Deployment) -> bool:
        answer = await self._call(d, "GET", "/is_sleeping", self.config.health_timeout_seconds)
        return answer.get("is_sleeping") is True

    # -- sleep --------------------------------------------------------------------------

    def idle(self, d: Deployment, now: float) -> bool:
        """Ready, sleep policy, nothing in flight, unused for ``idle_seconds``."""
        return (
            d.idle.action == "sleep"
            and d.state == "ready"
            and not d.stopping
            and self.in_flight(d.id) == 0
            and now - d.last_used >= self.config.idle_seconds
        )

    async def sleep(self, d: Deployment, why: str = "idle") -> bool:
        """Put a ready, unused worker to sleep; False (it stays ready) when it was busy or
        ``/sleep`` failed."""
        if d.state != "ready" or d.stopping or self.in_flight(d.id) or d.worker is None:
            return False
        d.ready_event.clear()
        self.set_state(d, "sleeping")
        level = d.idle.sleep_level
        try:
            await self._call(d, "POST", "/sleep", SLEEP_SECONDS, level=level, mode="wait")
        except SleepError as e:
            if self.metrics is not None:
                self.metrics.failed("sleep", d.name)
            d.error = f"sleep failed (kept awake): {e}"
            logger.warning(
                "deployment %s: %s", d.id, d.error, extra=deployment_extra(d.id, d.model)
            )
            if not d.stopping and d.worker.alive:  # else its supervisor has it
                self.set_state(d, "ready")
                d.ready_event.set()
            return False
        await self._shrink(d)
        if self.metrics is not None:
            self.metrics.slept(d.name)
        logger.info(
            "deployment %s: asleep at level %d (%s); keeps %s of GPU memory",
            d.id,
            level,
            why,
            format_gib(d.gpu_bytes()),
            extra=deployment_extra(d.id, d.model),
        )
        return True

    async def _shrink(self, d: Deployment) -> None:
        kept = dict(zip(d.gpu_uuids, d.kept_asleep(), strict=False))
        await self.keeper.write(lambda i: self.ledger.asleep(i, kept), d.id)

    async def adopt(self, d: Deployment) -> None:
        """An adopted ``sleep`` worker that is asleep: listed ``sleeping``, its rows shrunk
        (its earlier sidecar may have ended between the sleep and the ledger's write)."""
        try:
            asleep = await self.is_sleeping(d)
        except SleepError as e:
            logger.warning("deployment %s: /is_sleeping: %s", d.id, e)
            return
        if asleep and d.state == "ready":
            d.ready_event.clear()
            self.set_state(d, "sleeping")
            await self._shrink(d)

    # -- wake ---------------------------------------------------------------------------

    async def wake(self, d: Deployment) -> None:
        """Wake a sleeping worker (one wake at a time; the others wait for it). Raises
        ``DeploymentError`` (503, Retry-After) when its bytes cannot be found or the wake
        fails."""
        async with self._locks.setdefault(d.id, asyncio.Lock()):
            if d.state != "sleeping":
                return
            started = time.monotonic()
            short = await self._admit_wake(d)
            if short:
                await self.make_room(short, exclude=d.id)
                short = await self._admit_wake(d)
            if short:
                raise self._no_room(d, short)
            self.set_state(d, "waking")
            try:
                answer = await self._call(d, "POST", "/wake_up", self.config.wake_timeout_seconds)
                if answer.get("status") != "awake":
                    raise SleepError(f"/wake_up answered {answer}")
            except SleepError as e:
                await self._wake_failed(d, e)
            await self.keeper.write(self.ledger.mark_ready, d.id)
            d.last_used = time.time()
            self.set_state(d, "ready")
            d.ready_event.set()
            if self.metrics is not None:
                self.metrics.woke(d.name, time.monotonic() - started)

    async def _admit_wake(self, d: Deployment) -> dict[int, int]:
        """The wake's admission: empty when its rows are pending at its awake size."""
        snapshot = await self.snapshot()
        policy = self.config.policy

        def decide(
            outstanding: tuple[Reservation, ...],
        ) -> tuple[dict[int, int], tuple[Promise, ...]]:
            short = wake_shortfall(d, snapshot, outstanding, policy)
            if short:
                return short, ()
            return {}, tuple(
                Promise(u, b) for u, b in zip(d.gpu_uuids, d.promise_bytes, strict=False)
            )

        ttl = self.config.wake_timeout_seconds + 60
        return await asyncio.to_thread(self.ledger.wake, d.id, decide, ttl_seconds=ttl)

    def _no_room(self, d: Deployment, short: Mapping[int, int]) -> DeploymentError:
        missing = ", ".join(f"GPU {i}: {format_gib(b)}" for i, b in sorted(short.items()))
        return DeploymentError(
            f"model {d.name!r} is asleep and cannot wake: its GPUs lack {missing} (in use by "
            "workers with requests in flight or not idle). Retry after the Retry-After "
            "seconds, or stop a model (gatekeeper undeploy ID).",
            status=503,
            field="model",
            value=d.name,
            retry_after=WAKE_RETRY_AFTER_SECONDS,
        )

    async def _wake_failed(self, d: Deployment, e: SleepError) -> None:
        if self.metrics is not None:
            self.metrics.failed("wake", d.name)
        d.error = (
            f"wake failed: {e}; the worker is stopped and restarted per restart_policy "
            f"({self.config.restart_policy})"
        )
        logger.warning("deployment %s: %s", d.id, d.error, extra=deployment_extra(d.id, d.model))
        if d.worker is not None:
            # Its supervisor sees the exit, releases its rows and restarts it.
            await d.worker.stop(self.config.stop_grace_seconds)
        raise DeploymentError(
            f"model {d.name!r} failed to wake ({e}); it is being restarted. Retry after the "
            "Retry-After seconds.",
            status=503,
            field="model",
            value=d.name,
            retry_after=WAKE_RETRY_AFTER_SECONDS,
        ) from e

    # -- room for others ----------------------------------------------------------------

    def candidates(self, gpus: set[int] | None, exclude: str | None = None) -> list[Deployment]:
        """Ready workers that may give up their room, least recently used first: ``sleep``
        ones with nothing in flight, and ``stop`` ones idle for ``idle_seconds`` when
        ``idle_eviction`` is on; on ``gpus`` (all when None)."""
        now = time.time()
        out = []
        for d in self.deployments.values():
            if d.id == exclude or d.state != "ready" or d.stopping or self.in_flight(d.id):
                continue
            if gpus is not None and not gpus & set(d.gpu_indices):
                continue
            if d.idle.action == "sleep" or (
                self.idle_eviction and now - d.last_used >= self.config.idle_seconds
            ):
                out.append(d)
        return sorted(out, key=lambda d: d.last_used)

    def asleep(self) -> list[Deployment]:
        """Sleeping workers with nothing in flight, least recently used first: stopping one
        frees the host memory its promise holds (its weights, at level 1)."""
        out = [
            d
            for d in self.deployments.values()
            if d.state == "sleeping" and not d.stopping and not self.in_flight(d.id)
        ]
        return sorted(out, key=lambda d: d.last_used)

    async def give_up(self, d: Deployment, why: str) -> bool:
        """Free ``d``'s room by its policy: asleep, or stopped."""
        if d.idle.action == "sleep":
            return await self.sleep(d, why)
        await self.undeploy(d.id)
        return True

    async def make_room(self, short: Mapping[int, int], exclude: str | None = None) -> bool:
        """Put to sleep or stop idle workers on the GPUs in ``short`` until the bytes each
        gives up cover what is missing there; True when any gave up its room."""
        left = dict(short)
        freed_any = False
        for d in self.candidates(set(left), exclude):
            if all(b <= 0 for b in left.values()):
                break
            if not any(left.get(i, 0) > 0 for i in d.gpu_indices):
                continue
            gives = freed_bytes(d)
            if await self.give_up(d, "its room is needed"):
                freed_any = True
                for i, b in zip(d.gpu_indices, gives, strict=False):
                    if i in left:
                        left[i] -= b
        return freed_any

    # -- the idle loop ------------------------------------------------------------------

    def start(self) -> None:
        """Run the idle loop (once) on the running event loop."""
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_running_loop().create_task(self._idle_loop())

    async def close(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None

    async def _idle_loop(self) -> None:
        interval = min(5.0, max(0.05, self.config.idle_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.time()
            for d in [x for x in self.deployments.values() if self.idle(x, now)]:
                try:
                    await self.sleep(d)
                except Exception:  # the loop must outlive one deployment's trouble
                    logger.exception("deployment %s: putting it to sleep failed", d.id)


def freed_bytes(d: Deployment) -> tuple[int, ...]:
    """GPU bytes per GPU ``d`` gives up when it sleeps (awake less kept) or stops."""
    if d.idle.action == "sleep":
        return tuple(b - k for b, k in zip(d.promise_bytes, d.kept_asleep(), strict=False))
    return d.promise_bytes
