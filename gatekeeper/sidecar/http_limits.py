"""What the sidecar's HTTP protocol (``http_protocol``) allows a client, from the settings,
and the whole answers it closes a connection with when one is passed:

- **Head** (``max_request_head_bytes``, ``max_request_headers``): a request head larger
  than the bound, or with more header fields, gets 431; a request target alone longer
  than the bound gets 414 (nginx's ``large_client_header_buffers``, h11's 16 KiB bound,
  and its field count as uvicorn's h11 protocol has it). The trailer fields of a chunked
  body count with the head's and are never added to the request's headers.
- **Header deadline** (``request_header_timeout_seconds``): 408.
- **Body deadlines**: each next chunk within ``request_body_timeout_seconds``, and the
  whole body within ``request_body_total_seconds`` plus one second per
  ``request_body_min_bytes_per_second`` bytes received (Apache's ``mod_reqtimeout``
  ``body=...,MinRate=...``, since nginx's ``client_body_timeout`` is per read and lets a
  body trickled a byte at a time run forever), and never past
  ``request_body_max_seconds`` (``mod_reqtimeout``'s ``body=20-40``: the ``40``): 408.

Every answer is in the proxy's JSON error shape (vLLM's ``type`` on ``/v1``, the
reason phrase or the admin API's ``request_timeout`` elsewhere), with
``connection: close``. A client refused over a limit may still be sending: its
connection lingers (``linger``), as nginx's ``lingering_close`` does, so that the close
does not reset it before the client has read the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus

from starlette.types import ASGIApp

from gatekeeper.proxy.protocol import error_response
from gatekeeper.proxy.relay import AnswerNow
from gatekeeper.settings import Settings

__all__ = [
    "LINGER_BYTES",
    "LINGER_SECONDS",
    "ProtocolOptions",
    "closing_answer",
    "linger",
    "protocol_options",
]

LINGER_SECONDS = 2.0
"""How long a refused client's connection reads and drops what it still sends."""
LINGER_BYTES = 1 << 20
"""How much of it, at most: a client that keeps sending is not read for long."""


class _Drop(asyncio.Protocol):
    """A refused connection's protocol while it lingers: what comes is dropped, and the
    connection closes at the client's end of sending, past ``LINGER_BYTES``, or when the
    time is up."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._left = LINGER_BYTES

    def data_received(self, data: bytes) -> None:
        self._left -= len(data)
        if self._left < 0:
            self._transport.close()

    def eof_received(self) -> bool:
        self._transport.close()
        return False


def linger(transport: asyncio.Transport, seconds: float = LINGER_SECONDS) -> None:
    """Half-close ``transport`` after what was written, then drop what the client still
    sends for ``seconds`` and ``LINGER_BYTES`` at most (nginx's lingering close): closing a connection with
    unread bytes resets it, and a reset can reach the client before it has read its
    answer. Nothing read is kept."""
    transport.set_protocol(_Drop(transport))
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(seconds, transport.close)


def closing_answer(status: int, message: str, *, type: str | None, code: str) -> bytes:
    """A whole error response that closes the connection, in the proxy's error shape."""
    answer = error_response(status, message, type=type, code=code)
    head = b"".join(
        [
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode(),
            *(name + b": " + value + b"\r\n" for name, value in answer.raw_headers),
            b"connection: close\r\n\r\n",
        ]
    )
    return head + bytes(answer.body)


@dataclass(frozen=True)
class ProtocolOptions:
    """The protocol's limits and its ready-made answers to them."""

    header_seconds: float
    body_seconds: float
    body_total_seconds: float
    body_min_rate: int
    """Bytes per second that earn a body one more second past ``body_total_seconds``."""
    body_max_seconds: float
    """The most a whole body may take, whatever its rate."""
    max_head_bytes: int
    max_headers: int
    headers_late: bytes
    """The whole 408 answer to headers past their deadline."""
    body_late: Mapping[bool, bytes]
    """The whole 408 answer to a stalled or trickled body, on /v1 (True) and elsewhere."""
    head_too_large: bytes
    """The whole 431 answer to a head over ``max_head_bytes`` or ``max_headers``."""
    target_too_long: bytes
    """The whole 414 answer to a request target over ``max_head_bytes``."""
    routes: Mapping[bytes, ASGIApp]
    """The lean path's apps by exact request target."""
    now: Mapping[bytes, AnswerNow]
    """Their ``answer_now``, for those that have one (``relay.AnswerNow``)."""


def protocol_options(settings: Settings, direct: Mapping[str, ASGIApp]) -> ProtocolOptions:
    """The options ``settings`` give, with ``direct``'s POST routes for the lean path."""
    head, headers = settings.max_request_head_bytes, settings.max_request_headers
    return ProtocolOptions(
        header_seconds=settings.request_header_timeout_seconds,
        body_seconds=settings.request_body_timeout_seconds,
        body_total_seconds=settings.request_body_total_seconds,
        body_min_rate=settings.request_body_min_bytes_per_second,
        body_max_seconds=settings.request_body_max_seconds,
        max_head_bytes=head,
        max_headers=headers,
        headers_late=closing_answer(
            408,
            "the request's headers did not arrive within "
            f"{settings.request_header_timeout_seconds:g} s "
            "(request_header_timeout_seconds); send the whole request at once",
            type="request_timeout",
            code="request_timeout",
        ),
        body_late=_body_late(settings),
        head_too_large=closing_answer(
            431,
            f"The request head is larger than {head} bytes (max_request_head_bytes) or has "
            f"more than {headers} header fields (max_request_headers). Send fewer or "
            "shorter headers.",
            type=None,
            code="request_header_fields_too_large",
        ),
        target_too_long=_target_too_long(head),
        routes={path.encode("ascii"): app for path, app in direct.items()},
        now={
            path.encode("ascii"): now
            for path, app in direct.items()
            if (now := getattr(app, "answer_now", None)) is not None
        },
    )


def _target_too_long(head: int) -> bytes:
    message = (
        f"The request target is longer than {head} bytes (max_request_head_bytes). "
        "Send the parameters in the body."
    )
    return closing_answer(414, message, type=None, code="uri_too_long")


def _body_late(settings: Settings) -> dict[bool, bytes]:
    """The 408 answers to a stalled or trickled body, on /v1 (True) and elsewhere."""
    total, rate = settings.request_body_total_seconds, settings.request_body_min_bytes_per_second
    message = (
        "The request body stalled or came too slowly: no next chunk within "
        f"{settings.request_body_timeout_seconds:g} s (request_body_timeout_seconds), or "
        f"not whole within {total:g} s plus 1 s per {rate} bytes received "
        "(request_body_total_seconds, request_body_min_bytes_per_second), nor within "
        f"{settings.request_body_max_seconds:g} s at any rate (request_body_max_seconds). "
        "Send the whole body the request announces at once."
    )
    return {
        v1: closing_answer(
            408, message, type=None if v1 else "request_timeout", code="request_timeout"
        )
        for v1 in (True, False)
    }
