"""How every ``gatekeeper`` command ends: its exit code, and its error as one line on
stderr or, with ``--json``, as one JSON object on stdout.

The exit codes are ``gatekeeper.cli.exit_codes``'s. An error becomes its code here, once:
``SidecarUnreachable`` 3; ``WorkerFailed`` 1; ``SidecarRefused`` 1 or 2 by the sidecar's status (a request
the sidecar found wrong is bad input, one it turned down is a rejection); every other
``GatekeeperError`` (a flag, a setting, a model reference) and argparse's usage errors 2.
With ``--json`` the error is ``{"error": {"code", "message", "field", "value"},
"exit_code": N}`` (plus the sidecar's ``decision`` and ``rehearsal`` when it sent them),
so a script reads stdout with one ``json.loads`` whatever happened.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gatekeeper import errors
from gatekeeper.cli.exit_codes import EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE
from gatekeeper.errors import GatekeeperError
from gatekeeper.settings import SettingsError

__all__ = [
    "EXIT_INTERNAL",
    "REHEARSAL_BANNER",
    "GpusUnreadable",
    "SidecarRefused",
    "SidecarUnreachable",
    "UsageError",
    "WorkerFailed",
    "error_code",
    "exit_code",
    "print_json",
    "report",
]

EXIT_INTERNAL = 70
"""A bug in gatekeeper (BSD's EX_SOFTWARE): one line, the traceback on request."""

REJECTED_STATUSES = frozenset({403, 409, 503, 507})
"""Sidecar answers that turn a valid request down (admin API off or model not allowed,
name taken, state directory unavailable or admission timed out, does not fit): exit 1.
Other 4xx answers (400, 401, 404, 413) say the request itself was wrong: exit 2."""


REHEARSAL_BANNER = (
    "REHEARSAL: this sidecar's workers are the gatekeeper simulator (not vLLM); nothing "
    "runs on a GPU and the memory it reports echoes the prediction"
)
"""The first line of what a command prints about a rehearsal sidecar."""


class UsageError(GatekeeperError):
    """argparse refused the command line (an unknown option, a missing argument)."""


class SidecarUnreachable(GatekeeperError):
    """No answer from the sidecar: connection refused, a timeout, a name that does not
    resolve, or something that does not speak HTTP there."""


class GpusUnreadable(GatekeeperError):
    """The GPUs could not be read (no driver, ``CUDA_VISIBLE_DEVICES`` naming a GPU that
    is not there): the settings do not fit this machine; a declared node does."""


class WorkerFailed(GatekeeperError):
    """A worker admitted and launched did not reach ready (``deploy --wait``)."""


class SidecarRefused(GatekeeperError):
    """The sidecar answered with an error (``status``, its ``type``, and the body)."""

    def __init__(self, status: int, message: str, kind: str, body: dict[str, Any]) -> None:
        error = body.get("error")
        error = error if isinstance(error, dict) else {}
        field = error.get("param", error.get("field"))
        super().__init__(f"{status}: {message}", field=field, value=error.get("value"))
        self.status = status
        self.kind = kind
        self.body = body


_CODES: tuple[tuple[type[GatekeeperError], str], ...] = (
    (UsageError, "usage"),
    (SettingsError, "settings"),
    (errors.HubError, "hub"),
    (errors.ModelSpecError, "model"),
    (errors.ServeOptionsError, "serve_options"),
    (errors.UnknownGpuError, "unknown_gpu"),
    (errors.NvmlUnavailable, "gpus_unreadable"),
    (GpusUnreadable, "gpus_unreadable"),
    (SidecarUnreachable, "sidecar_unreachable"),
    (WorkerFailed, "worker_failed"),
)


def error_code(e: BaseException) -> str:
    """The ``error.code`` of ``--json``: what kind of failure, as a stable word."""
    if isinstance(e, SidecarRefused):
        return e.kind
    if not isinstance(e, GatekeeperError):
        return "internal_error"
    return next((code for cls, code in _CODES if isinstance(e, cls)), "bad_input")


def exit_code(e: BaseException) -> int:
    if isinstance(e, SidecarUnreachable):
        return EXIT_UNREACHABLE
    if isinstance(e, WorkerFailed):
        return EXIT_REJECTED
    if isinstance(e, SidecarRefused):
        return EXIT_REJECTED if e.status in REJECTED_STATUSES or e.status >= 500 else EXIT_USAGE
    if isinstance(e, GatekeeperError):
        return EXIT_USAGE
    return EXIT_INTERNAL


def print_json(payload: object) -> None:
    print(json.dumps(payload, indent=2), flush=True)


def report(
    e: BaseException,
    *,
    as_json: bool,
    message: str | None = None,
    extra: dict[str, Any] | None = None,
) -> int:
    """End a command with ``e``: print it (one line on stderr, or the JSON object on
    stdout, with ``extra`` beside the error) and return its exit code."""
    code = exit_code(e)
    text = message or str(e)
    if as_json:
        field = getattr(e, "field", None)
        value = getattr(e, "value", None)
        payload: dict[str, Any] = {
            "error": {
                "code": error_code(e),
                "message": text,
                "field": field,
                "value": value if _is_json(value) else str(value),
            },
            "exit_code": code,
        }
        if isinstance(e, SidecarRefused):
            payload.update({k: e.body[k] for k in ("decision", "rehearsal") if k in e.body})
        print_json({**payload, **(extra or {})})
        return code
    rehearsal = isinstance(e, SidecarRefused) and e.body.get("rehearsal") is True
    if rehearsal:
        print(REHEARSAL_BANNER, file=sys.stderr)
    internal = "internal " if code == EXIT_INTERNAL else ""
    print(f"gatekeeper: {internal}error: {text}", file=sys.stderr)
    if isinstance(e, SidecarRefused):
        _print_decision(e.body.get("decision"))
    return code


def _print_decision(decision: Any) -> None:
    """A rejection's further reasons and the configurations that would fit."""
    if not isinstance(decision, dict):
        return
    for line in decision.get("reasons", [])[1:]:
        print(f"  - {line}", file=sys.stderr)
    for hint in decision.get("suggestions", []):
        print(f"  * {hint['text']}", file=sys.stderr)


def _is_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
