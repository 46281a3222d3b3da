"""OpenAI's error shape, for everything the sidecar answers on ``/v1``.

OpenAI and vLLM answer errors as ``{"error": {"message", "type", "param", "code"}}``;
the ``openai`` client reads ``message`` into the exception it raises, and raises on a
``data: {"error": ...}`` event in a stream. Types used here:

- ``invalid_request_error`` (400, 404, 413): the request is at fault; fix it.
- ``service_unavailable`` (503): the model is loading or the node is full; retry after
  the ``Retry-After`` header.
- ``upstream_error`` (502): the worker refused the connection or failed mid-request.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ValidationError
from starlette.responses import Response

__all__ = [
    "ErrorInfo",
    "ErrorResponse",
    "bad_request",
    "error_response",
    "sse_error_event",
    "too_large",
    "upstream_failed",
]


class ErrorInfo(BaseModel):
    """The body of an OpenAI error."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """``{"error": ErrorInfo}``, as OpenAI and vLLM answer."""

    error: ErrorInfo


def error_response(
    status: int,
    message: str,
    *,
    type: str,
    param: str | None = None,
    code: str | int | None = None,
    retry_after: float | None = None,
) -> Response:
    """A JSON error response; ``retry_after`` seconds become a whole-second ``Retry-After``."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))
    headers = None
    if retry_after is not None:
        headers = {"retry-after": str(max(1, math.ceil(retry_after)))}
    return Response(
        body.model_dump_json().encode(),
        status_code=status,
        headers=headers,
        media_type="application/json",
    )


def sse_error_event(message: str, *, type: str, code: str | int | None = None) -> bytes:
    """A server-sent event carrying an error, to end a stream that has already started.

    Starts with a blank line so that it is a separate event even when the worker stopped
    in the middle of one."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, code=code))
    return b"\n\ndata: " + body.model_dump_json().encode() + b"\n\n"


def bad_request(e: ValidationError) -> Response:
    """400 for a body that is not a JSON object with a string ``model``."""
    first = e.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    if where:
        what, param = f"{where!r}: {first['msg']}", where
    else:
        what, param = f"the body is not a JSON object ({first['msg']})", None
    message = f"Invalid request: {what}. Send a JSON object with a string 'model'."
    return error_response(400, message, type="invalid_request_error", param=param)


def too_large(limit_bytes: int) -> Response:
    """413 for a body over the proxy's limit."""
    message = f"The request body is larger than the proxy accepts ({limit_bytes} bytes). Send less."
    return error_response(413, message, type="invalid_request_error", code="request_too_large")


def upstream_failed(worker_id: str, e: Exception) -> Response:
    """502 for a worker that failed before its answer was complete."""
    message = (
        f"The worker {worker_id} failed mid-request ({e}). It may have exited; retry, "
        "and see the worker's log."
    )
    return error_response(502, message, type="upstream_error", code=502)
