"""The webhook served: built from the settings, as a Starlette app of its own with a
certificate that is reloaded when cert-manager renews it.

``webhook_from_settings`` is what the sidecar mounts at ``POST /k8s/validate``;
``build_webhook_app`` is the standalone server ``gatekeeper webhook`` runs over TLS
(``POST /k8s/validate``, ``GET /healthz``, ``GET /readyz``, ``GET /metrics``, and with a
``Mutator``, ``gatekeeper webhook --mutate``, ``POST /k8s/mutate``). ``WarmUp`` does once,
in a thread at start, what the first reviews would otherwise do while the apiserver waits
on them (transformers' config classes imported, about 2.5 s of one core; the catalog's
models read; one dry-run review through the mutator); ``/readyz`` answers 503 until it is
done, so a readiness probe keeps reviews away from a cold process. ``mutate_phases``
times each mutating review's phases (``gatekeeper_webhook_mutate_phase_seconds``). ``CertReloader`` checks the
certificate and key files every few seconds and loads them into the live TLS context
when they change, so new connections get the new certificate without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, get_args

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
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
from gatekeeper.models.catalog import catalog_entries
from gatekeeper.models.spec import ModelSpec
from gatekeeper.settings import Settings, model_resolver, placement_policy

__all__ = [
    "PHASES",
    "CertReloader",
    "WarmUp",
    "build_webhook_app",
    "check_client_ca",
    "check_tls",
    "health_app",
    "mutate_endpoint",
    "mutate_phases",
    "mutation_counter",
    "readyz_endpoint",
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


PHASES = ("read", "queue", "review", "scope", "templates")
"""A mutating review's timed phases: its body read, its wait for a worker thread, its
decision (model lookup, sizing, templates), and within that the namespace scope check and
the templates ensured."""
Observe = Callable[[str, float], None]


def mutate_phases(registry: CollectorRegistry) -> Observe:
    """``gatekeeper_webhook_mutate_phase_seconds{phase}`` on ``registry``, as a callback
    ``observe(phase, seconds)``."""
    histogram = Histogram(
        "gatekeeper_webhook_mutate_phase_seconds",
        "Time of each phase of a mutating review: read (the body), queue (waiting for a "
        "worker thread), review (the decision, model lookup and sizing, scope and "
        "templates included), scope (the namespace selector check), templates (the claim "
        "templates ensured).",
        ["phase"],
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        registry=registry,
    )
    for phase in PHASES:
        histogram.labels(phase)
    return lambda phase, seconds: histogram.labels(phase).observe(seconds)


def mutate_endpoint(
    mutator: Mutator, observe: Observe | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """``POST /k8s/mutate``: the review is decided in a worker thread (it may call the
    apiserver); ``observe``: each phase's time (``mutate_phases``)."""
    timed = observe or (lambda phase, seconds: None)

    def answer(body: bytes, budget: Budget, read: float) -> tuple[int, dict[str, Any], Any]:
        started = time.monotonic()
        timed("queue", started - read)
        try:
            return mutator.answer(body, budget)
        finally:
            timed("review", time.monotonic() - started)

    async def endpoint(request: Request) -> Response:
        limits = mutator.webhook.config.limits
        budget = Budget(limits.budget_seconds)  # from the review's arrival
        arrived = time.monotonic()
        body = await review_body(request, limits.review_bytes)
        if isinstance(body, Oversized):
            answer_ = too_large(body)
            mutator.counted("denied" if answer_.status_code == 200 else "malformed")
            return answer_
        read = time.monotonic()
        timed("read", read - arrived)
        status, payload, outcome = await anyio.to_thread.run_sync(answer, body, budget, read)
        mutator.counted(outcome)
        return JSONResponse(payload, status_code=status)

    return endpoint


class WarmUp:
    """What the first reviews would pay, paid once in a thread (``start``): the catalog's
    models read into the webhook's cache (with them transformers' config classes, for
    configs that leave fields to their class), and a dry-run review of a vLLM Pod through
    ``mutator`` (the flag table, the estimator; no template is written). ``ready`` is set
    when done, failed or not (a failure is logged: reviews then pay it themselves)."""

    def __init__(self, webhook: AdmissionWebhook, mutator: Mutator | None = None) -> None:
        self._webhook = webhook
        self._mutator = mutator
        self.ready = threading.Event()
        self.seconds: float | None = None

    def start(self) -> WarmUp:
        threading.Thread(target=self.run, name="webhook-warm-up", daemon=True).start()
        return self

    def run(self) -> None:
        started = time.monotonic()
        try:
            from gatekeeper.models.config_defaults import class_defaults

            class_defaults({"model_type": "llama"})  # transformers' config classes
            entries = sorted(catalog_entries(), key=lambda e: e.parameters or float("inf"))
            models = [e.repo_id for e in entries]  # the smallest first: it fits a GPU
            for model in models:
                self._webhook.model_spec("warm-up", model)
            if self._mutator is not None and models:
                m = self._mutator  # without its scope: no configuration is read (nor cached)
                quiet = Mutator(m.webhook, m.store, undersized=m.undersized, mode=m.mode)
                quiet.answer(_dry_run_review(models[0]))
        except Exception:  # a warm-up that fails leaves the work to the reviews
            logging.getLogger(__name__).exception("webhook: the warm-up failed")
        finally:
            self.seconds = time.monotonic() - started
            self.ready.set()


def _dry_run_review(model: str) -> bytes:
    """A dry-run AdmissionReview of a Pod running ``vllm serve model`` on one GPU."""
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai",
        "command": ["vllm", "serve", model],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "warm-up"},
           "spec": {"containers": [container]}}  # fmt: skip
    request = {"uid": "warm-up", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "operation": "CREATE", "namespace": "default", "object": pod, "dryRun": True}  # fmt: skip
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode()


def build_webhook_app(
    webhook: AdmissionWebhook,
    registry: CollectorRegistry,
    reloader: CertReloader | None = None,
    mutator: Mutator | None = None,
    *,
    warm: WarmUp | None = None,
    observe: Observe | None = None,
) -> Starlette:
    """The standalone webhook's ASGI app; ``mutator`` adds ``POST /k8s/mutate`` (its
    phases timed by ``observe``); ``warm``: ``/readyz`` answers 503 until it is done."""

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
        Route("/readyz", readyz_endpoint(warm), methods=["GET"]),
        Route("/metrics", metrics_endpoint(registry), methods=["GET"]),
    ]
    if mutator is not None:
        routes.append(Route("/k8s/mutate", mutate_endpoint(mutator, observe), methods=["POST"]))
    return Starlette(routes=routes, lifespan=lifespan)


def readyz_endpoint(warm: WarmUp | None) -> Callable[[Request], Awaitable[Response]]:
    """``GET /readyz``: 200 once ``warm`` is done (at once without one), else 503."""

    async def readyz(request: Request) -> Response:
        if warm is not None and not warm.ready.is_set():
            return JSONResponse({"status": "warming up", "version": __version__}, 503)
        seconds = round(warm.seconds, 3) if warm is not None and warm.seconds else None
        return JSONResponse({"status": "ok", "version": __version__, "warm_up_s": seconds})

    return readyz


def health_app(registry: CollectorRegistry, warm: WarmUp | None = None) -> Starlette:
    """``GET /healthz``, ``GET /readyz`` and ``GET /metrics`` alone, for the plain-HTTP
    ``--health-port`` (kubelet's probes and Prometheus present no client certificate);
    no reviews."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz_endpoint(warm), methods=["GET"]),
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
