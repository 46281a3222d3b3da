"""``gatekeeper webhook``: the validating admission webhook on its own, over TLS.

``gatekeeper webhook --cert tls.crt --key tls.key [--host 0.0.0.0] [--port 8443]`` serves
``POST /k8s/validate``, ``GET /healthz`` and ``GET /metrics`` with uvicorn. The
certificate and key files are checked every ``--reload-seconds`` and loaded again when
they change (cert-manager renews the Secret in place), so new connections get the new
certificate without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Info, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gatekeeper import __version__
from gatekeeper.errors import GatekeeperError
from gatekeeper.model_spec import ModelSpec
from gatekeeper.settings import Settings, model_resolver
from gatekeeper.webhook import AdmissionWebhook, WebhookConfig, WebhookMetrics
from gatekeeper.webhook_fit import FitPolicy, gpu_from_value

__all__ = ["CertReloader", "add_parser", "build_webhook_app", "webhook_from_settings"]

DEFAULT_PORT = 8443


def add_parser(subparsers: Any) -> None:
    w = subparsers.add_parser(
        "webhook",
        help="serve the Kubernetes validating admission webhook over TLS",
        description="The admission webhook on its own: POST /k8s/validate, /healthz, /metrics.",
    )
    w.add_argument("--cert", type=Path, required=True, help="PEM certificate (tls.crt)")
    w.add_argument("--key", type=Path, required=True, help="PEM private key (tls.key)")
    w.add_argument("--host", default=None, help="listen address (default: settings, 127.0.0.1)")
    w.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    w.add_argument(
        "--reload-seconds",
        type=float,
        default=60.0,
        help="how often the certificate files are checked for renewal (default 60)",
    )
    w.set_defaults(func=run_webhook)


def webhook_from_settings(
    settings: Settings,
    resolve: Callable[[str], ModelSpec] | None = None,
    *,
    registry: CollectorRegistry | None = None,
) -> AdmissionWebhook:
    """The webhook configured by ``settings``; raises ``GatekeeperError`` when
    ``webhook_default_gpu`` is neither a size nor a known GPU."""
    default = settings.webhook_default_gpu
    config = WebhookConfig(
        fit=FitPolicy(
            margin_bytes=settings.safety_margin_bytes,
            margin_fraction=settings.safety_margin_fraction,
            default_vllm_version=settings.default_vllm_version,
        ),
        default_gpu=gpu_from_value(default, "setting webhook_default_gpu") if default else None,
        unknown_model=settings.webhook_unknown_model,
    )
    resolve = resolve or model_resolver(settings)
    metrics = WebhookMetrics(registry) if registry is not None else None
    return AdmissionWebhook(config, resolve, metrics=metrics)


class CertReloader:
    """Loads the certificate and key into a server's SSL context again when the files
    change (a Secret volume swaps them through a symlink)."""

    def __init__(self, cert: Path, key: Path, interval_seconds: float = 60.0) -> None:
        self.cert, self.key = cert, key
        self.interval_seconds = interval_seconds
        self.context: ssl.SSLContext | None = None
        self._seen = self._stamp()

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert, self.key):
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
        except (OSError, ssl.SSLError):  # half-written: keep the old one, try again later
            return False
        self._seen = stamp
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_seconds)
            self.check()


def build_webhook_app(
    webhook: AdmissionWebhook, registry: CollectorRegistry, reloader: CertReloader | None = None
) -> Starlette:
    """The standalone webhook's ASGI app."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

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
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def _check_tls(cert: Path, key: Path) -> None:
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise GatekeeperError(
            f"webhook: cannot load the certificate {cert} with the key {key} ({e}); give a PEM "
            "certificate and its private key (cert-manager's tls.crt and tls.key)",
            field="cert",
            value=str(cert),
        ) from e


def run_webhook(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    _check_tls(args.cert, args.key)
    registry = CollectorRegistry()
    Info("gatekeeper_build", "gatekeeper's version.", registry=registry).info(
        {"version": __version__}
    )
    webhook = webhook_from_settings(settings, registry=registry)
    reloader = CertReloader(args.cert, args.key, args.reload_seconds)
    host = args.host or settings.host
    config = uvicorn.Config(
        build_webhook_app(webhook, registry, reloader),
        host=host,
        port=args.port,
        ssl_certfile=str(args.cert),
        ssl_keyfile=str(args.key),
        log_level="warning",
        lifespan="on",
    )
    config.load()
    reloader.context = config.ssl
    print(f"gatekeeper admission webhook on https://{host}:{args.port}/k8s/validate", flush=True)
    uvicorn.Server(config).run()
    return 0
