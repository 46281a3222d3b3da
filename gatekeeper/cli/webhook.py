"""``gatekeeper webhook``: the validating admission webhook on its own, over TLS.

``gatekeeper webhook --cert tls.crt --key tls.key [--host 0.0.0.0] [--port 8443]`` serves
``POST /k8s/validate``, ``GET /healthz`` and ``GET /metrics`` with uvicorn. The
certificate and key files are checked every ``--reload-seconds`` and loaded again when
they change (cert-manager renews the Secret in place), so new connections get the new
certificate without a restart.

``--mutate`` (cluster mode, ``docs/cluster.md``) also serves ``POST /k8s/mutate``: vLLM
workloads get a DRA ResourceClaimTemplate of the bytes their ranks need, created through
the API (``--kubeconfig``, else the pod's ServiceAccount), and the flags that hold the
worker to it; ``--undersized-claims`` (else ``GATEKEEPER_WEBHOOK_UNDERSIZED_CLAIMS``) says
what happens to a hand-written claim smaller than a rank needs (``deny``, the default, or
``warn``); ``--claims-mode`` (else ``GATEKEEPER_WEBHOOK_CLAIMS_MODE``) whose GPUs the
request names: ``gatekeeper`` (the default), ``nvidia-dra`` or ``hami``.

``--published-devices`` (cluster mode) judges workloads on ``POST /k8s/validate`` against
the GPUs gatekeeper's node agents publish as ResourceSlices on the nodes a pod may land on
(the Nodes' labels against its node selector and affinity), both read through the same
client at most every ``--published-refresh-seconds`` (``gatekeeper.k8s.published``),
instead of a node selector's GPU product; with nothing published it warns and judges as
before. With ``--mutate`` the validating webhook's suggestions speak of the claims mode's
claims, not of ``nvidia.com/gpu`` counts. The mutating webhook creates templates only in
namespaces the namespace selector of its MutatingWebhookConfiguration (the webhook named
``GATEKEEPER_WEBHOOK_MUTATING_NAME``) selects.

``--client-ca-file FILE`` (else ``GATEKEEPER_WEBHOOK_CLIENT_CA_FILE``; the name
kube-apiserver gives its own flag) makes the TLS listener require a client certificate
signed by that CA: only a caller holding one (the apiserver, configured through its
AdmissionConfiguration) gets a review answered; ``--health-port PORT`` serves ``/healthz``
and ``/metrics`` in plain HTTP on a port of their own, for kubelet's probes and Prometheus,
which hold none (docs/cluster.md, "Only the apiserver").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from gatekeeper._version import __version__
from gatekeeper.cli.log_options import add_log_format, announce, start_logging
from gatekeeper.cli.output import print_json
from gatekeeper.errors import GatekeeperError
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
    w.add_argument(
        "--mutate",
        action="store_true",
        help="also serve POST /k8s/mutate: write DRA claims for vLLM workloads (cluster mode)",
    )
    w.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="with --mutate or --published-devices: the apiserver (default: in-cluster)",
    )
    w.add_argument(
        "--published-devices",
        action="store_true",
        help="judge workloads against the GPUs the node agents publish as ResourceSlices "
        "(cluster mode; default: by node selector, annotation or default GPU)",
    )
    w.add_argument(
        "--published-refresh-seconds",
        type=float,
        default=10.0,
        help="with --published-devices: how often the ResourceSlices and Nodes are read again "
        "(default 10)",
    )
    w.add_argument(
        "--undersized-claims",
        choices=("deny", "warn"),
        default=None,
        help="with --mutate: a hand-written claim smaller than a rank needs is denied or "
        "admitted with a warning (default: the setting webhook_undersized_claims, deny)",
    )
    w.add_argument(
        "--client-ca-file",
        type=Path,
        default=None,
        help="require a client certificate signed by this CA (PEM) on the TLS listener: "
        "only the apiserver, given one, gets answers (default: the setting "
        "webhook_client_ca_file, unset: any client)",
    )
    w.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="also serve /healthz and /metrics in plain HTTP on this port (for probes and "
        "Prometheus when --client-ca-file is set; default: none)",
    )
    w.add_argument(
        "--claims-mode",
        choices=("gatekeeper", "nvidia-dra", "hami"),
        default=None,
        help="with --mutate: claim gatekeeper's published GPUs, NVIDIA's DRA driver's "
        "(gpu.nvidia.com, consumable memory), or write HAMi's nvidia.com/gpumem where DRA is "
        "off (default: the setting webhook_claims_mode, gatekeeper)",
    )
    add_log_format(w)
    w.set_defaults(func=run_webhook)


def run_webhook(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn
    from prometheus_client import CollectorRegistry, Info

    from gatekeeper.k8s.server import (
        CertReloader,
        WarmUp,
        build_webhook_app,
        check_client_ca,
        check_tls,
        health_app,
        mutate_phases,
        webhook_from_settings,
    )

    check_tls(args.cert, args.key)
    client_ca = args.client_ca_file or settings.webhook_client_ca_file
    if client_ca is not None:
        check_client_ca(client_ca)
    registry = CollectorRegistry()
    Info("gatekeeper_build", "gatekeeper's version.", registry=registry).info(
        {"version": __version__}
    )
    client = _client(args) if args.mutate or args.published_devices else None
    published = _published(client, args) if args.published_devices else None
    undersized = args.undersized_claims or settings.webhook_undersized_claims
    mode = args.claims_mode or settings.webhook_claims_mode
    claims = mode if args.mutate else None
    webhook = webhook_from_settings(settings, registry=registry, published=published, claims=claims)
    hook = settings.webhook_mutating_name
    observe = mutate_phases(registry) if args.mutate else None
    mutator = (
        _mutator(client, webhook, registry, undersized, mode, hook, observe)
        if args.mutate
        else None
    )
    warm = WarmUp(webhook, mutator).start()
    reloader = CertReloader(args.cert, args.key, args.reload_seconds, client_ca)
    host = args.host or settings.host
    mutual = {"ssl_ca_certs": str(client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    config = uvicorn.Config(
        build_webhook_app(webhook, registry, reloader, mutator, warm=warm, observe=observe),
        host=host,
        port=args.port,
        ssl_certfile=str(args.cert),
        ssl_keyfile=str(args.key),
        log_level="warning",
        lifespan="on",
        **(mutual if client_ca is not None else {}),  # type: ignore[arg-type]
    )
    config.load()
    reloader.context = config.ssl
    health = None
    if args.health_port is not None:
        health = uvicorn.Config(
            health_app(registry, warm), host=host, port=args.health_port, log_level="warning",
            lifespan="off",
        )  # fmt: skip
    log_format = start_logging(args, settings)
    url = f"https://{host}:{args.port}/k8s/validate"
    mutate = f"https://{host}:{args.port}/k8s/mutate" if mutator is not None else None
    if args.json:
        print_json({"url": url, "mutate_url": mutate, "cert": str(args.cert),
                    "reload_seconds": args.reload_seconds,
                    "client_ca": str(client_ca) if client_ca else None,
                    "health_port": args.health_port})  # fmt: skip
    else:
        lines = [f"gatekeeper admission webhook on {url}"]
        lines += [f"claims written on {mutate}"] if mutate else []
        lines += [f"client certificates required (CA {client_ca})"] if client_ca else []
        announce(lines, log_format, __name__)
    if health is None:
        uvicorn.Server(config).run()
    else:
        asyncio.run(_serve_both(uvicorn.Server(config), _quiet(health)))
    return 0


def _quiet(config: Any) -> Any:
    """A uvicorn server for a second listener, which leaves the signals to the first."""
    import uvicorn

    class Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Quiet(config)


async def _serve_both(main: Any, health: Any) -> None:
    """The webhook's TLS listener and the plain health listener; both end with the first."""
    task = asyncio.create_task(health.serve())
    try:
        await main.serve()
    finally:
        health.should_exit = True
        await task


def _client(args: argparse.Namespace) -> Any:
    """A lightkube client (the ``cluster`` extra) on ``--kubeconfig`` or in-cluster."""
    flag = "--mutate" if args.mutate else "--published-devices"
    what = "create claim templates on" if args.mutate else "read ResourceSlices from"
    try:
        from lightkube import Client, KubeConfig
    except ImportError as e:
        raise GatekeeperError(
            f"webhook {flag}: the Kubernetes client is not installed ({e}); install "
            "gatekeeper with its cluster extra: pip install 'gatekeeper[cluster]'",
            field=flag.lstrip("-").replace("-", "_"),
            value=True,
        ) from e
    from lightkube.core.exceptions import ConfigError

    try:
        config = KubeConfig.from_file(args.kubeconfig) if args.kubeconfig else KubeConfig.from_env()
    except ConfigError as e:
        raise GatekeeperError(
            f"webhook {flag}: no apiserver to {what} ({e}); give --kubeconfig FILE, or run "
            "in a pod with its ServiceAccount token mounted",
            field="kubeconfig",
            value=str(args.kubeconfig or ""),
        ) from e
    return Client(config, field_manager="gatekeeper-webhook", trust_env=False)


def _published(client: Any, args: argparse.Namespace) -> Any:
    """The published devices, read through ``client`` (``gatekeeper.k8s.published``)."""
    from gatekeeper.k8s.published import PublishedDevices

    if args.published_refresh_seconds < 0:
        raise GatekeeperError(
            f"--published-refresh-seconds is {args.published_refresh_seconds}; give 0 (read "
            "at every review) or more seconds",
            field="published_refresh_seconds",
            value=args.published_refresh_seconds,
        )
    return PublishedDevices(client, refresh_seconds=args.published_refresh_seconds, background=True)


def _mutator(
    client: Any,
    webhook: Any,
    registry: Any,
    undersized: Literal["warn", "deny"],
    mode: Any,
    hook: str,
    observe: Any,
) -> Any:
    """The mutating webhook on a lightkube client; ``mode``: its claims mode; ``hook``: its
    name in the MutatingWebhookConfigurations, whose namespace selector it keeps to. Its
    template store is warmed by a watch of gatekeeper's templates, and swept of those no
    workload names (``gatekeeper.k8s.template_sweep``)."""
    from gatekeeper.k8s.api_scope import ApiNamespaceScope
    from gatekeeper.k8s.mutate import Mutator
    from gatekeeper.k8s.server import mutation_counter
    from gatekeeper.k8s.template_store import ApiTemplateStore
    from gatekeeper.k8s.template_sweep import TemplateSweep

    store = ApiTemplateStore(client, observe=observe).start()
    TemplateSweep(client, store).start()
    return Mutator(
        webhook,
        store,
        undersized=undersized,
        mode=mode,
        count=mutation_counter(registry),
        scope=ApiNamespaceScope(client, hook, observe=observe),
    )
