"""The sidecar: ``build_app(settings, inventory, ledger, …) -> Starlette``.

Dependencies come in as arguments (the GPU inventory, the ledger, the base environment
of workers, how a model reference becomes a ``ModelSpec``); nothing reads globals. The
app serves the OpenAI-compatible proxy (``/v1/…``), the admin API (``/admin/…``),
``/healthz`` and ``/openapi.json``. On start it adopts the workers an earlier sidecar
left running and launches the models marked ``preload``; on stop it leaves workers
running to be adopted (or stops them, by setting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gatekeeper._version import __version__
from gatekeeper.gpus.host_memory import ProcHostMemory
from gatekeeper.gpus.inventory import GpuInventory
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.metrics.events import SidecarMetrics
from gatekeeper.metrics.exposition import metrics_endpoint
from gatekeeper.metrics.wiring import MetricSources, register_collectors
from gatekeeper.models.spec import ModelSpec
from gatekeeper.proxy.protocol import error_response
from gatekeeper.proxy.serving import Proxy
from gatekeeper.proxy.upstream import upstream_client
from gatekeeper.settings import ModelEntry, Settings, model_resolver, placement_policy
from gatekeeper.sidecar.admin_api import AdminApi, DeployBody
from gatekeeper.sidecar.calibrator import Calibrator
from gatekeeper.sidecar.deployment import ManagerConfig, worker_view
from gatekeeper.sidecar.discovery import advertised_host, worker_targets
from gatekeeper.sidecar.host_admission import host_reserved_bytes, host_views
from gatekeeper.sidecar.http_guard import HttpGuard
from gatekeeper.sidecar.ledger import Ledger
from gatekeeper.sidecar.manager import DeploymentManager
from gatekeeper.sidecar.openapi import openapi_schema
from gatekeeper.sidecar.registry import ModelRegistry
from gatekeeper.sidecar.rehearsal import RehearsalInventory, is_simulator
from gatekeeper.sidecar.router import ModelRouter, RouterConfig
from gatekeeper.sidecar.sleep import entry_idle
from gatekeeper.vllm.sleep_mode import IdlePolicy

__all__ = ["RELEASED_KEEP_SECONDS", "build_app", "manager_config"]

logger = logging.getLogger(__name__)

RELEASED_KEEP_SECONDS = 7 * 24 * 3600.0
"""Released reservations are kept a week (for inspection), then pruned at start-up."""


def manager_config(settings: Settings) -> ManagerConfig:
    return ManagerConfig(
        state_dir=settings.state_dir.expanduser(),
        worker_command=tuple(settings.worker_command),
        worker_env=dict(settings.worker_env),
        worker_host=settings.worker_host,
        port_min=settings.worker_port_min,
        port_max=settings.worker_port_max,
        idle=IdlePolicy(settings.idle_action, settings.sleep_level),
        idle_seconds=settings.idle_seconds,
        wake_timeout_seconds=settings.wake_timeout_seconds,
        startup_timeout_seconds=settings.startup_timeout_seconds,
        stop_grace_seconds=settings.stop_grace_seconds,
        drain_seconds=settings.drain_seconds,
        restart_policy=settings.restart_policy,
        restart_limit=settings.restart_limit,
        restart_backoff_seconds=settings.restart_backoff_seconds,
        policy=placement_policy(settings),
        rehearsal=is_simulator(settings.worker_command),
        admission_timeout_seconds=settings.admission_timeout_seconds,
        health_interval_seconds=settings.health_interval_seconds,
        health_timeout_seconds=settings.health_timeout_seconds,
        health_failures=settings.health_failures,
        host_memory_root=settings.host_memory_root,
        host_margin_bytes=settings.host_margin_bytes,
    )


def build_app(
    settings: Settings,
    inventory: GpuInventory,
    ledger: Ledger,
    *,
    rehearsal: bool = False,
    base_env: Mapping[str, str] | None = None,
    resolve_spec: Callable[[str], ModelSpec] | None = None,
    client: httpx.AsyncClient | None = None,
    warm_model_cards: bool = True,
    deploy_body: type[DeployBody] = DeployBody,
) -> Starlette:
    """The sidecar's ASGI app, wired from its dependencies. ``warm_model_cards``: resolve
    the listed models' cards in the background at start (tests that start many sidecars
    and never list models turn it off). ``deploy_body``: the admin API's deploy body, a
    model that extends ``DeployBody`` to take more fields (kept with the deployment)."""
    client = client or httpx.AsyncClient(timeout=httpx.Timeout(10.0), trust_env=False)
    """For the sidecar's own calls (worker health); the proxy has its own pool."""
    upstream = upstream_client()
    resolve = resolve_spec or model_resolver(settings)
    if rehearsal:
        inventory = RehearsalInventory(inventory, lambda: _held(ledger))
    parts = _wire(settings, inventory, ledger, client, upstream, base_env, resolve, deploy_body)
    lifespan = _lifespan(
        settings, ledger, parts, (client, upstream), warm_model_cards=warm_model_cards
    )
    app = Starlette(
        routes=_routes(settings, parts, resolve, rehearsal=rehearsal, deploy_body=deploy_body),
        lifespan=lifespan,
        exception_handlers={404: _no_route, 405: _no_route},
    )
    _install_guard(app, settings, parts.proxy)
    app.state.manager = parts.manager
    app.state.router = parts.router
    app.state.proxy = parts.proxy
    app.state.metrics_registry = parts.registry_metrics
    return app


@dataclass(frozen=True, slots=True)
class _Parts:
    """What ``build_app`` wires before it builds the app's routes."""

    manager: DeploymentManager
    registry: ModelRegistry
    router: ModelRouter
    proxy: Proxy
    admin: AdminApi
    registry_metrics: CollectorRegistry
    node: str


def _wire(
    settings: Settings,
    inventory: GpuInventory,
    ledger: Ledger,
    client: httpx.AsyncClient,
    upstream: httpx.AsyncClient,
    base_env: Mapping[str, str] | None,
    resolve: Callable[[str], ModelSpec],
    deploy_body: type[DeployBody],
) -> _Parts:
    """The metrics, deployment manager, model registry, router, proxy and admin API."""
    holder: dict[str, DeploymentManager] = {}
    registry_metrics = CollectorRegistry()
    calibrator = Calibrator.in_state_dir(
        settings.state_dir.expanduser(), enabled=settings.calibration
    )
    node = settings.node_name or socket.gethostname()
    metrics = _register_metrics(
        registry_metrics, settings, inventory, ledger, holder, calibrator, node
    )
    manager = DeploymentManager(
        manager_config(settings),
        inventory,
        ledger,
        client,
        base_env=dict(base_env) if base_env is not None else None,
        metrics=metrics,
        calibrator=calibrator,
    )
    holder["manager"] = manager
    registry = ModelRegistry.create(
        settings.models, settings.allowed_models, resolve, settings.default_vllm_version
    )
    router = ModelRouter(manager, registry, _router_config(settings))
    proxy = Proxy(
        router, upstream, metrics=metrics, max_whole_answer_bytes=settings.max_whole_answer_bytes
    )
    manager.in_flight = proxy.outstanding
    admin = AdminApi(manager, registry, settings.admin_token, deploy_body)
    return _Parts(manager, registry, router, proxy, admin, registry_metrics, node)


def _routes(
    settings: Settings,
    parts: _Parts,
    resolve: Callable[[str], ModelSpec],
    *,
    rehearsal: bool,
    deploy_body: type[DeployBody],
) -> list[BaseRoute]:
    """The proxy's routes, the admin API's, then the sidecar's own (in that order)."""
    discovery = _discovery_endpoint(settings, parts.manager, parts.node)
    return [
        *parts.proxy.routes(),
        *parts.admin.routes(),
        Route("/healthz", _healthz_endpoint(parts.manager, rehearsal), methods=["GET"]),
        Route("/metrics", metrics_endpoint(parts.registry_metrics), methods=["GET"]),
        Route("/discovery/workers", discovery, methods=["GET"]),
        Route("/openapi.json", _openapi_endpoint(deploy_body), methods=["GET"]),
        Route("/k8s/validate", webhook_from_settings(settings, resolve).endpoint, methods=["POST"]),
    ]


def _register_metrics(
    registry_metrics: CollectorRegistry,
    settings: Settings,
    inventory: GpuInventory,
    ledger: Ledger,
    holder: dict[str, DeploymentManager],
    calibrator: Calibrator,
    node: str,
) -> SidecarMetrics:
    """The sidecar's collectors on ``registry_metrics``; the workers are read from
    ``holder["manager"]`` at scrape time (the manager is built after its metrics)."""
    return register_collectors(
        registry_metrics,
        MetricSources(
            inventory,
            promised=lambda: ledger.view().promised,
            workers=lambda: [worker_view(d) for d in list(holder["manager"].deployments.values())],
            outstanding=lambda: ledger.view().outstanding,
            known_models=lambda: (
                {e.name for e in settings.models}
                | {d.name for d in list(holder["manager"].deployments.values())}
            ),
            calibration=calibrator.metric_items,
            policy=placement_policy(settings),
            node=node,
            host_memory=ProcHostMemory(settings.host_memory_root).read,
            host_reserved=lambda: host_reserved_bytes(ledger, settings.host_margin_bytes),
            host_workers=lambda: host_views(list(holder["manager"].deployments.values())),
        ),
    ).metrics


def _router_config(settings: Settings) -> RouterConfig:
    return RouterConfig(
        on_demand=settings.on_demand,
        request_wait_seconds=settings.request_wait_seconds,
        idle_eviction=settings.idle_eviction,
        idle_seconds=settings.idle_seconds,
        start_failure_backoff_seconds=settings.start_failure_backoff_seconds,
    )


def _lifespan(
    settings: Settings,
    ledger: Ledger,
    parts: _Parts,
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
    *,
    warm_model_cards: bool,
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Start-up (prune the ledger, adopt workers, preload models, warm the model cards)
    and shutdown (close the manager and ``clients``: the sidecar's own and the proxy's)."""

    manager, registry, router = parts.manager, parts.registry, parts.router

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(ledger.prune, RELEASED_KEEP_SECONDS)
        await manager.adopt(lambda model: registry.request(ModelEntry(name=model, model=model)))
        for entry in settings.models:
            if entry.preload and not manager.by_name(entry.name):
                idle = entry_idle(entry, manager.config.idle)
                await manager.deploy(entry.name, registry.request(entry), idle=idle)
        # The model cards' max_model_len of models not running needs each model resolved
        # (about a second for a catalog of 38 on 2 CPUs): done once now, in the
        # background, so that no client's first GET /v1/models waits for it.
        warm = asyncio.create_task(router.models()) if warm_model_cards else None
        if warm is not None:
            warm.add_done_callback(_log_failure)
        try:
            yield
        finally:
            if warm is not None:
                warm.cancel()
            await manager.close(stop_workers=settings.stop_workers_on_exit)
            for client in clients:
                await client.aclose()

    return lifespan


def _healthz_endpoint(
    manager: DeploymentManager, rehearsal: bool
) -> Callable[[Request], Awaitable[Response]]:
    async def healthz(request: Request) -> Response:
        # "rehearsal" as the admin API means it (simulator workers); "declared_gpus" for a
        # node read from GATEKEEPER_GPUS instead of NVML.
        # "degraded" while a worker failed its liveness probes (it is being restarted);
        # still 200: the sidecar itself serves, and restarting it would not help.
        unhealthy = sorted(d.id for d in manager.deployments.values() if d.state == "unhealthy")
        return JSONResponse(
            {
                "status": "degraded" if unhealthy else "ok",
                "version": __version__,
                "rehearsal": manager.config.rehearsal,
                "declared_gpus": rehearsal,
                "unhealthy_workers": unhealthy,
            }
        )

    return healthz


def _discovery_endpoint(
    settings: Settings, manager: DeploymentManager, node: str
) -> Callable[[Request], Awaitable[Response]]:
    async def discovery(request: Request) -> Response:
        """Prometheus http_sd: the serving workers' /metrics (sidecar/discovery.py)."""
        host = advertised_host(settings.worker_host, request.url.hostname or "127.0.0.1")
        workers = list(manager.deployments.values())
        return JSONResponse(worker_targets(workers, host=host, node=node))

    return discovery


def _openapi_endpoint(deploy_body: type[DeployBody]) -> Callable[[Request], Awaitable[Response]]:
    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_schema(__version__, deploy_body))

    return openapi


def _install_guard(app: Starlette, settings: Settings, proxy: Proxy) -> None:
    # The guard is outermost, so the proxy's POSTs skip Starlette's error middleware and
    # router (http_guard: direct routes; issue #15).
    guard = HttpGuard(
        app.build_middleware_stack(), api_keys=settings.api_keys, direct=proxy.direct_routes()
    )
    app.middleware_stack = guard
    # The same routes behind the key check, for the HTTP protocol's lean path (server_config).
    app.state.direct_routes = guard.direct_routes()


async def _no_route(request: Request, exc: Exception) -> Response:
    """An unknown path or method answers in the error shape of every other answer (JSON
    with ``error.message``), not Starlette's plain text."""
    status = getattr(exc, "status_code", 404)
    what = "method" if status == 405 else "path"
    response = error_response(
        status,
        f"no such {what}: {request.method} {request.url.path}; the routes are listed in "
        "/openapi.json",
    )
    response.headers.update(getattr(exc, "headers", None) or {})  # 405's Allow
    return response


def _held(ledger: Ledger) -> dict[str, int]:
    """Bytes each GPU gives to ready workers: their ready rows in the ledger. Read from
    the ledger, not from the deployments' states, so a worker is held from the moment
    its row stops being outstanding (``mark_ready``), with no gap in which it counts
    nowhere."""
    return dict(ledger.view().held)


def _log_failure(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("listing the model cards failed", exc_info=task.exception())
