"""The AdmissionReview as bytes cross the boundary: parse (or say why it is malformed, for
an HTTP 400) and build the response.

Only ``admission.k8s.io/v1`` is accepted. The response echoes ``apiVersion``, ``kind`` and
``request.uid``; a denial carries a Kubernetes ``Status`` (code 403) whose message the API
server shows to the user, and warnings are clipped to the 256 characters the API server
keeps.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_WARNING_CHARS",
    "AdmissionRequest",
    "AdmissionReview",
    "clip_warning",
    "parse_review",
    "review_body",
    "review_response",
    "status_body",
    "too_large",
]

MAX_BODY_BYTES = 16 * 2**20
"""Largest review accepted (objects are at most ~1.5 MiB in etcd; a review holds two)."""
MAX_WARNING_CHARS = 256
"""The API server may truncate longer warnings; gatekeeper clips them itself."""


class _Kind(BaseModel):
    model_config = ConfigDict(extra="allow")

    group: str = ""
    version: str = ""
    kind: str = Field(min_length=1)


class AdmissionRequest(BaseModel):
    """``request`` of an AdmissionReview (the fields gatekeeper reads)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    uid: str = Field(min_length=1)
    kind: _Kind
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    namespace: str | None = None
    name: str | None = None
    sub_resource: str | None = Field(default=None, alias="subResource")
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")
    dry_run: bool = Field(default=False, alias="dryRun")
    """A dry run: a webhook with side effects (``sideEffects: NoneOnDryRun``) makes none."""


class AdmissionReview(BaseModel):
    """An ``admission.k8s.io/v1`` AdmissionReview as the API server sends it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


def clip_warning(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 1] + "…"


def status_body(code: int, message: str) -> dict[str, Any]:
    reason = {400: "BadRequest", 403: "Forbidden", 413: "RequestEntityTooLarge"}.get(code, "")
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _malformed(detail: str) -> tuple[int, dict[str, Any]]:
    return 400, status_body(
        400,
        f"malformed AdmissionReview: {detail}; gatekeeper takes an admission.k8s.io/v1 "
        "AdmissionReview with request.uid, request.kind, request.operation and request.object, "
        "as the API server sends it (admissionReviewVersions: [v1])",
    )


def parse_review(body: bytes) -> AdmissionReview | tuple[int, dict[str, Any]]:
    """The review, or the 400 answer that says what is wrong with it."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        return _malformed(f"the body is not JSON ({type(e).__name__}: {str(e)[:120]})")
    if not isinstance(data, dict):
        return _malformed(f"the body is a JSON {type(data).__name__}, not an object")
    try:
        return AdmissionReview.model_validate(data)
    except (ValidationError, RecursionError) as e:
        if isinstance(e, RecursionError):
            return _malformed("the object is nested too deeply")
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the review"
        got = repr(first.get("input"))[:80]
        return _malformed(f"{where}: {first['msg']} (got {got})")


def review_response(
    review: AdmissionReview,
    allowed: bool,
    message: str,
    warnings: tuple[str, ...],
    patch: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answering ``review``; a mutating webhook's ``patch`` (RFC 6902
    operations) goes base64-encoded with ``patchType: JSONPatch``."""
    response: dict[str, Any] = {"uid": review.request.uid, "allowed": allowed}
    if not allowed:
        response["status"] = status_body(403, message)
    if patch and allowed:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = [clip_warning(w) for w in warnings]
    return {"apiVersion": review.api_version, "kind": review.kind, "response": response}


async def review_body(request: Request) -> bytes | None:
    """The request's body, or None when it is larger than ``MAX_BODY_BYTES``."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def too_large() -> Response:
    """The 413 answer to a review larger than ``MAX_BODY_BYTES``."""
    return JSONResponse(status_body(413, f"the review is larger than {MAX_BODY_BYTES} bytes"), 413)
