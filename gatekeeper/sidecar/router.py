"""The proxy's view of the deployments: which workers serve a model, launching on
demand (bounded wait) and evicting idle workers when a new model needs their room.

A request may name a deployment, a configured or allowed model, or a catalog alias
(``gemma3``, ``qwen3:0.6b``) of an allowed model, which reaches that model as if named by
its repo id; an alias of a model the config does not allow is a 404 like any unknown name.
``models()`` gives vLLM's model cards for every name a client may call: the running
deployments, the configured entries and the catalog models an ``allowed_models`` pattern
matches, each with its ``state`` and ``max_model_len`` (the worker's own, from its
``/v1/models``, or the configured or model's length when it is not running).

A model whose on-demand worker fails at start is remembered with vLLM's reason: its
deployment is stopped (no restarts), and requests naming the model are answered at once
with that reason until a back-off has passed, doubling after each failure in a row."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.metrics.worker_states import RESERVING_STATES
from gatekeeper.placement.gpu_search import search
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.proxy.resolver import Endpoint, RouteError
from gatekeeper.settings import ModelEntry
from gatekeeper.sidecar.deployment import Deployment, DeploymentError
from gatekeeper.sidecar.host_admission import host_promised_by_deployment, host_sleep_level
from gatekeeper.sidecar.ledger_view import LedgerView
from gatekeeper.sidecar.logs import deployment_extra
from gatekeeper.sidecar.manager import DeploymentManager
from gatekeeper.sidecar.registry import ModelRegistry
from gatekeeper.sidecar.rejection import rejection_text
from gatekeeper.sidecar.sleep import entry_idle, freed_bytes
from gatekeeper.vllm.sleep_mode import IdlePolicy

__all__ = ["ModelRouter"]

logger = logging.getLogger(__name__)

LIVE = RESERVING_STATES
"""A deployment with a worker on the way or serving; an ``unhealthy`` one is being
restarted, so requests wait for it (they never go to it: only ``ready`` ones serve)."""
MAX_BACKOFF_SECONDS = 3600.0
CARD_FETCH_SECONDS = 2.0
"""How long ``models()`` waits for a worker's own ``/v1/models``."""
_STATES = {
    "admitted": "loading",
    "launching": "loading",
    "loading": "loading",
    "ready": "ready",
    "sleeping": "sleeping",
    "waking": "loading",
    "unhealthy": "loading",
}


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
        self._worker_lengths: dict[str, int | None] = {}
        """max_model_len per deployment id, from the worker's own /v1/models."""
        self._entry_lengths: dict[str, int | None] = {}
        self.clock: Callable[[], float] = time.monotonic
        manager.on_start_failure = self._start_failed
        manager.sleeper.idle_eviction = config.idle_eviction

    def _endpoint(self, d: Deployment) -> Endpoint:
        host = self.manager.config.worker_host
        return Endpoint(worker_id=d.id, base_url=f"http://{host}:{d.port}", served_name=d.name)

    def _known(self, model: str) -> bool:
        """Deployed, configured or allowed (a catalog alias is none of these)."""
        return self.registry.entry(model) is not None or bool(self.manager.by_name(model))

    def canonical(self, model: str) -> str:
        """The allowed model a catalog alias stands for; a known name stays itself."""
        if self._known(model):
            return model
        return self.registry.alias(model) or model

    def ready(self, model: str) -> list[Endpoint] | None:
        # The usual case: a model with a ready worker is known, and served at once.
        ready = [d for d in self.manager.by_name(model) if d.state == "ready"]
        return self._serving(model, ready) if ready else None

    async def endpoints(self, model: str) -> list[Endpoint]:
        return self.ready(model) or self._serving(*await self._ready(model))

    def _serving(self, model: str, ready: list[Deployment]) -> list[Endpoint]:
        self._failures.pop(model, None)
        now = time.time()
        for d in ready:
            d.last_used = now
        return [self._endpoint(d) for d in ready]

    async def _ready(self, model: str) -> tuple[str, list[Deployment]]:
        """For a name with no ready worker: the model it stands for (an alias's) and its
        ready workers, once launched or loaded (bounded waits); or the ``RouteError``."""
        if not self._known(model):
            model = self.registry.alias(model) or model
            if not self._known(model):
                raise RouteError(
                    404,
                    f"The model `{model}` does not exist. GET /v1/models lists the models "
                    "this node serves or may launch.",
                    type="NotFoundError",
                    code="model_not_found",
                )
        live = [d for d in self.manager.by_name(model) if d.state in LIVE]
        if not live:
            self._refuse_if_failed(model)
            await self._launch(model)
            live = [d for d in self.manager.by_name(model) if d.state in LIVE]
        ready = [d for d in live if d.state == "ready"]
        asleep = [d for d in live if d.state == "sleeping"]
        if not ready and asleep:
            await self._wake(asleep[0])
            ready = [d for d in live if d.state == "ready"]
        if not ready:
            ready = await self._wait_ready(model, live)
        return model, ready

    async def _wake(self, d: Deployment) -> None:
        """Wake a sleeping worker; no room for it (or a failed wake) is a 503."""
        try:
            await self.manager.wake(d)
        except DeploymentError as e:
            raise RouteError(
                e.status,
                str(e),
                type="ServiceUnavailableError",
                code="model_asleep",
                retry_after=e.retry_after,
            ) from e

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
            f"The model `{model}` is loading (waited {self.config.request_wait_seconds:.0f} s); "
            "retry after the Retry-After seconds.",
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
                    f"The model `{model}` is allowed but not running, and on-demand launch "
                    "is off (on_demand = false); deploy it first (POST /admin/deployments).",
                    type="ServiceUnavailableError",
                    code="model_not_running",
                    should_retry=False,
                )
            decision = await self._deploy(model)
            if decision is not None and not decision.admitted:
                raise RouteError(
                    507,
                    rejection_text(model, decision, self._served_as(model)),
                    type="Insufficient Storage",
                    code="model_does_not_fit",
                )

    async def _deploy(self, model: str) -> Decision | None:
        """``model`` deployed, after evicting idle workers for it when it does not fit
        (``idle_eviction``); None when it was deployed meanwhile (409: route to it)."""
        try:
            entry = self.registry.allowed(model)
            request = self.registry.request(entry)
            idle = entry_idle(entry, self.manager.config.idle)
            decision, d = await self.manager.deploy(entry.name, request, idle=idle)
            if not decision.admitted and await self.evict_for(request, idle):
                decision, d = await self.manager.deploy(entry.name, request, idle=idle)
            if d is not None:
                self._on_demand.add(d.id)
        except DeploymentError as e:
            if e.status == 409:  # deployed meanwhile (admin API): route to it
                return None
            raise RouteError(e.status, str(e), type="ServiceUnavailableError", retry_after=5) from e
        except GatekeeperError as e:
            raise RouteError(400, str(e), type="BadRequestError", code="bad_model") from e
        return decision

    def _served_as(self, model: str) -> list[str]:
        """The other names this node configures or runs ``model`` (a repo id) under."""
        names = {e.name for e in self.registry.entries if e.model == model and e.name != model}
        names |= {
            d.name
            for d in self.manager.deployments.values()
            if d.model == model and d.name != model and d.state in LIVE
        }
        return sorted(names)

    async def evict_for(self, request: PlacementRequest, idle: IdlePolicy) -> bool:
        """Make room for ``request`` (a worker with idle policy ``idle``), refused as it
        stands: put to sleep or stop (by each one's idle policy) the least recently used
        idle workers whose GPU memory would make it fit (``Sleeper.candidates``), and stop
        (never put to sleep: a sleeping worker's promise keeps its host bytes) the least
        recently used sleeping or idle ones whose host promises cover what the host is
        short of. Nothing is given up unless both would then fit: a give-up that cannot
        admit the request is not made. True when any was."""
        sleeper = self.manager.sleeper
        awake, asleep = sleeper.candidates(None), sleeper.asleep()
        if not awake and not asleep:
            return False
        snapshot = await self.manager.snapshot()
        live = await asyncio.to_thread(self.manager.ledger.live)
        reserved = LedgerView.of(live).promised
        usable = await self.manager.host_usable_bytes(live)
        host_held = host_promised_by_deployment(live)
        policy = self.manager.config.policy
        for k in range(len(awake) + 1):
            for_gpus = awake[:k]
            found = search(
                request,
                _freed(snapshot, for_gpus),
                reserved=reserved,
                policy=policy,
                cache=self.manager.estimates,
            )
            if found.placement is None:
                continue
            if usable is None:
                return False  # the host cannot be read: admission refuses, whatever is freed
            need = found.placement.estimate.host.at_sleep_level(host_sleep_level(idle))
            short = need.host_bytes - usable
            short -= sum(host_held.get(d.id, 0) for d in for_gpus if d.idle.action == "stop")
            for_host = []
            others = sorted([*asleep, *awake[k:]], key=lambda d: d.last_used)
            for d in others:
                if short <= 0:
                    break
                if host_held.get(d.id, 0) > 0:
                    for_host.append(d)
                    short -= host_held[d.id]
            if short > 0 or not (for_gpus or for_host):
                return False
            for d in for_gpus:
                await sleeper.give_up(d, "its room is needed")
            for d in for_host:
                logger.info(
                    "deployment %s: stopped for the host memory %s needs",
                    d.id,
                    request.model.name,
                    extra=deployment_extra(d.id, d.model),
                )
                await self.manager.undeploy(d.id)
            return True
        return False

    async def models(self) -> list[dict[str, Any]]:
        rank = {"ready": 0, "sleeping": 1, "loading": 2, "failed": 3}
        shown: dict[str, tuple[str, Deployment]] = {}  # the best state per name
        for d in list(self.manager.deployments.values()):
            if d.state in LIVE or d.state == "failed":
                state = _STATES.get(d.state, "failed")
                if d.name not in shown or rank[state] < rank[shown[d.name][0]]:
                    shown[d.name] = (state, d)
        deployed = list(shown.values())
        lengths = await asyncio.gather(*(self._worker_length(d) for _, d in deployed))
        cards: dict[str, dict[str, Any]] = {}
        for (state, d), length in zip(deployed, lengths, strict=True):
            cards[d.name] = _card(d.name, d.model, state, length) | {"created": int(d.created_at)}
        listed = [e for e in self.registry.listed() if e.name not in cards]
        unresolved = [e for e in listed if e.name not in self._entry_lengths]
        if unresolved:  # one thread hop for all of them, not one each
            self._entry_lengths.update(await asyncio.to_thread(self._entry_lengths_of, unresolved))
        for entry in listed:
            state = "failed" if entry.name in self._failures else "not running"
            cards[entry.name] = _card(
                entry.name, entry.model, state, self._entry_lengths[entry.name]
            )
        return list(cards.values())

    async def _worker_length(self, d: Deployment) -> int | None:
        """The worker's own max_model_len (its /v1/models), else the admission's."""
        if d.id in self._worker_lengths:
            return self._worker_lengths[d.id]
        placement = d.decision.placement if d.decision is not None else None
        admitted = placement.estimate.max_model_len if placement is not None else None
        if d.state != "ready":
            return admitted
        url = f"{self._endpoint(d).base_url}/v1/models"
        try:
            answer = await self.manager.client.get(url, timeout=CARD_FETCH_SECONDS)
            served = [c for c in answer.json()["data"] if c.get("id") == d.name]
            length = served[0]["max_model_len"] if served else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return admitted
        self._worker_lengths[d.id] = length if isinstance(length, int) else admitted
        return self._worker_lengths[d.id]

    def _entry_lengths_of(self, entries: list[ModelEntry]) -> dict[str, int | None]:
        """The max_model_len a launch of each would get: the entry's option, else the
        model's (None when the model cannot be resolved). Blocking: run in a thread."""
        lengths: dict[str, int | None] = {}
        for entry in entries:
            try:
                request = self.registry.request(entry)
                length = request.options.max_model_len or request.model.default_max_model_len
            except GatekeeperError:
                length = None
            lengths[entry.name] = length
        return lengths

    def report(self, endpoint: Endpoint, outcome: str) -> None:
        d = self.manager.deployments.get(endpoint.worker_id)
        if d is not None:
            d.last_used = time.time()


def _freed(snapshot: InventorySnapshot, victims: list[Deployment]) -> InventorySnapshot:
    """The snapshot as it would be with the victims' workers stopped."""
    freed: dict[int, int] = {}
    for d in victims:
        for index, gives in zip(d.gpu_indices, freed_bytes(d), strict=False):
            freed[index] = freed.get(index, 0) + gives
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


def _card(name: str, model: str, state: str, max_model_len: int | None) -> dict[str, Any]:
    """vLLM's ``ModelCard`` fields, and gatekeeper's ``state``."""
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "gatekeeper",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [],
        "state": state,
    }
