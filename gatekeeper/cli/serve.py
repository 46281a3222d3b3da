"""``gatekeeper serve`` (the sidecar) and the operator commands that talk to its admin
API: ``deploy``, ``ps``, ``undeploy``."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatekeeper.cli.options import add_serving_flags, positive_int, serve_command
from gatekeeper.errors import GatekeeperError
from gatekeeper.models.catalog import catalog_entries
from gatekeeper.settings import Settings, gpu_source
from gatekeeper.units import format_gib

if TYPE_CHECKING:  # loaded by the commands that use them, not by every CLI start
    import httpx

__all__ = ["add_parser"]

REHEARSAL_NODE = "2xH100-80GB"


def add_parser(subparsers: Any) -> None:
    s = subparsers.add_parser("serve", help="run the sidecar: admin API, OpenAI proxy, workers")
    s.add_argument("--host", default=None, help="listen address (default: settings, 127.0.0.1)")
    s.add_argument("--port", type=int, default=None)
    s.add_argument(
        "--rehearsal",
        action="store_true",
        help="no GPU needed: a declared node, the catalog, and the simulator as the worker",
    )
    s.set_defaults(func=run_serve)
    d = subparsers.add_parser("deploy", help="admit and launch a model through the admin API")
    d.add_argument("model")
    d.add_argument("--name", default=None, help="the name clients use (default: the model)")
    add_serving_flags(d)
    d.add_argument("--min-sequences", type=positive_int("--min-sequences"))
    d.add_argument("--min-kv-tokens", type=positive_int("--min-kv-tokens"))
    d.add_argument("--wait", action="store_true", help="follow the start-up until ready")
    _client_flags(d)
    d.set_defaults(func=run_deploy)
    p = subparsers.add_parser("ps", help="list deployments")
    _client_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_ps)
    u = subparsers.add_parser("undeploy", help="drain and stop a deployment")
    u.add_argument("id")
    _client_flags(u)
    u.set_defaults(func=run_undeploy)


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url", default=None, help="the sidecar (default: http://HOST:PORT from settings)"
    )
    p.add_argument(
        "--token",
        default=None,
        help="admin token (default: GATEKEEPER_ADMIN_TOKEN or the rehearsal's)",
    )


# -- serve -----------------------------------------------------------------------------


def rehearsal_settings(settings: Settings) -> Settings:
    """The embedded default: a declared node, the catalog allowed, the simulator as worker."""
    state = settings.state_dir.expanduser() / "rehearsal"
    token = settings.admin_token or _stored_token(state) or secrets.token_urlsafe(24)
    state.mkdir(parents=True, exist_ok=True)
    token_file = state / "admin-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return settings.model_copy(
        update={
            "state_dir": state,
            "gpus": settings.gpus if gpu_source(settings).is_declared else REHEARSAL_NODE,
            "worker_command": list(_simulator()),
            "admin_token": token,
            "allowed_models": settings.allowed_models or [e.repo_id for e in catalog_entries()],
            "restart_backoff_seconds": min(settings.restart_backoff_seconds, 1.0),
            "startup_timeout_seconds": min(settings.startup_timeout_seconds, 120.0),
        }
    )


def _stored_token(state: Path) -> str | None:
    path = state / "admin-token"
    return path.read_text().strip() if path.is_file() else None


def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from gatekeeper.sidecar.app import build_app
    from gatekeeper.sidecar.header_deadline import header_deadline_protocol
    from gatekeeper.sidecar.ledger import Ledger, ledger_path

    if args.rehearsal:
        settings = rehearsal_settings(settings)
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
    inventory = source.inventory(visible_devices=visible)
    # Bound before the app exists: a port already taken ends the command here, before the
    # lifespan adopts or launches any worker (uvicorn.run binds only after the lifespan).
    sock = _bind(host, port)
    state = settings.state_dir.expanduser()
    state.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path(state))
    app = build_app(settings, inventory, ledger, rehearsal=declared)
    _banner(settings, host, port, declared, args.rehearsal)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        http=header_deadline_protocol(settings.request_header_timeout_seconds),
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        ledger.close()
        close = getattr(inventory, "close", None)
        if close is not None:
            close()
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The sidecar's listening socket, bound and listening, or a clear error naming the
    address and what to do."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise GatekeeperError(
            f"host: {host!r} cannot be resolved ({e.strerror}); give an address such as "
            "127.0.0.1 or 0.0.0.0 with --host or GATEKEEPER_HOST",
            field="host",
        ) from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
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


def _banner(settings: Settings, host: str, port: int, declared: bool, rehearsal: bool) -> None:
    lines = [f"gatekeeper sidecar on http://{host}:{port} (OpenAI proxy /v1, admin API /admin)"]
    if rehearsal:
        lines.append(
            f"REHEARSAL: declared node {settings.gpus}, workers are the gatekeeper simulator "
            "(not vLLM); nothing runs on a GPU"
        )
    elif declared:
        lines.append(f"declared node {settings.gpus}: placement follows the declaration, not NVML")
    lines.append(f"state directory: {settings.state_dir.expanduser()}")
    if settings.admin_token:
        where = settings.state_dir.expanduser() / "admin-token"
        shown = f"in {where}" if rehearsal else "from GATEKEEPER_ADMIN_TOKEN"
        lines.append(
            f"admin token {shown}; export GATEKEEPER_ADMIN_TOKEN=$(cat {where})"
            if rehearsal
            else f"admin token {shown}"
        )
    else:
        lines.append("admin API off: set GATEKEEPER_ADMIN_TOKEN to turn it on")
    print("\n".join(lines), flush=True)


# -- operator commands -----------------------------------------------------------------


def _endpoint(args: argparse.Namespace, settings: Settings) -> tuple[str, dict[str, str]]:
    url = args.url or f"http://{settings.host}:{settings.port}"
    token = (
        args.token
        or settings.admin_token
        or _stored_token(settings.state_dir.expanduser() / "rehearsal")
    )
    if not token:
        raise GatekeeperError(
            "admin token: none given; pass --token or set GATEKEEPER_ADMIN_TOKEN", field="token"
        )
    return url.rstrip("/"), {"Authorization": f"Bearer {token}"}


def _simulator() -> tuple[str, ...]:
    from gatekeeper.sidecar.rehearsal import SIMULATOR

    return tuple(SIMULATOR)


def _call(method: str, url: str, headers: dict[str, str], **kw: Any) -> httpx.Response:
    import httpx

    try:
        return httpx.request(method, url, headers=headers, timeout=kw.pop("timeout", 60.0), **kw)
    except httpx.TransportError as e:
        raise GatekeeperError(
            f"sidecar: cannot reach {url} ({type(e).__name__}); start it with `gatekeeper serve` "
            "or pass --url", field="url", value=url,
        ) from e  # fmt: skip


def _fail(response: httpx.Response) -> int:
    """One line with the sidecar's error, then a rejection's reasons and suggestions."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    message = (body.get("error") or {}).get("message") or response.text
    print(f"gatekeeper: error: {response.status_code}: {message}", file=sys.stderr)
    decision = body.get("decision")
    if decision:
        for line in decision.get("reasons", [])[1:]:
            print(f"  - {line}", file=sys.stderr)
        for hint in decision.get("suggestions", []):
            print(f"  * {hint['text']}", file=sys.stderr)
    return 1


def run_deploy(args: argparse.Namespace, settings: Settings) -> int:
    url, headers = _endpoint(args, settings)
    options = _options_dict(args)
    body: dict[str, Any] = {"model": args.model, "options": options}
    if args.name:
        body["name"] = args.name
    if args.min_sequences:
        body["min_sequences"] = args.min_sequences
    if args.min_kv_tokens:
        body["min_kv_tokens"] = args.min_kv_tokens
    start = time.monotonic()
    response = _call("POST", f"{url}/admin/deployments", headers, json=body)
    if response.status_code != 201:
        return _fail(response)
    data = response.json()
    dep = data["deployment"]
    print(
        f"[{time.monotonic() - start:6.1f}s] admitted {dep['name']} as {dep['id']} on GPU {','.join(map(str, dep['gpus']))}"
    )
    print(f"          vllm serve {' '.join(dep['vllm_args'])}")
    if not args.wait:
        return 0
    return _follow(url, headers, dep["id"], start)


def _options_dict(args: argparse.Namespace) -> dict[str, Any]:
    """Only the serving flags the operator gave, by vLLM's names (the sidecar checks them
    and fills in the rest)."""
    out = dict(serve_command(args).values)
    if args.vllm_version:
        out["vllm_version"] = args.vllm_version
    if args.embedded:
        out["embedded"] = True
    return out


def _follow(url: str, headers: dict[str, str], deployment_id: str, start: float) -> int:
    offset, last = 0, ""
    while True:
        response = _call(
            "GET",
            f"{url}/admin/deployments/{deployment_id}/log",
            headers,
            params={"offset": offset},
        )
        if response.status_code != 200:
            return _fail(response)
        data = response.json()
        offset = data["offset"]
        label = data["phase"] or data["state"]
        if label != last:
            print(f"[{time.monotonic() - start:6.1f}s] {label}")
            last = label
        if data["state"] == "ready":
            _print_memory(data)
            return 0
        if data["state"] in ("failed", "stopped"):
            print(f"gatekeeper: error: {data['error']}", file=sys.stderr)
            return 1
        time.sleep(0.3)


def _print_memory(data: dict[str, Any]) -> None:
    predicted, actual = data.get("predicted") or {}, data.get("actual") or {}
    print(f"  {'component':<18}{'predicted':>14}{'actual (vLLM log)':>20}")
    for name in ("weights", "kv_cache", "activation_peak", "non_torch", "cuda_graph"):
        p = predicted.get(f"{name}_bytes")
        a = actual.get(name)
        print(
            f"  {name:<18}{format_gib(p) if p is not None else '-':>14}{format_gib(a) if a is not None else '-':>20}"
        )


def run_ps(args: argparse.Namespace, settings: Settings) -> int:
    url, headers = _endpoint(args, settings)
    response = _call("GET", f"{url}/admin/deployments", headers)
    if response.status_code != 200:
        return _fail(response)
    deployments = response.json()["deployments"]
    if args.json:
        print(json.dumps(deployments, indent=2))
        return 0
    print(f"{'ID':<30} {'NAME':<36} {'STATE':<9} {'GPUS':<6} {'PORT':<6} {'UPTIME':>8}")
    for d in deployments:
        uptime = f"{d['uptime_seconds']:.0f}s" if d.get("uptime_seconds") else "-"
        print(
            f"{d['id']:<30} {d['name'][:36]:<36} {d['state']:<9} {','.join(map(str, d['gpus'])):<6} {d['port']:<6} {uptime:>8}"
        )
    return 0


def run_undeploy(args: argparse.Namespace, settings: Settings) -> int:
    url, headers = _endpoint(args, settings)
    response = _call("DELETE", f"{url}/admin/deployments/{args.id}", headers, timeout=600.0)
    if response.status_code != 200:
        return _fail(response)
    print(f"stopped {args.id}")
    return 0
