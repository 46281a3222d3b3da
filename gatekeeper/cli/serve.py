"""``gatekeeper serve``: the sidecar (``--rehearsal``: on a declared node with the
simulator as the worker), and its start-up banner, which names where the admin token
came from (``--json``: the banner as one JSON object). The commands that talk to a
running sidecar are ``gatekeeper.cli.operator``'s."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gatekeeper.cli.log_options import add_log_format, announce, start_logging
from gatekeeper.cli.output import print_json
from gatekeeper.errors import GatekeeperError
from gatekeeper.models.catalog import catalog_entries
from gatekeeper.settings import Settings, gpu_source, setting_source

__all__ = ["add_parser", "rehearsal_settings", "stored_token"]

REHEARSAL_NODE = "2xH100-80GB"


def add_parser(subparsers: Any) -> None:
    s = subparsers.add_parser(
        "serve",
        help="run the sidecar: admin API, OpenAI proxy, workers",
        description="Run the sidecar on one node: the admin API (/admin: deploy, list and "
        "stop vLLM workers, each admitted only when its estimated memory fits the GPUs), "
        "the OpenAI-compatible proxy (/v1, launching allowed models on demand), /metrics "
        "and /healthz. Settings come from GATEKEEPER_* variables or --config; --rehearsal "
        "runs on a declared node with the simulator as the worker, no GPU needed.",
    )
    s.add_argument("--host", default=None, help="listen address (default: settings, 127.0.0.1)")
    s.add_argument("--port", type=int, default=None, help="listen port (default: settings, 8080)")
    s.add_argument(
        "--rehearsal",
        action="store_true",
        help="no GPU needed: a declared node, the catalog, and the simulator as the worker",
    )
    s.add_argument("--json", action="store_true", help="print the banner as one JSON object")
    add_log_format(s)
    s.set_defaults(func=run_serve)


# -- serve -----------------------------------------------------------------------------


def rehearsal_settings(settings: Settings) -> tuple[Settings, str]:
    """The embedded default: a declared node, the catalog allowed, the simulator as
    worker; and where its admin token came from (the token is always written to
    ``state_dir/rehearsal/admin-token`` for the operator commands)."""
    state = settings.state_dir.expanduser() / "rehearsal"
    token_file = state / "admin-token"
    stored = _read_token(token_file)
    if settings.admin_token:
        token, where = settings.admin_token, setting_source(settings, "admin_token")
        where += f", written to {token_file}"
    elif stored:
        token, where = stored, f"kept from an earlier rehearsal in {token_file}"
    else:
        token, where = secrets.token_urlsafe(24), f"generated and written to {token_file}"
    state.mkdir(parents=True, exist_ok=True)
    token_file.write_text(token)
    token_file.chmod(0o600)
    rehearsed = settings.model_copy(
        update={
            "state_dir": state,
            "gpus": settings.gpus if gpu_source(settings).is_declared else REHEARSAL_NODE,
            "worker_command": list(_simulator()),
            "admin_token": token,
            "allowed_models": settings.allowed_models or [e.repo_id for e in catalog_entries()],
            "restart_backoff_seconds": min(settings.restart_backoff_seconds, 1.0),
            "startup_timeout_seconds": min(settings.startup_timeout_seconds, 120.0),
            # Ctrl-C ends the rehearsal's simulators too, unless the operator chose
            # otherwise (then the banner says what keeps running and how to stop it).
            "stop_workers_on_exit": settings.stop_workers_on_exit
            or setting_source(settings, "stop_workers_on_exit") == "default",
        }
    )
    return rehearsed, where


def _read_token(path: Path) -> str | None:
    return path.read_text().strip() or None if path.is_file() else None


def stored_token(settings: Settings) -> str | None:
    """The token a rehearsal under ``settings.state_dir`` wrote, if one did."""
    return _read_token(settings.state_dir.expanduser() / "rehearsal" / "admin-token")


def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    from gatekeeper.sidecar.app import build_app
    from gatekeeper.sidecar.http_servers import missing_limits, server
    from gatekeeper.sidecar.ledger import Ledger, ledger_path

    token_source = setting_source(settings, "admin_token")
    if args.rehearsal:
        settings, token_source = rehearsal_settings(settings)
    host, port = args.host or settings.host, settings.port if args.port is None else args.port
    source = gpu_source(settings)
    declared = source.is_declared
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not declared:
        snapshot = source.snapshot(visible_devices=visible)
        if not snapshot.ok:
            raise GatekeeperError(
                f"gpus: NVML cannot be read ({snapshot.error}); run `gatekeeper serve --rehearsal` "
                "or set GATEKEEPER_GPUS=2xH100-80GB to rehearse on a declared node"
            )
    _check_preloads(settings)
    inventory = source.inventory(visible_devices=visible)
    # Bound before the app exists: a port already taken ends the command here, before the
    # lifespan adopts or launches any worker (uvicorn.run binds only after the lifespan).
    sock = _bind(host, port)
    state = settings.state_dir.expanduser()
    state.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path(state))
    app = build_app(settings, inventory, ledger, rehearsal=declared)
    # the port bound, which --port 0 lets the kernel choose
    bound = int(sock.getsockname()[1])
    banner = _banner(settings, host, bound, declared, args.rehearsal, token_source)
    serving = server(app, sock, settings)
    held = _HeldSignals(serving.stop)
    log_format = start_logging(args, settings)  # after the server's own logging set-up
    if args.json:
        print_json(banner)
    else:
        announce(banner["lines"], log_format, __name__)
    lacking = missing_limits(settings)
    if lacking is not None:
        logging.getLogger(__name__).warning("%s", lacking)
    try:
        if not held.caught:
            serving.run()  # the server takes the signals over while it runs
    finally:
        sock.close()
        ledger.close()
        close = getattr(inventory, "close", None)
        if close is not None:
            close()
        held.release()
    return 0


class _HeldSignals:
    """SIGINT and SIGTERM from the banner until the server takes them over: recorded and
    passed to the server's ``stop`` instead of raised. A KeyboardInterrupt raised in
    that window (the event loop being made) can land in a weakref callback or a
    ``__del__``, where Python prints "Exception ignored" and drops it, and the sidecar
    would serve on after being told to stop. ``release`` restores the handlers and ends
    the command with the first signal caught, as the signal itself would have."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self.caught: list[int] = []
        self.stop = stop
        stops = (signal.SIGINT, signal.SIGTERM)
        self.previous = {s: signal.signal(s, self._hold) for s in stops}

    def _hold(self, signum: int, frame: object) -> None:
        self.caught.append(signum)
        self.stop()

    def release(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        for first in self.caught[:1]:
            signal.raise_signal(first)


def _check_preloads(settings: Settings) -> None:
    """Resolve every model marked ``preload`` before anything starts: one that cannot be
    found ends ``serve`` with one line naming the entry and the model (exit code 2), not
    with the traceback of a failed start-up."""
    from gatekeeper.settings import model_resolver

    resolve = model_resolver(settings)
    for entry in settings.models:
        if not entry.preload:
            continue
        try:
            resolve(entry.model)
        except GatekeeperError as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise GatekeeperError(
                f"models: the preloaded model {entry.name!r} (model = {entry.model!r}) cannot "
                f"be resolved: {reason}. Fix the entry's model, or set preload = false",
                field="models",
                value=entry.model,
            ) from None


def _bind(host: str, port: int) -> socket.socket:
    """The sidecar's listening socket, bound and listening, or a clear error naming the
    address and what to do."""
    from gatekeeper.sidecar.http_servers import LISTEN_BACKLOG

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise GatekeeperError(
            f"host: {host!r} cannot be resolved ({e.strerror}); give an address such as "
            "127.0.0.1 or 0.0.0.0 with --host or GATEKEEPER_HOST",
            field="host",
        ) from None
    family, _, _, _, address = infos[0]
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol
    # says TCP (uvloop does anyway), and without it small writes wait for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise GatekeeperError(
            f"port: cannot listen on {host}:{port} ({e.strerror}); another process holds it "
            "or the address is not this machine's: stop that process, or choose another "
            "port with --port or GATEKEEPER_PORT",
            field="port",
        ) from None
    sock.set_inheritable(False)
    return sock


def _banner(
    settings: Settings, host: str, port: int, declared: bool, rehearsal: bool, token_source: str
) -> dict[str, Any]:
    """What the sidecar says at start: its address, REHEARSAL or the declared node, the
    state directory, and where the admin token came from (never the token itself)."""
    url = f"http://{host}:{port}"
    lines = [f"gatekeeper sidecar on {url} (OpenAI proxy /v1, admin API /admin)"]
    if rehearsal:
        lines.append(
            f"REHEARSAL: declared node {settings.gpus}, workers are the gatekeeper simulator "
            "(not vLLM); nothing runs on a GPU"
        )
    elif declared:
        lines.append(f"declared node {settings.gpus}: placement follows the declaration, not NVML")
    state = settings.state_dir.expanduser()
    lines.append(f"state directory: {state}")
    if settings.admin_token:
        lines.append(f"admin token: {token_source}")
        if rehearsal:
            lines.append(f"  export GATEKEEPER_ADMIN_TOKEN=$(cat {state / 'admin-token'})")
    else:
        lines.append("admin API off: set GATEKEEPER_ADMIN_TOKEN to turn it on")
    if settings.stop_workers_on_exit:
        lines.append("workers are stopped when the sidecar exits (Ctrl-C)")
    else:
        lines.append(
            "workers keep running when the sidecar exits (stop_workers_on_exit = false): "
            "the next start adopts them; stop them first with gatekeeper undeploy ID (gatekeeper ps lists them)"
        )
    return {
        "url": url,
        "rehearsal": rehearsal,
        "declared_node": settings.gpus if declared else None,
        "state_dir": str(state),
        "admin_api": bool(settings.admin_token),
        "admin_token_source": token_source if settings.admin_token else None,
        "lines": lines,
    }


def _simulator() -> tuple[str, ...]:
    from gatekeeper.sidecar.rehearsal import SIMULATOR

    return tuple(SIMULATOR)
