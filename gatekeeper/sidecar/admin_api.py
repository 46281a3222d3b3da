"""The admin API: deploy, list, inspect, stop and forget workers; read the GPUs.

A deployment's memory figures, ``predicted`` and ``actual``, share one naming scheme:
``<component>_bytes`` per GPU (``summary``). ``DELETE /admin/deployments/ID`` stops a
deployment and keeps it listed as ``stopped``; ``DELETE /admin/deployments/ID/record``
then forgets it (a stopped or failed one only; 409 while it is live).

Every route needs ``Authorization: Bearer <GATEKEEPER_ADMIN_TOKEN>``; without a
configured token the admin API is off (403). Every answer past the token check says
whether the sidecar is a rehearsal (``"rehearsal": true``: its workers are the
gatekeeper simulator, whose memory figures echo the prediction).

Errors are in the proxy's shape (``gatekeeper.proxy.protocol.error_response``):
``{"error": {"message", "type", "param", "code"}}``, the message naming the field, the
value and what to do, ``param`` the field. ``type`` says what happened, with the status:
400 ``bad_request`` (a body that is not a JSON object, a missing, unknown or mistyped
field, an invalid option, an unknown model), 401 ``unauthorized``, 403
``admin_disabled`` or ``model_not_allowed``, 404 and 409 ``deployment_error`` (unknown
deployment, name already deployed), 413 ``bad_request`` (body too large), 503
``state_unavailable`` (the state directory) or ``deployment_error`` (admission timed
out), 507 ``does_not_fit`` (with the decision's reasons and suggestions in
``decision``), 500 ``internal_error`` (a bug; the traceback goes to the sidecar's log).
``error.field`` and ``error.value`` are the earlier names of ``param`` and the value,
kept for one release (DEPRECATED: use ``param``).
"""

from __future__ import annotations

import asyncio
import difflib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.components import deprecated_actual_keys
from gatekeeper.proxy.protocol import error_response
from gatekeeper.settings import ModelEntry
from gatekeeper.sidecar.deployment import Deployment, DeploymentError
from gatekeeper.sidecar.ledger_file import LedgerError, LedgerLostError
from gatekeeper.sidecar.manager import DeploymentManager
from gatekeeper.sidecar.registry import ModelNotAllowed, ModelRegistry
from gatekeeper.sidecar.sleep import entry_idle
from gatekeeper.vllm.sleep_mode import IdleAction

__all__ = ["FIELD_HELP", "AdminApi", "DeployBody", "body_error", "field_help", "summary"]

MAX_BODY_BYTES = 1 << 20

log = logging.getLogger(__name__)


class DeployBody(BaseModel):
    """``POST /admin/deployments``.

    Each field's docstring is its description: in the OpenAPI schema, and in the 400
    that names the field (``field_help``), completing "give ...". The whole body is kept
    with the deployment (``Deployment.body``): recorded, read back by a sidecar that
    adopts the worker, and shown in its summary. A field added here needs no other edit
    to get that far."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = Field(min_length=1, max_length=512)
    """a configured model name or a hub repo id an allowed pattern matches, as a string
    ("Qwen/Qwen3-8B")"""
    name: str | None = Field(default=None, min_length=1, max_length=256)
    """the name clients will send as 'model', a non-empty string"""
    options: dict[str, Any] = Field(default_factory=dict)
    """an object of vllm serve flags by vLLM's names ({"max_model_len": 8192})"""
    min_sequences: int | None = Field(default=None, gt=0)
    """a whole number above 0 (sequences that must fit at max_model_len)"""
    min_kv_tokens: int | None = Field(default=None, gt=0)
    """a whole number above 0 (KV-cache tokens the placement must hold)"""
    idle_action: IdleAction | None = None
    """"stop" or "sleep" (what the worker becomes when idle; unset: the model's or the
    sidecar's idle_action)"""
    sleep_level: int | None = Field(default=None, ge=1, le=2)
    """1 (weights kept in host memory while asleep) or 2 (weights dropped); vLLM's level 0
    frees no GPU memory (unset: the model's or the sidecar's sleep_level)"""


def field_help(body: type[BaseModel]) -> dict[str, str]:
    """What each field of a deploy body takes (its description on one line), for the 400
    that names it."""
    return {
        name: " ".join((f.description or "a valid value").split())
        for name, f in body.model_fields.items()
    }


FIELD_HELP = field_help(DeployBody)
"""``field_help(DeployBody)``."""

MAX_LOG_OFFSET = 2**63 - 1
"""The largest offset ``GET /admin/deployments/ID/log`` takes (a file offset is an off_t)."""

EXAMPLE = '{"model": "NAME", "options": {"max_model_len": 8192}}'


def _error(
    status: int,
    message: str,
    *,
    kind: str,
    field: str | None = None,
    value: object = None,
    retry_after: float | None = None,
    **extra: Any,
) -> Response:
    """``error_response``'s answer (its shape and retry headers), with ``extra`` beside
    ``error`` (``decision``, ``rehearsal``) and the deprecated ``field``/``value``."""
    response = error_response(status, message, type=kind, param=field, retry_after=retry_after)
    body = json.loads(bytes(response.body))
    body["error"].update(field=field, value=_plain(value))
    body.update(extra)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _BODY_HEADERS}
    return JSONResponse(body, status_code=status, headers=headers)


_BODY_HEADERS = frozenset({"content-length", "content-type"})


def body_error(e: ValidationError, described: dict[str, str] = FIELD_HELP) -> tuple[str, str]:
    """(message, field) for a deploy body that did not validate: the field, the value
    given, and what to send instead (``described``: ``field_help`` of the body's type)."""
    first = e.errors(include_url=False)[0]
    loc = [str(p) for p in first["loc"]]
    given = _shown(first.get("input"))
    if first["type"] == "json_invalid":
        return f"the body is not valid JSON ({first['msg']}); send a JSON object: {EXAMPLE}", "body"
    if not loc:
        return (
            f"the body must be a JSON object, not {given}; send one such as {EXAMPLE}",
            "body",
        )
    field = ".".join(loc)
    top = loc[0]
    if first["type"] == "missing":
        return f"'{field}' is missing; give {described.get(top, 'it')}: {EXAMPLE}", field
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(top, described, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return (
            f"'{field}' (= {given}) is not a field of the deploy body; {hint}the fields are "
            f"{', '.join(described)}, and vllm serve flags go inside 'options'",
            field,
        )
    return (
        f"'{field}' = {given} is invalid ({first['msg']}); give {described.get(top, 'a valid value')}",
        field,
    )


def _shown(value: object, limit: int = 80) -> str:
    text = json.dumps(_plain(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


Handler = Callable[[Request], Awaitable[Response]]


class AdminApi:
    """The admin routes over one ``DeploymentManager``. ``body``: the deploy body's
    type, ``DeployBody`` or a model that extends it."""

    def __init__(
        self,
        manager: DeploymentManager,
        registry: ModelRegistry,
        token: str | None,
        body: type[DeployBody] = DeployBody,
    ) -> None:
        self.manager = manager
        self.registry = registry
        self.token = token
        self.rehearsal = manager.config.rehearsal
        self.body = body
        self.field_help = field_help(body)

    def _answer(self, body: dict[str, Any], status: int = 200) -> JSONResponse:
        return JSONResponse({**body, "rehearsal": self.rehearsal}, status_code=status)

    def _fail(self, status: int, message: str, **fields: Any) -> Response:
        """``_error`` (``kind``, ``field``, ``value``, extras) saying ``rehearsal``."""
        return _error(status, message, rehearsal=self.rehearsal, **fields)

    def routes(self) -> list[Route]:
        g = self._guard
        return [
            Route("/admin/deployments", g(self.create), methods=["POST"]),
            Route("/admin/deployments", g(self.list), methods=["GET"]),
            Route("/admin/deployments/{id}", g(self.show), methods=["GET"]),
            Route("/admin/deployments/{id}", g(self.delete), methods=["DELETE"]),
            Route("/admin/deployments/{id}/log", g(self.log), methods=["GET"]),
            Route("/admin/deployments/{id}/record", g(self.forget), methods=["DELETE"]),
            Route("/admin/gpus", g(self.gpus), methods=["GET"]),
        ]

    def _guard(self, handler: Handler) -> Handler:
        async def guarded(request: Request) -> Response:
            if not self.token:
                return _error(
                    403,
                    "the admin API is off: set GATEKEEPER_ADMIN_TOKEN to turn it on",
                    kind="admin_disabled",
                )
            given = request.headers.get("authorization", "")
            expected = f"Bearer {self.token}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return _error(
                    401,
                    "missing or wrong bearer token; send Authorization: Bearer <GATEKEEPER_ADMIN_TOKEN>",
                    kind="unauthorized",
                )
            try:
                return await handler(request)
            except ClientDisconnect:  # gone, or its body stalled (http_protocol answered 408)
                return Response(status_code=499)
            except Exception as e:  # every failure answers in the error shape
                return self._failure(request, e)

        return guarded

    def _failure(self, request: Request, e: Exception) -> Response:
        fail = self._fail
        retry_after = getattr(e, "retry_after", None)
        if isinstance(e, DeploymentError):
            kind, status = "deployment_error", e.status
        elif isinstance(e, LedgerLostError):  # recreated by the manager: retry shortly
            kind, status, retry_after = "state_unavailable", 503, 2
        elif isinstance(e, ModelNotAllowed):
            kind, status = "model_not_allowed", 403
        elif isinstance(e, LedgerError):  # the state directory, not the request
            kind, status = "state_unavailable", 503
        elif isinstance(e, GatekeeperError):
            kind, status = "bad_request", 400
        else:
            log.exception("admin API: %s %s failed", request.method, request.url.path)
            return fail(
                500,
                f"internal error in {request.method} {request.url.path}; the sidecar's log "
                "has the traceback: please report it with the request",
                kind="internal_error",
            )
        return fail(
            status,
            str(e),
            kind=kind,
            field=e.field,
            value=_plain(e.value),
            retry_after=retry_after,
        )

    async def create(self, request: Request) -> Response:
        body = await self._deploy_body(request)
        if isinstance(body, Response):
            return body
        entry = self._entry(body)
        placement_request = await asyncio.to_thread(self.registry.request, entry, body.options)
        decision, deployment = await self.manager.deploy(
            entry.name,
            placement_request,
            body=body.model_dump(mode="json"),
            idle=entry_idle(entry, self.manager.config.idle),
        )
        if deployment is None:
            reason = decision.reasons[0] if decision.reasons else "it does not fit"
            return self._fail(
                507,
                f"{entry.name} does not fit on this node: {reason}",
                kind="does_not_fit",
                decision=decision.to_json(),
            )
        return self._answer(
            {"deployment": summary(deployment), "decision": decision.to_json()}, status=201
        )

    async def _deploy_body(self, request: Request) -> DeployBody | Response:
        """The deploy body, or the 413 or 400 that says what to send instead."""
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return self._fail(
                413,
                f"the body is {len(raw)} bytes, more than the {MAX_BODY_BYTES} the admin API "
                f"reads; send only the deployment: {EXAMPLE}",
                kind="bad_request",
                field="body",
            )
        try:
            return self.body.model_validate_json(raw)
        except ValidationError as e:
            message, field = body_error(e, self.field_help)
            first = e.errors()[0]
            given = first.get("input") if field != "body" and first["type"] != "missing" else None
            return self._fail(400, message, kind="bad_request", field=field, value=_plain(given))

    def _entry(self, body: DeployBody) -> ModelEntry:
        """The allowed model's entry, with the body's name and minimums over its own."""
        entry = self.registry.allowed(body.model)
        if body.name:
            entry = entry.model_copy(update={"name": body.name})
        for field in ("idle_action", "sleep_level"):
            if getattr(body, field) is not None:
                entry = entry.model_copy(update={field: getattr(body, field)})
        if body.min_sequences or body.min_kv_tokens:
            entry = entry.model_copy(
                update={
                    "min_sequences": body.min_sequences or entry.min_sequences,
                    "min_kv_tokens": body.min_kv_tokens or entry.min_kv_tokens,
                }
            )
        return entry

    async def list(self, request: Request) -> Response:
        m = self.manager
        return self._answer(
            {"deployments": [summary(d, m.in_flight(d.id)) for d in m.deployments.values()]}
        )

    async def show(self, request: Request) -> Response:
        d = self.manager.get(request.path_params["id"])
        return self._answer(summary(d, self.manager.in_flight(d.id)))

    async def delete(self, request: Request) -> Response:
        d = await self.manager.undeploy(request.path_params["id"])
        return self._answer(summary(d))

    async def forget(self, request: Request) -> Response:
        """Drop a stopped or failed deployment from the list; 409 for a live one."""
        return self._answer(summary(self.manager.forget(request.path_params["id"])))

    async def log(self, request: Request) -> Response:
        d = self.manager.get(request.path_params["id"])
        given = request.query_params.get("offset", "0")
        try:
            offset = max(0, int(given))
        except ValueError:
            offset = -1
        if not 0 <= offset <= MAX_LOG_OFFSET:  # a file offset is a signed 64-bit number
            return self._fail(
                400,
                f"offset = {given[:40]!r} is not a whole number of bytes from 0 to "
                f"{MAX_LOG_OFFSET}; send ?offset=0 first, then the offset the last answer gave",
                kind="bad_request",
                field="offset",
                value=given[:40],
            )
        lines, new_offset = _read_log(d.worker.spec.log_path if d.worker else None, offset)
        return self._answer({"offset": new_offset, "lines": lines, **summary(d)})

    async def gpus(self, request: Request) -> Response:
        snapshot = await self.manager.snapshot()
        reserved = (await asyncio.to_thread(self.manager.ledger.view)).promised
        data = snapshot.to_dict()
        for gpu in data.get("gpus", []):
            gpu["reserved_by_gatekeeper_bytes"] = reserved.get(gpu.get("uuid", ""), 0)
        return self._answer(data)


def summary(d: Deployment, in_flight: int = 0) -> dict[str, Any]:
    """A deployment as the admin API shows it: ``predicted`` and ``actual`` under one
    naming scheme, ``<component>_bytes`` per GPU (``weights_bytes``, ``kv_cache_bytes``,
    ``activation_peak_bytes``, ``non_torch_bytes``, ``cuda_graph_bytes``: the fields of
    ``gatekeeper.estimator.components``). ``actual`` keeps its earlier bare keys
    (``weights``, ``activation_peak``, ...) for one release, DEPRECATED: ``deprecated``
    maps each one present to the key that replaces it."""
    out = d.summary(in_flight)
    actual = out.get("actual") or {}
    old = {k: new for k, new in deprecated_actual_keys().items() if k in actual}
    out["actual"] = {**actual, **{new: actual[k] for k, new in old.items()}}
    out["deprecated"] = {f"actual.{k}": f"actual.{new}" for k, new in old.items()}
    return out


def _read_log(path: Any, offset: int, limit: int = 256 * 1024) -> tuple[list[str], int]:
    if path is None:
        return [], offset
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
    except OSError:
        return [], offset
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode("utf-8", "replace").splitlines(), offset + cut


def _plain(value: object) -> object:
    """``value`` as strict JSON can carry it: NaN, infinities and objects as text."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value
