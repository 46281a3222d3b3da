"""A request as the proxy reads it: the body within its bound, the fields it routes by
(parsed once), and the body for a worker that serves the model under another name.

``read_body`` reads the body whole, refusing one over the bound before reading it when
its ``Content-Length`` says so; ``parse`` reads ``model`` and ``stream`` from a JSON body
(pydantic-core's ``validate_json``) or from a ``multipart/form-data`` one; ``rewrite``
puts the worker's served name in place of an alias. What cannot be forwarded raises
``Refused`` with the answer to send instead.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import Response
from starlette.types import Receive, Scope

from gatekeeper.proxy.protocol import (
    CLIENT_CLOSED,
    bad_request,
    error_response,
    form_boundary,
    form_field,
    too_large,
)
from gatekeeper.proxy.resolver import Endpoint

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "FormRequest",
    "OpenAIRequest",
    "Refused",
    "parse",
    "read_body",
    "rewrite",
]

logger = logging.getLogger(__name__)


class OpenAIRequest(BaseModel):
    """The fields the proxy reads; every other field goes to the worker unchanged."""

    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool | None = None


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``."""


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""


class EmbeddingRequest(OpenAIRequest):
    """``POST /v1/embeddings``."""


class FormRequest(OpenAIRequest):
    """A ``multipart/form-data`` request (``/v1/audio/transcriptions``): ``model`` is a
    form field; ``body`` and ``span`` let an alias be replaced in place."""

    body: bytes = b""
    span: tuple[int, int] = (0, 0)

    def renamed(self, served_name: str) -> bytes:
        start, end = self.span
        return self.body[:start] + served_name.encode() + self.body[end:]


class Refused(Exception):
    """An error response to send instead of forwarding."""

    def __init__(self, response: Response) -> None:
        self.response = response


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body; ``Refused`` with 413 over ``limit`` bytes, or 499 (``CLIENT_CLOSED``)
    when the client leaves before it is in."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise Refused(too_large(limit))
            break
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(Response(status_code=CLIENT_CLOSED))
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(too_large(limit))
        chunks.append(chunk)
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse(body: bytes, kind: type[OpenAIRequest], scope: Scope) -> OpenAIRequest:
    """The fields the proxy routes by; ``Refused`` with vLLM's 400 when they are missing
    or of the wrong type."""
    if kind is FormRequest:
        return _parse_form(body, scope)
    try:
        parsed = kind.model_validate_json(body)
    except ValidationError as e:
        raise Refused(bad_request(e)) from e
    if parsed.model_extra and logger.isEnabledFor(logging.DEBUG):
        logger.debug("Fields passed to the worker unchecked: %s", sorted(parsed.model_extra))
    return parsed


def _parse_form(body: bytes, scope: Scope) -> FormRequest:
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    boundary = form_boundary(content_type)
    field = form_field(body, boundary, "model") if boundary else None
    if field is None or not field.value:
        what = "has no 'model' field" if boundary else "is not multipart/form-data"
        message = (
            f"Invalid request: the body {what}. Send multipart/form-data with a 'file' "
            "and a 'model' field (the sidecar routes by it; GET /v1/models lists the names)."
        )
        raise Refused(error_response(400, message, param="model"))
    stream = form_field(body, boundary, "stream") if boundary else None
    return FormRequest(
        model=field.value,
        stream=stream is not None and stream.value.strip().lower() == "true",
        body=body,
        span=(field.start, field.end),
    )


def rewrite(parsed: OpenAIRequest, endpoint: Endpoint) -> bytes:
    """The body with the alias replaced by the worker's served name."""
    if isinstance(parsed, FormRequest):
        return parsed.renamed(endpoint.served_name)
    renamed = parsed.model_copy(update={"model": endpoint.served_name})
    return renamed.model_dump_json(exclude_unset=True).encode()
