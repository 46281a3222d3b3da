"""The proxy's view of the deployments: which workers serve a model, launching on
demand (bounded wait) and evicting idle workers when a new model needs their room.

A model whose on-demand worker fails at start is remembered with vLLM's reason: its
deployment is stopped (no restarts), and requests naming the model are answered at once
with that reason until a back-off has passed, doubling after each failure in a row."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.placement.search import search
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.proxy.serving import Endpoint, RouteError
from gatekeeper.sidecar.deployment import Deployment, DeploymentError
from gatekeeper.sidecar.ledger import promised_bytes
from gatekeeper.sidecar.manager import DeploymentManager
from gatekeeper.sidecar.registry import ModelRegistry

__all__ = ["ModelRouter"]

LIVE = ("admitted", "launching", "loading", "ready")
MAX_BACKOFF_SECONDS = 3600.0


@dataclasses.dataclass(slots=True)
class RouterConfig:
    on_demand: bool
    request_wait_seconds: float
    idle_eviction: bool
    idle_seconds: float
    start_failure_backoff_seconds: float = 30.0


@dataclasses.dataclass(slots=True)
class StartFailure:
    """A model's last failures at start: vLLM's reason and when to try again."""

    reason: str
    failures: int
    retry_at: float
    """On the router's clock (monotonic seconds)."""


class ModelRouter:
    """Implements the proxy's ``Resolver`` on top of the ``DeploymentManager``."""

    def __init__(
        self, manager: DeploymentManager, registry: ModelRegistry, config: RouterConfig
    ) -> None:
        self.manager = manager
        self.registry = registry
        self.config = config
        self._launching: dict[str, asyncio.Lock] = {}
        self._failures: dict[str, StartFailure] = {}
        self._failed: dict[str, asyncio.Event] = {}
        """Set when a launch of the model fails at start, to wake its waiting requests."""
        self._on_demand: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.clock: Callable[[], float] = time.monotonic
        manager.on_start_failure = self._start_failed

    def _endpoint(self, d: Deployment) -> Endpoint:
        host = self.manager.config.worker_host
        return Endpoint(worker_id=d.id, base_url=f"http://{host}:{d.port}", served_name=d.name)

    async def endpoints(self, model: str) -> list[Endpoint]:
        if self.registry.entry(model) is None and not self.manager.by_name(model):
            raise RouteError(
                404,
                f"The model `{model}` does not exist.",
                type="NotFoundError",
                code="model_not_found",
            )
        live = [d for d in self.manager.by_name(model) if d.state in LIVE]
        if not live:
            self._refuse_if_failed(model)
            await self._launch(model)
            live = [d for d in self.manager.by_name(model) if d.state in LIVE]
        ready = [d for d in live if d.state == "ready"]
        if not ready:
            ready = await self._wait_ready(model, live)
        self._failures.pop(model, None)
        now = time.time()
        for d in ready:
            d.last_used = now
        return [self._endpoint(d) for d in ready]

    def _start_failed(self, d: Deployment) -> None:
        """The manager's hook: remember why ``d`` failed at start, stop an on-demand one."""
        startup = d.worker.startup() if d.worker is not None else None
        reason = (startup.failure if startup is not None else None) or (
            (d.error or "unknown").splitlines()[0]
        )
        last = self._failures.get(d.name)
        failures = 1 if last is None else last.failures + 1
        base = self.config.start_failure_backoff_seconds
        backoff = min(base * 2 ** (failures - 1), max(base, MAX_BACKOFF_SECONDS))
        self._failures[d.name] = StartFailure(reason, failures, self.clock() + backoff)
        self._failed.pop(d.name, asyncio.Event()).set()
        if d.id in self._on_demand:
            self._on_demand.discard(d.id)
            task = asyncio.get_running_loop().create_task(self.manager.undeploy(d.id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refuse_if_failed(self, model: str) -> None:
        failure = self._failures.get(model)
        if failure is None:
            return
        left = failure.retry_at - self.clock()
        if left > 0:
            raise _start_failure_error(model, failure, left)

    async def _wait_ready(self, model: str, live: list[Deployment]) -> list[Deployment]:
        failed_at_start = self._failed.setdefault(model, asyncio.Event())
        waits = [asyncio.ensure_future(d.ready_event.wait()) for d in live]
        waits.append(asyncio.ensure_future(failed_at_start.wait()))
        try:
            await asyncio.wait(
                waits, timeout=self.config.request_wait_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for w in waits:
                w.cancel()
        ready = [d for d in live if d.state == "ready"]
        if ready:
            return ready
        failure = self._failures.get(model)
        if failed_at_start.is_set() and failure is not None:
            raise _start_failure_error(model, failure, failure.retry_at - self.clock())
        failed = [d for d in live if d.state == "failed"]
        if failed and len(failed) == len(live):
            raise RouteError(
                503,
                f"The model `{model}` failed to start: {failed[0].error}",
                type="ServiceUnavailableError",
                code="worker_failed",
                retry_after=30,
            )
        raise RouteError(
            503,
            f"The model `{model}` is loading; retry shortly.",
            type="ServiceUnavailableError",
            code="model_loading",
            retry_after=5,
        )

    async def _launch(self, model: str) -> None:
        lock = self._launching.setdefault(model, asyncio.Lock())
        async with lock:
            if any(d.state in LIVE for d in self.manager.by_name(model)):
                return
            if not self.config.on_demand:
                raise RouteError(
                    503,
                    f"The model `{model}` is allowed but not running, and on-demand launch is off; deploy it first.",
                    type="ServiceUnavailableError",
                    code="model_not_running",
                    retry_after=60,
                )
            try:
                entry = self.registry.allowed(model)
                request = self.registry.request(entry)
                decision, d = await self.manager.deploy(entry.name, request)
                if (
                    not decision.admitted
                    and self.config.idle_eviction
                    and await self.evict_for(request)
                ):
                    decision, d = await self.manager.deploy(entry.name, request)
                if d is not None:
                    self._on_demand.add(d.id)
            except DeploymentError as e:
                if e.status == 409:  # deployed meanwhile (admin API): route to it
                    return
                raise RouteError(
                    e.status, str(e), type="ServiceUnavailableError", retry_after=5
                ) from e
            except GatekeeperError as e:
                raise RouteError(400, str(e), type="BadRequestError") from e
            if not decision.admitted:
                raise RouteError(
                    507,
                    _rejection_text(model, decision),
                    type="InsufficientCapacityError",
                    code="model_does_not_fit",
                )

    async def evict_for(self, request: PlacementRequest) -> bool:
        """Stop the least recently used idle workers whose memory would make ``request`` fit."""
        now = time.time()
        idle = sorted(
            (
                d
                for d in self.manager.deployments.values()
                if d.state == "ready"
                and self.manager.in_flight(d.id) == 0
                and now - d.last_used >= self.config.idle_seconds
            ),
            key=lambda d: d.last_used,
        )
        if not idle:
            return False
        snapshot = await self.manager.snapshot()
        reserved = promised_bytes(await asyncio.to_thread(self.manager.ledger.outstanding))
        policy = self.manager.config.policy
        for k in range(1, len(idle) + 1):
            victims = idle[:k]
            freed = _freed(snapshot, victims)
            found = search(
                request, freed, reserved=reserved, policy=policy, cache=self.manager.estimates
            )
            if found.placement is not None:
                for d in victims:
                    await self.manager.undeploy(d.id)
                return True
        return False

    def models(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for d in self.manager.deployments.values():
            if d.state in LIVE:
                seen[d.name] = {
                    "id": d.name,
                    "object": "model",
                    "created": int(d.created_at),
                    "owned_by": "gatekeeper",
                    "status": d.state,
                    "root": d.model,
                }
        for e in self.registry.entries:
            seen.setdefault(
                e.name,
                {
                    "id": e.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "gatekeeper",
                    "status": "not running",
                    "root": e.model,
                },
            )
        return list(seen.values())

    def report(self, endpoint: Endpoint, outcome: str) -> None:
        d = self.manager.deployments.get(endpoint.worker_id)
        if d is not None:
            d.last_used = time.time()


def _freed(snapshot: InventorySnapshot, victims: list[Deployment]) -> InventorySnapshot:
    """The snapshot as it would be with the victims' workers stopped."""
    freed: dict[int, int] = {}
    for d in victims:
        for index, promise in zip(d.gpu_indices, d.promise_bytes, strict=False):
            freed[index] = freed.get(index, 0) + promise
    gpus = tuple(
        dataclasses.replace(
            g, free_bytes=min(g.visible_total_bytes, g.free_bytes + freed.get(g.index, 0))
        )
        for g in snapshot.gpus
    )
    return dataclasses.replace(snapshot, gpus=gpus)


def _start_failure_error(model: str, failure: StartFailure, left_seconds: float) -> RouteError:
    left = max(1.0, left_seconds)
    return RouteError(
        503,
        f"The model `{model}` failed to start ({failure.failures} time(s) in a row): "
        f"{failure.reason}. No new launch for {left:.0f} s; fix the cause (see the worker's "
        "log), or deploy it through the admin API.",
        type="ServiceUnavailableError",
        code="worker_failed",
        retry_after=left,
    )


def _rejection_text(model: str, decision: Decision) -> str:
    lines = [f"The model `{model}` does not fit on this node now."]
    lines += list(decision.reasons[:4])
    lines += [f"Would fit: {s.text}" for s in decision.suggestions[:3]]
    return " ".join(lines)
