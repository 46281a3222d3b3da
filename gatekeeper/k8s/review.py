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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

__all__ = [
    "DRAIN_BYTES",
    "MAX_BODY_BYTES",
    "MAX_WARNING_CHARS",
    "AdmissionRequest",
    "AdmissionReview",
    "Oversized",
    "clip_warning",
    "oversized_answer",
    "parse_review",
    "review_body",
    "review_response",
    "status_body",
    "too_large",
]

MAX_BODY_BYTES = 3 * 2**20
"""Largest review read by default (``webhook_max_review_bytes``: the apiserver's own
request limit; objects are at most ~1.5 MiB in etcd, an update's review holds two)."""
DRAIN_BYTES = 16 * 2**20
"""A review over the limit is read on, and dropped, up to this many bytes, so that its
denial reaches the apiserver as an answer (not a connection cut while it still writes);
past it the connection gets 413."""
_HEAD_BYTES = 4096
_UID = re.compile(rb'"uid"\s*:\s*"([^"\\]{1,253})"')
"""The first ``uid`` of a review: ``request.uid`` as the apiserver writes a review
(``kind``, ``apiVersion``, then ``request`` with ``uid`` first)."""
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
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answering ``review``; a mutating webhook's ``patch`` (RFC 6902
    operations) goes base64-encoded with ``patchType: JSONPatch``; ``audit``: the
    ``auditAnnotations`` (the apiserver records them in its audit log, each key prefixed
    with the webhook's name)."""
    response: dict[str, Any] = {"uid": review.request.uid, "allowed": allowed}
    if not allowed:
        response["status"] = status_body(403, message)
    if patch and allowed:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = [clip_warning(w) for w in warnings]
    if audit:
        response["auditAnnotations"] = dict(audit)
    return {"apiVersion": review.api_version, "kind": review.kind, "response": response}


@dataclass(frozen=True, slots=True)
class Oversized:
    """A review larger than the limit: its first bytes (where the apiserver writes
    ``request.uid``) and how many bytes were read."""

    head: bytes
    size: int
    limit: int


async def review_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes | Oversized:
    """The request's body, or ``Oversized`` when it is larger than ``limit`` bytes: only
    its head is kept, the rest read and dropped up to ``DRAIN_BYTES``."""
    chunks: list[bytes] = []
    head, size = b"", 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
            continue
        if chunks:
            head, chunks = b"".join(chunks)[:_HEAD_BYTES], []
        head = (head + chunk)[:_HEAD_BYTES] if len(head) < _HEAD_BYTES else head
        if size > DRAIN_BYTES:
            break
    if size > limit:
        return Oversized(head, size, limit)
    return b"".join(chunks)


def oversized_answer(body: Oversized) -> tuple[int, dict[str, Any]]:
    """A review over the limit, denied (200, so that the apiserver reads the denial rather
    than a failed call it would follow its failure policy on) when its ``request.uid`` is
    in its head; otherwise 413."""
    text = (
        f"the review is {body.size}{'+' if body.size > DRAIN_BYTES else ''} bytes, over the "
        f"webhook's limit of {body.limit} review bytes (setting webhook_max_review_bytes); "
        "make the object smaller"
    )
    found = _UID.search(body.head)
    if found is None or body.size > DRAIN_BYTES:
        return 413, status_body(413, text)
    response = {"uid": found.group(1).decode(), "allowed": False, "status": status_body(413, text)}
    return 200, {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }


def too_large(body: Oversized) -> Response:
    """The answer to a review larger than its limit (``oversized_answer``)."""
    status, payload = oversized_answer(body)
    return JSONResponse(payload, status)
