"""``gatekeeper webhook``: the validating admission webhook on its own, over TLS.

``gatekeeper webhook --cert tls.crt --key tls.key [--host 0.0.0.0] [--port 8443]`` serves
``POST /k8s/validate``, ``GET /healthz`` and ``GET /metrics`` with uvicorn. The
certificate and key files are checked every ``--reload-seconds`` and loaded again when
they change (cert-manager renews the Secret in place), so new connections get the new
certificate without a restart.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gatekeeper._version import __version__
from gatekeeper.cli.log_options import add_log_format, announce, start_logging
from gatekeeper.cli.output import print_json
from gatekeeper.settings import Settings

__all__ = ["add_parser", "run_webhook"]

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
    w.add_argument("--json", action="store_true", help="print the start line as one JSON object")
    add_log_format(w)
    w.set_defaults(func=run_webhook)


def run_webhook(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry, Info

    from gatekeeper.k8s.server import (
        CertReloader,
        build_webhook_app,
        check_tls,
        webhook_from_settings,
    )

    check_tls(args.cert, args.key)
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
    log_format = start_logging(args, settings)
    url = f"https://{host}:{args.port}/k8s/validate"
    if args.json:
        print_json({"url": url, "cert": str(args.cert), "reload_seconds": args.reload_seconds})
    else:
        announce([f"gatekeeper admission webhook on {url}"], log_format, __name__)
    uvicorn.Server(config).run()
    return 0
