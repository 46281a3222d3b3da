"""The admin API: deploy, list, inspect and stop workers; read the GPUs.

Every route needs ``Authorization: Bearer <GATEKEEPER_ADMIN_TOKEN>``; without a
configured token the admin API is off (403). Errors are JSON ``{"error": {"message",
"type", "field", "value"}}`` with the status that says what happened: 400 bad input,
401 no or wrong token, 403 off or model not allowed, 404 unknown deployment, 409 name
already deployed, 507 does not fit (with the decision's reasons and suggestions).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gatekeeper.errors import GatekeeperError
from gatekeeper.sidecar.deployment import DeploymentError
from gatekeeper.sidecar.ledger import LedgerError, promised_bytes
from gatekeeper.sidecar.manager import DeploymentManager
from gatekeeper.sidecar.registry import ModelNotAllowed, ModelRegistry

__all__ = ["AdminApi", "DeployBody"]

MAX_BODY_BYTES = 1 << 20


class DeployBody(BaseModel):
    """``POST /admin/deployments``."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=512)
    """A configured model name, or a reference an allowed pattern matches."""
    name: str | None = Field(default=None, min_length=1, max_length=256)
    options: dict[str, Any] = Field(default_factory=dict)
    min_sequences: int | None = Field(default=None, gt=0)
    min_kv_tokens: int | None = Field(default=None, gt=0)


def _error(
    status: int,
    message: str,
    *,
    kind: str,
    field: str | None = None,
    value: object = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "error": {"message": message, "type": kind, "field": field, "value": value}
    }
    body.update(extra)
    return JSONResponse(body, status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


class AdminApi:
    def __init__(
        self, manager: DeploymentManager, registry: ModelRegistry, token: str | None
    ) -> None:
        self.manager = manager
        self.registry = registry
        self.token = token

    def routes(self) -> list[Route]:
        g = self._guard
        return [
            Route("/admin/deployments", g(self.create), methods=["POST"]),
            Route("/admin/deployments", g(self.list), methods=["GET"]),
            Route("/admin/deployments/{id}", g(self.show), methods=["GET"]),
            Route("/admin/deployments/{id}", g(self.delete), methods=["DELETE"]),
            Route("/admin/deployments/{id}/log", g(self.log), methods=["GET"]),
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
            except DeploymentError as e:
                return _error(
                    e.status, str(e), kind="deployment_error", field=e.field, value=_plain(e.value)
                )
            except ModelNotAllowed as e:
                return _error(
                    403, str(e), kind="model_not_allowed", field=e.field, value=_plain(e.value)
                )
            except LedgerError as e:  # the state directory, not the request
                return _error(
                    503, str(e), kind="state_unavailable", field=e.field, value=_plain(e.value)
                )
            except GatekeeperError as e:
                return _error(400, str(e), kind="bad_request", field=e.field, value=_plain(e.value))

        return guarded

    async def create(self, request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return _error(
                413, f"body of {len(raw)} bytes is larger than {MAX_BODY_BYTES}", kind="bad_request"
            )
        try:
            body = DeployBody.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "body"
            return _error(
                400,
                f'{field}: {first["msg"]}; send JSON like {{"model": "NAME", "options": {{"max_model_len": 8192}}}}',
                kind="bad_request",
                field=field,
            )
        entry = self.registry.allowed(body.model)
        if body.name:
            entry = entry.model_copy(update={"name": body.name})
        if body.min_sequences or body.min_kv_tokens:
            entry = entry.model_copy(
                update={
                    "min_sequences": body.min_sequences or entry.min_sequences,
                    "min_kv_tokens": body.min_kv_tokens or entry.min_kv_tokens,
                }
            )
        placement_request = await asyncio.to_thread(self.registry.request, entry, body.options)
        decision, deployment = await self.manager.deploy(entry.name, placement_request)
        if deployment is None:
            reason = decision.reasons[0] if decision.reasons else "it does not fit"
            return _error(
                507,
                f"{entry.name} does not fit on this node: {reason}",
                kind="does_not_fit",
                decision=decision.to_json(),
            )
        return JSONResponse(
            {"deployment": deployment.summary(), "decision": decision.to_json()}, status_code=201
        )

    async def list(self, request: Request) -> Response:
        m = self.manager
        return JSONResponse(
            {"deployments": [d.summary(m.in_flight(d.id)) for d in m.deployments.values()]}
        )

    async def show(self, request: Request) -> Response:
        d = self.manager.get(request.path_params["id"])
        return JSONResponse(d.summary(self.manager.in_flight(d.id)))

    async def delete(self, request: Request) -> Response:
        d = await self.manager.undeploy(request.path_params["id"])
        return JSONResponse(d.summary())

    async def log(self, request: Request) -> Response:
        d = self.manager.get(request.path_params["id"])
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            return _error(
                400, "offset: must be an integer byte offset", kind="bad_request", field="offset"
            )
        lines, new_offset = _read_log(d.worker.spec.log_path if d.worker else None, offset)
        return JSONResponse({"offset": new_offset, "lines": lines, **d.summary()})

    async def gpus(self, request: Request) -> Response:
        snapshot = await self.manager.snapshot()
        reserved = promised_bytes(await asyncio.to_thread(self.manager.ledger.outstanding))
        data = snapshot.to_dict()
        for gpu in data.get("gpus", []):
            gpu["reserved_by_gatekeeper_bytes"] = reserved.get(gpu.get("uuid", ""), 0)
        return JSONResponse(data)


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
