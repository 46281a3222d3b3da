"""The OpenAPI schema of the sidecar's admin API and proxy (served at /openapi.json)."""

from __future__ import annotations

from typing import Any

from gatekeeper.proxy.protocol import FORM_ROUTES, JSON_ROUTES
from gatekeeper.sidecar.admin_api import DeployBody

__all__ = ["openapi_schema"]

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                **{k: {"type": ["string", "null"]} for k in ("message", "type", "param")},
                "code": {"type": ["string", "integer", "null"]},
                "field": {"type": ["string", "null"], "deprecated": True},
            },
        }
    },
}


_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]


def _op(
    summary: str,
    responses: dict[str, str],
    body: bool = False,
    secured: bool = True,
    api_key: bool = False,
    path_id: bool = False,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            code: {
                "description": text,
                "content": {
                    "application/json": {"schema": _ERROR if code >= "400" else {"type": "object"}}
                },
            }
            for code, text in responses.items()
        },
    }
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/DeployBody"}}
            },
        }
    if secured:
        op["security"] = [{"bearer": []}]
    if api_key:
        # optional: an empty requirement means "no key" is accepted when api_keys is unset
        op["security"] = [{}, {"api_key": []}]
    if path_id:
        op["parameters"] = _ID
    return op


def _proxy_paths(openai: dict[str, str]) -> dict[str, Any]:
    """vLLM's routes the proxy passes through (``gatekeeper.proxy.protocol``)."""

    def op(summary: str, responses: dict[str, str], params: tuple[str, ...] = ()) -> Any:
        found = _op(summary, responses, secured=False, api_key=True)
        if params:
            found["parameters"] = [{**_ID[0], "name": name} for name in params]
        return found

    paths: dict[str, Any] = {
        path: {"post": op(f"vLLM's {path}, routed by the body's model", openai)}
        for path in JSON_ROUTES
    }
    for path in FORM_ROUTES:
        paths[path] = {"post": op(f"vLLM's {path} (multipart/form-data), routed by model", openai)}
    stored = {**openai, "400": "no ?model= query parameter"}
    summary = "vLLM's stored response, routed by the ?model= query parameter"
    paths["/v1/responses/{response_id}"] = {"get": op(summary, stored, ("response_id",))}
    paths["/v1/responses/{response_id}/cancel"] = {"post": op(summary, stored, ("response_id",))}
    listing = "Every model a client may call: vLLM's model cards with state and max_model_len"
    paths["/v1/models"] = {"get": op(listing, {"200": "model list"})}
    card = {"200": "vLLM's model card with state", "404": "unknown model"}
    paths["/v1/models/{model_id}"] = {"get": op("One model card", card, ("model_id",))}
    paths["/v1/models/{org}/{model_id}"] = {
        "get": op("One model card (an ORG/NAME id)", card, ("org", "model_id"))
    }
    return paths


_ADMIN_ERRORS = {"401": "no or wrong bearer token", "403": "admin API off, or model not allowed"}

_OPENAI = {
    "200": "the worker's answer (SSE when stream is true)",
    "400": "malformed request",
    "404": "unknown model",
    "502": "the worker failed",
    "503": "loading or over capacity (Retry-After)",
    "507": "the model does not fit",
}


def openapi_schema(version: str, body: type[DeployBody] = DeployBody) -> dict[str, Any]:
    """The sidecar's OpenAPI document; ``body``: the admin API's deploy body type."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gatekeeper",
            "version": version,
            "description": "Admission control for vLLM: admin API and OpenAI-compatible proxy.",
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "api_key": {"type": "http", "scheme": "bearer"},
            },
            "schemas": {"DeployBody": body.model_json_schema()},
        },
        "paths": {
            **_deployments_paths(),
            **_deployment_detail_paths(),
            **_proxy_paths(_OPENAI),
            **_sidecar_paths(),
        },
    }


def _deployments_paths() -> dict[str, Any]:
    """``/admin/deployments`` and ``/admin/deployments/{id}``."""
    return {
        "/admin/deployments": {
            "post": _op(
                "Admit and launch a worker",
                {
                    "201": "admitted: placement, flags, prediction",
                    "400": "bad body",
                    "409": "name already deployed",
                    "507": "does not fit: reasons and suggestions",
                    **_ADMIN_ERRORS,
                },
                body=True,
            ),
            "get": _op(
                "List deployments with state, GPUs, predicted and actual memory",
                {"200": "deployments", **_ADMIN_ERRORS},
            ),
        },
        "/admin/deployments/{id}": {
            "get": _op(
                "One deployment",
                {"200": "the deployment", "404": "unknown id", **_ADMIN_ERRORS},
                path_id=True,
            ),
            "delete": _op(
                "Drain, then stop a deployment",
                {"200": "stopped", "404": "unknown id", **_ADMIN_ERRORS},
                path_id=True,
            ),
        },
    }


def _deployment_detail_paths() -> dict[str, Any]:
    """A deployment's log and record, and ``/admin/gpus``."""
    return {
        "/admin/deployments/{id}/log": {
            "get": _op(
                "The worker's log from a byte offset, with its start-up phase",
                {"200": "lines and the next offset", "404": "unknown id", **_ADMIN_ERRORS},
                path_id=True,
            )
        },
        "/admin/deployments/{id}/record": {
            "delete": _op(
                "Forget a stopped or failed deployment: drop it from the list",
                {"200": "forgotten", "404": "unknown id", "409": "still live", **_ADMIN_ERRORS},
                path_id=True,
            )
        },
        "/admin/gpus": {
            "get": _op(
                "The GPU snapshot with gatekeeper's reservations",
                {"200": "snapshot", **_ADMIN_ERRORS},
            )
        },
    }


def _sidecar_paths() -> dict[str, Any]:
    """The sidecar's own routes: health, metrics, discovery, this schema, the webhook."""
    return {
        "/healthz": {"get": _op("The sidecar is up", {"200": "ok"}, secured=False)},
        "/metrics": {
            "get": _op(
                "Prometheus metrics (text or OpenMetrics)", {"200": "metrics"}, secured=False
            )
        },
        "/discovery/workers": {
            "get": _op(
                "Prometheus HTTP service discovery: the serving workers' /metrics as "
                "target groups with model, worker, gpu, UUID, Hostname and node labels",
                {"200": "a JSON list of target groups"},
                secured=False,
            )
        },
        "/openapi.json": {"get": _op("This schema", {"200": "the schema"}, secured=False)},
        "/k8s/validate": {
            "post": _op(
                "Kubernetes validating admission webhook (AdmissionReview v1)",
                {"200": "AdmissionReview with the verdict", "400": "not an AdmissionReview"},
                secured=False,
            )
        },
    }
