"""The webhook served: built from the settings, as a Starlette app of its own with a
certificate that is reloaded when cert-manager renews it.

``webhook_from_settings`` is what the sidecar mounts at ``POST /k8s/validate``;
``build_webhook_app`` is the standalone server ``gatekeeper webhook`` runs over TLS
(``POST /k8s/validate``, ``GET /healthz``, ``GET /metrics``, and with a ``Mutator``,
``gatekeeper webhook --mutate``, ``POST /k8s/mutate``). ``CertReloader`` checks the
certificate and key files every few seconds and loads them into the live TLS context
when they change, so new connections get the new certificate without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import get_args

import anyio
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gatekeeper._version import __version__
from gatekeeper.cluster.claims import ClaimsMode
from gatekeeper.errors import GatekeeperError
from gatekeeper.k8s.fit import gpu_from_value
from gatekeeper.k8s.fleet import Fleet
from gatekeeper.k8s.limits import Budget, ReviewLimits
from gatekeeper.k8s.mutate import MutationOutcome, Mutator
from gatekeeper.k8s.review import Oversized, review_body, too_large
from gatekeeper.k8s.webhook import AdmissionWebhook, WebhookConfig, WebhookMetrics
from gatekeeper.metrics.exposition import metrics_endpoint
from gatekeeper.models.spec import ModelSpec
from gatekeeper.settings import Settings, model_resolver, placement_policy

__all__ = [
    "CertReloader",
    "build_webhook_app",
    "check_client_ca",
    "check_tls",
    "health_app",
    "mutate_endpoint",
    "mutation_counter",
    "webhook_from_settings",
]


def webhook_from_settings(
    settings: Settings,
    resolve: Callable[..., ModelSpec] | None = None,
    *,
    registry: CollectorRegistry | None = None,
    published: Callable[[], Fleet] | None = None,
    claims: ClaimsMode | None = None,
) -> AdmissionWebhook:
    """The webhook configured by ``settings``; raises ``GatekeeperError`` when
    ``webhook_default_gpu`` is neither a size nor a known GPU. ``published`` (cluster
    mode: ``gatekeeper.k8s.published.PublishedDevices``) judges by the published devices;
    ``claims``: the mutating webhook's claims mode, when it runs beside."""
    default = settings.webhook_default_gpu
    limits = ReviewLimits(
        review_bytes=settings.webhook_max_review_bytes,
        containers_per_pod=settings.webhook_max_containers_per_pod,
        line_bytes=settings.webhook_max_line_bytes,
        flags_per_line=settings.webhook_max_flags_per_line,
        budget_seconds=settings.webhook_review_budget_seconds,
        templates_per_review=settings.webhook_max_templates_per_review,
    )
    config = WebhookConfig(
        limits=limits,
        fit=placement_policy(settings),
        default_gpu=gpu_from_value(default, "setting webhook_default_gpu") if default else None,
        unknown_model=settings.webhook_unknown_model,
        max_node_gpus=settings.webhook_max_gpus_per_node,
        claims=claims,
    )
    resolve = resolve or model_resolver(settings)
    metrics = WebhookMetrics(registry) if registry is not None else None
    return AdmissionWebhook(config, resolve, metrics=metrics, published=published)


class CertReloader:
    """Loads the certificate and key into a server's SSL context again when the files
    change (a Secret volume swaps them through a symlink), and the client CA (``ca``,
    ``--client-ca-file``) when it does: a renewed CA is trusted beside the old one until
    the webhook restarts (an SSL context can add CAs, not drop them)."""

    def __init__(
        self, cert: Path, key: Path, interval_seconds: float = 60.0, ca: Path | None = None
    ) -> None:
        self.cert, self.key, self.ca = cert, key, ca
        self.interval_seconds = interval_seconds
        self.context: ssl.SSLContext | None = None
        self._seen = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert, self.key, *([self.ca] if self.ca else [])):
            try:
                st = os.stat(path)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)

    def check(self) -> bool:
        """Reload when the files changed; True when a new certificate was loaded."""
        stamp = self._stamp()
        if stamp == self._seen or self.context is None:
            return False
        try:
            self.context.load_cert_chain(self.cert, self.key)
            if self.ca is not None:
                self.context.load_verify_locations(self.ca)
        except (OSError, ssl.SSLError):  # half-written: keep the old one, try again later
            return False
        self._seen = stamp
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            self.check()


def mutation_counter(registry: CollectorRegistry) -> Callable[[MutationOutcome], None]:
    """``gatekeeper_webhook_mutations_total{outcome}`` on ``registry``, as a callback."""
    counter = Counter(
        "gatekeeper_webhook_mutations",
        "Mutating admission reviews by outcome: mutated, unchanged, warned, denied, ignored, "
        "malformed.",
        ["outcome"],
        registry=registry,
    )
    for outcome in get_args(MutationOutcome):
        counter.labels(outcome)
    return lambda outcome: counter.labels(outcome).inc()


def mutate_endpoint(mutator: Mutator) -> Callable[[Request], Awaitable[Response]]:
    """``POST /k8s/mutate``: the review is decided in a worker thread (it may call the
    apiserver)."""

    async def endpoint(request: Request) -> Response:
        limits = mutator.webhook.config.limits
        budget = Budget(limits.budget_seconds)  # from the review's arrival
        body = await review_body(request, limits.review_bytes)
        if isinstance(body, Oversized):
            answer = too_large(body)
            mutator.counted("denied" if answer.status_code == 200 else "malformed")
            return answer
        status, payload, outcome = await anyio.to_thread.run_sync(mutator.answer, body, budget)
        mutator.counted(outcome)
        return JSONResponse(payload, status_code=status)

    return endpoint


def build_webhook_app(
    webhook: AdmissionWebhook,
    registry: CollectorRegistry,
    reloader: CertReloader | None = None,
    mutator: Mutator | None = None,
) -> Starlette:
    """The standalone webhook's ASGI app; ``mutator`` adds ``POST /k8s/mutate``."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(reloader.run()) if reloader is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()

    routes = [
        Route("/k8s/validate", webhook.endpoint, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_endpoint(registry), methods=["GET"]),
    ]
    if mutator is not None:
        routes.append(Route("/k8s/mutate", mutate_endpoint(mutator), methods=["POST"]))
    return Starlette(routes=routes, lifespan=lifespan)


def health_app(registry: CollectorRegistry) -> Starlette:
    """``GET /healthz`` and ``GET /metrics`` alone, for the plain-HTTP ``--health-port``
    (kubelet's probes and Prometheus present no client certificate); no reviews."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_endpoint(registry), methods=["GET"]),
        ]
    )


def check_client_ca(path: Path) -> None:
    """Raise ``GatekeeperError`` unless ``path`` loads as a PEM CA certificate."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(path)
    except (OSError, ssl.SSLError, ValueError) as e:
        raise GatekeeperError(
            f"webhook: cannot load the client CA {path} ({e}); give the PEM certificate of "
            "the CA that signs the apiserver's client certificate (--client-ca-file)",
            field="webhook_client_ca_file",
            value=str(path),
        ) from e


def check_tls(cert: Path, key: Path) -> None:
    """Raise ``GatekeeperError`` unless ``cert`` and ``key`` load as a TLS pair."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise GatekeeperError(
            f"webhook: cannot load the certificate {cert} with the key {key} ({e}); give a PEM "
            "certificate and its private key (cert-manager's tls.crt and tls.key)",
            field="cert",
            value=str(cert),
        ) from e
