"""The operator commands that talk to a running sidecar's admin API: ``deploy``, ``ps``
(live deployments; ``--all`` adds the stopped and failed ones), ``undeploy`` and
``forget`` (drop stopped or failed ones from the list).

Each ends as every command does (``gatekeeper.cli.output``): 0 done; 1 the sidecar
turned the request down (does not fit, not allowed, name taken) or the worker failed to
start; 2 the request was wrong (a bad flag or option, an unknown model or deployment, a
wrong token); 3 the sidecar could not be reached. With ``--json`` stdout is one JSON
object. When the sidecar is a rehearsal (its workers are the gatekeeper simulator; the
admin API says ``"rehearsal": true``), the output says REHEARSAL on its first line, or
``"rehearsal": true`` in JSON, and the "actual" memory is labelled simulated: the
simulator reports the prediction back.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gatekeeper.cli.options import add_serving_flags, positive_int, serve_command
from gatekeeper.cli.output import (
    REHEARSAL_BANNER,
    SidecarRefused,
    SidecarUnreachable,
    UsageError,
    WorkerFailed,
    print_json,
)
from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.components import MEMORY_COMPONENTS
from gatekeeper.settings import Settings
from gatekeeper.units import format_gib

__all__ = ["SidecarClient", "add_parser"]


def add_parser(subparsers: Any) -> None:
    d = subparsers.add_parser("deploy", help="admit and launch a model through the admin API")
    d.add_argument("model", nargs="?", help="or `model:` in a --config file")
    d.add_argument("--name", default=None, help="the name clients use (default: the model)")
    add_serving_flags(d)
    d.add_argument(
        "--min-sequences",
        type=positive_int("--min-sequences"),
        help="KV cache for at least N sequences of max_model_len (default: the model's "
        "setting, else 1)",
    )
    d.add_argument(
        "--min-kv-tokens",
        type=positive_int("--min-kv-tokens"),
        help="KV cache for at least this many tokens (with --min-sequences: the larger)",
    )
    d.add_argument("--wait", action="store_true", help="follow the start-up until ready")
    _client_flags(d)
    d.set_defaults(func=run_deploy)
    p = subparsers.add_parser(
        "ps",
        help="list live deployments",
        description="List the sidecar's live deployments; --all adds the stopped and failed "
        "ones it still remembers (gatekeeper forget drops them).",
    )
    p.add_argument("--all", action="store_true", help="stopped and failed deployments too")
    _client_flags(p)
    p.set_defaults(func=run_ps)
    f = subparsers.add_parser(
        "forget",
        help="drop stopped or failed deployments from the list",
        description="Forget stopped or failed deployments (DELETE /admin/deployments/ID/"
        "record); a live one is refused: undeploy it first.",
    )
    f.add_argument("ids", nargs="*", metavar="ID", help="deployments to forget")
    f.add_argument(
        "--all", action="store_true", help="every stopped and failed deployment (ps --all)"
    )
    _client_flags(f)
    f.set_defaults(func=run_forget)
    u = subparsers.add_parser("undeploy", help="drain and stop a deployment")
    u.add_argument("id", metavar="ID", help="the deployment's ID (gatekeeper ps lists them)")
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
    p.add_argument("--json", action="store_true", help="print one JSON object (errors too)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for each answer (default 60; undeploy 600, it drains); "
        "past it the sidecar counts as unreachable (exit code 3)",
    )


class SidecarClient:
    """The admin API over HTTP; every failure becomes the error that gives its exit code."""

    def __init__(self, args: argparse.Namespace, settings: Settings) -> None:
        from gatekeeper.cli.serve import stored_token

        self.url = (args.url or f"http://{settings.host}:{settings.port}").rstrip("/")
        token = args.token or settings.admin_token or stored_token(settings)
        if not token:
            raise GatekeeperError(
                "admin token: none given; pass --token or set GATEKEEPER_ADMIN_TOKEN",
                field="token",
            )
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout: float | None = args.timeout
        if self.timeout is not None and not self.timeout > 0:
            raise GatekeeperError(
                f"--timeout: {self.timeout} must be a positive number of seconds",
                field="timeout",
                value=self.timeout,
            )

    def call(
        self, method: str, path: str, *, ok: int = 200, timeout: float = 60.0, **kw: Any
    ) -> dict[str, Any]:
        """The JSON object the sidecar answered with status ``ok``."""
        import httpx

        url = f"{self.url}{path}"
        timeout = self.timeout or timeout
        try:
            response = httpx.request(method, url, headers=self.headers, timeout=timeout, **kw)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as e:
            raise GatekeeperError(
                f"url: {self.url!r} is not an http:// or https:// URL ({e}); give one such "
                "as http://127.0.0.1:8080 with --url",
                field="url",
                value=self.url,
            ) from None
        except httpx.TransportError as e:
            raise SidecarUnreachable(
                f"sidecar: cannot reach {self.url} ({type(e).__name__}: {e or 'no answer'}); "
                "start it with `gatekeeper serve`, or point --url (or GATEKEEPER_HOST and "
                "GATEKEEPER_PORT) at it",
                field="url",
                value=self.url,
            ) from None
        body = _json_object(response)
        if response.status_code != ok:
            error = body.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            kind = error.get("type") if isinstance(error, dict) else None
            raise SidecarRefused(
                response.status_code,
                str(message or response.text.strip() or response.reason_phrase),
                str(kind or "http_error"),
                body,
            )
        if not body:
            raise SidecarUnreachable(
                f"sidecar: {url} answered {response.status_code} without a JSON object; is "
                "--url a gatekeeper sidecar?",
                field="url",
                value=self.url,
            )
        return body


def _json_object(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _banner(rehearsal: bool, *, to_stderr: bool = False) -> None:
    if rehearsal:
        print(REHEARSAL_BANNER, file=sys.stderr if to_stderr else sys.stdout)


def actual_label(rehearsal: bool) -> str:
    """The heading of measured memory: the simulator echoes the prediction."""
    return "actual (simulated)" if rehearsal else "actual (vLLM log)"


# -- deploy ----------------------------------------------------------------------------


def run_deploy(args: argparse.Namespace, settings: Settings) -> int:
    client = SidecarClient(args, settings)
    options = _options_dict(args)  # reads a --config file's model into args.model
    body: dict[str, Any] = {"model": args.model, "options": options}
    for key in ("name", "min_sequences", "min_kv_tokens"):
        if getattr(args, key):
            body[key] = getattr(args, key)
    start = time.monotonic()
    data = client.call("POST", "/admin/deployments", ok=201, json=body)
    rehearsal = bool(data.get("rehearsal"))
    dep = data["deployment"]
    lines = [
        f"[{time.monotonic() - start:6.1f}s] admitted {dep['name']} as {dep['id']} on GPU "
        + ",".join(map(str, dep["gpus"])),
        f"          {'simulator (as ' if rehearsal else ''}vllm serve "
        f"{' '.join(dep['vllm_args'])}{')' if rehearsal else ''}",
        *_sizing_line(data.get("decision")),
        *(f"          warning: {w}" for w in dep.get("warnings") or []),
    ]
    if not args.json:
        _banner(rehearsal)
        print("\n".join(lines), flush=True)
    if args.wait:
        if args.json:
            _banner(rehearsal, to_stderr=True)
            print("\n".join(lines), file=sys.stderr, flush=True)
        data["deployment"] = _follow(client, dep["id"], start, progress_to_stderr=args.json)
        if not args.json:
            _print_memory(data["deployment"], rehearsal)
    if args.json:
        print_json({**data, "rehearsal": rehearsal})
    return 0


def _sizing_line(decision: Any) -> list[str]:
    """How placement sized the worker, in its words ("KV cache 3.00 GiB sized for 8
    sequences of 32768 tokens"), and what it promised per GPU; none from a sidecar that
    does not say."""
    placement = decision.get("placement") if isinstance(decision, dict) else None
    if not isinstance(placement, dict) or not isinstance(placement.get("sizing"), str):
        return []
    sizing, promised = placement["sizing"], max(placement.get("promise_bytes") or [0])
    return [f"          {sizing}, promised {format_gib(promised)} per GPU"]


def _options_dict(args: argparse.Namespace) -> dict[str, Any]:
    """Only the serving flags the operator gave, by vLLM's names (the sidecar checks them
    and fills in the rest)."""
    out = dict(serve_command(args).values)
    if args.vllm_version:
        out["vllm_version"] = args.vllm_version
    if args.embedded:
        out["embedded"] = True
    return out


def _follow(
    client: SidecarClient, deployment_id: str, start: float, *, progress_to_stderr: bool
) -> dict[str, Any]:
    """The deployment once ready (its summary), printing each phase on the way; a worker
    that fails or stops raises ``WorkerFailed``."""
    offset, last = 0, ""
    out = sys.stderr if progress_to_stderr else sys.stdout
    while True:
        data = client.call(
            "GET", f"/admin/deployments/{deployment_id}/log", params={"offset": offset}
        )
        offset = data["offset"]
        label = data["phase"] or data["state"]
        if label != last:
            print(f"[{time.monotonic() - start:6.1f}s] {label}", file=out, flush=True)
            last = label
        if data["state"] == "ready":
            return {k: v for k, v in data.items() if k not in ("lines", "offset", "rehearsal")}
        if data["state"] in ("failed", "stopped"):
            raise WorkerFailed(
                f"deployment {deployment_id} {data['state']}: {data['error']}",
                field="deployment",
                value=deployment_id,
            )
        time.sleep(0.3)


def _print_memory(deployment: dict[str, Any], rehearsal: bool) -> None:
    predicted, actual = deployment.get("predicted") or {}, deployment.get("actual") or {}
    label = actual_label(rehearsal)
    print(f"  {'component':<18}{'predicted':>14}{label:>20}")
    for c in MEMORY_COMPONENTS:
        p, a = predicted.get(c.field), actual.get(c.field)
        shown_p = format_gib(p) if p is not None else "-"
        shown_a = format_gib(a) if a is not None else "-"
        print(f"  {c.label:<18}{shown_p:>14}{shown_a:>20}")


# -- ps, undeploy ----------------------------------------------------------------------


def run_ps(args: argparse.Namespace, settings: Settings) -> int:
    from gatekeeper.metrics.worker_states import FINISHED_STATES  # its face loads Prometheus

    data = SidecarClient(args, settings).call("GET", "/admin/deployments")
    rehearsal = bool(data.get("rehearsal"))
    shown = [d for d in data["deployments"] if args.all or d["state"] not in FINISHED_STATES]
    if args.json:
        print_json({"deployments": shown, "rehearsal": rehearsal})
        return 0
    _banner(rehearsal)
    actual = actual_label(rehearsal).upper()
    print(
        f"{'ID':<30} {'NAME':<36} {'STATE':<9} {'GPUS':<6} {'PORT':<6} {'UPTIME':>8} "
        f"{'PREDICTED':>11} {actual:>20}"
    )
    for d in shown:
        uptime = f"{d['uptime_seconds']:.0f}s" if d.get("uptime_seconds") else "-"
        gpus = ",".join(map(str, d["gpus"]))
        print(
            f"{d['id']:<30} {d['name'][:36]:<36} {d['state']:<9} {gpus:<6} {d['port']:<6} "
            f"{uptime:>8} {_total(d.get('predicted')):>11} {_total(d.get('actual')):>20}"
        )
    for d in shown:
        if d["state"] == "sleeping":
            print(_asleep_line(d))
    for did, warning in ((s["id"], w) for s in shown for w in s.get("warnings") or []):
        print(f"warning: {did}: {warning}")
    hidden = len(data["deployments"]) - len(shown)
    if hidden:
        print(
            f"({hidden} stopped or failed not shown: ps --all lists them, forget --all drops them)"
        )
    return 0


def _asleep_line(d: dict[str, Any]) -> str:
    """What a sleeping deployment holds: GPU bytes (vLLM's residue) and host bytes."""
    level = d.get("sleep_level")
    host = d.get("host_asleep_bytes") or 0
    where = "its weights in host memory" if level == 1 else "its weights dropped"
    return (
        f"sleeping: {d['id']}: level {level}, holds {format_gib(d.get('gpu_bytes') or 0)} of "
        f"GPU memory and {format_gib(host)} of host memory ({where}); a request wakes it"
    )


def _total(figures: Any) -> str:
    """The sum of a deployment's memory components per GPU, in GiB, or '-'."""
    if not isinstance(figures, dict):
        return "-"
    values = [figures.get(c.field) for c in MEMORY_COMPONENTS]
    known = [v for v in values if isinstance(v, int)]
    return format_gib(sum(known)) if known else "-"


def run_forget(args: argparse.Namespace, settings: Settings) -> int:
    from gatekeeper.metrics.worker_states import FINISHED_STATES

    client = SidecarClient(args, settings)
    ids = list(args.ids)
    if args.all:
        listed = client.call("GET", "/admin/deployments")["deployments"]
        ids += [d["id"] for d in listed if d["state"] in FINISHED_STATES and d["id"] not in ids]
    elif not ids:
        raise UsageError(
            "forget: no deployment given; name IDs (gatekeeper ps --all lists them) or pass "
            "--all for every stopped and failed one",
            field="ids",
        )
    rehearsal = False
    forgotten = []
    for deployment_id in ids:
        data = _on_deployment(client, "DELETE", deployment_id, "/record")
        rehearsal = bool(data.pop("rehearsal", False))
        forgotten.append(data)
    if args.json:
        print_json({"forgotten": forgotten, "rehearsal": rehearsal})
        return 0
    _banner(rehearsal)
    for d in forgotten:
        print(f"forgot {d['id']} ({d['state']})")
    return 0


def run_undeploy(args: argparse.Namespace, settings: Settings) -> int:
    client = SidecarClient(args, settings)
    data = _on_deployment(client, "DELETE", args.id, timeout=600.0)
    rehearsal = bool(data.pop("rehearsal", False))
    if args.json:
        print_json({"deployment": data, "rehearsal": rehearsal})
        return 0
    _banner(rehearsal)
    print(f"stopped {args.id}")
    return 0


_FEW = 5
"""Up to this many deployments, a not-found hint names them all."""


def _on_deployment(
    client: SidecarClient, method: str, deployment_id: str, tail: str = "", **kw: Any
) -> dict[str, Any]:
    """``method`` on one deployment; a 404 (no such deployment) says what exists the
    CLI's way: run ``gatekeeper ps``, and the deployments when there are few (a name
    given for an ID: the ID it stands for)."""
    try:
        return client.call(method, f"/admin/deployments/{deployment_id}{tail}", **kw)
    except SidecarRefused as e:
        if e.status != 404:
            raise
        raise SidecarRefused(404, _not_found(client, deployment_id), e.kind, e.body) from None


def _not_found(client: SidecarClient, deployment_id: str) -> str:
    message = f"deployment {deployment_id!r} does not exist"
    try:
        known = client.call("GET", "/admin/deployments", timeout=10.0)["deployments"]
    except (GatekeeperError, KeyError, TypeError):
        known = None
    named = [d for d in known or () if d.get("name") == deployment_id]
    if named:
        ids = ", ".join(d["id"] for d in named)
        return f"{message}; it is the name of {ids}: give the ID (gatekeeper ps lists them)"
    hint = "; run `gatekeeper ps` to list what is deployed (--all: stopped ones too)"
    if known is not None and len(known) <= _FEW:
        listed = ", ".join(f"{d['id']} ({d['name']}, {d['state']})" for d in known)
        hint += f"; the sidecar has {listed or 'none'}"
    return message + hint
