"""One keep-alive HTTP/1.1 connection to a worker, its answers parsed as they arrive.

``WorkerConnection`` is an ``asyncio.Protocol`` whose answers httptools parses (llhttp,
the C parser under uvicorn's ``httptools`` protocol): status, headers,
``Content-Length``, chunked (extensions, trailers) or read-to-close bodies, interim 1xx
answers, keep-alive. It answers one request at a time (``send`` a whole message from
``post_message``) and keeps what the answer brought for its reader: the head, the body
received and not yet taken (``take``; reading pauses above ``PAUSE_ABOVE_BYTES``), and
why it ended (``lost``, ``broken``). Its reader waits on it (``wait``) or is called back
(``listener``); the pool and the answers are ``upstream``'s.

What is no HTTP answer to a POST breaks it (``broken``, the connection closed): what
httptools cannot parse, a status outside 100-599, a 101 upgrade (which httptools reports
by an ``HttpParserUpgrade`` out of ``feed_data``), a head over ``HEAD_LIMIT_BYTES``
(interim 1xx answers included). A chunked body's trailer fields are dropped, never added
to the headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

__all__ = ["HEAD_LIMIT_BYTES", "PAUSE_ABOVE_BYTES", "WorkerConnection", "post_message"]

_Headers = list[tuple[bytes, bytes]]
HEAD_LIMIT_BYTES = 1 << 20
"""Longest answer head the client accepts."""
PAUSE_ABOVE_BYTES = 1 << 20
"""Body bytes received and not yet taken above which the socket is not read."""
_ODD_STATUS = {101: "it answered 101 Switching Protocols, an upgrade the proxy never asks for"}


def post_message(host_header: bytes, path: str, body: bytes, headers: _Headers) -> bytes:
    """A whole HTTP/1.1 POST: request line, ``host``, ``content-length``, the headers, the
    body."""
    return b"".join(
        [
            b"POST ",
            path.encode(),
            b" HTTP/1.1\r\nhost: ",
            host_header,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n",
            *[name + b": " + value + b"\r\n" for name, value in headers],
            b"\r\n",
            body,
        ]
    )


class WorkerConnection(asyncio.Protocol):
    """One connection to a worker, answering one request at a time; httptools calls the
    ``on_*`` methods as it parses what ``data_received`` brings."""

    __slots__ = (
        "_buffered", "_loop", "_parser", "_paused", "_to_close", "_transport", "_waiter",
        "body", "broken", "complete", "head_done", "headers", "keep_alive", "listener",
        "lost", "received", "status",
    )  # fmt: skip

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.lost: BaseException | None = None
        """Why the connection ended (``ConnectionError`` when the worker closed it)."""
        self.broken: str | None = None
        """What was wrong with the answer, when it was not HTTP/1.x."""
        self.listener: Callable[[], None] | None = None
        """Called where a waiter is woken: after each read and when the connection ends."""
        self._reset()

    def _reset(self) -> None:
        self.received = 0
        self.status = 0
        self.headers: _Headers = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self._to_close = False
        self.body: list[bytes] = []
        """Body bytes received and not yet taken."""
        self._buffered = 0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._break(f"not an HTTP/1.x answer ({e})")
        except httptools.HttpParserUpgrade:
            self._break(_ODD_STATUS[101])
        if not self.head_done and self.received > HEAD_LIMIT_BYTES:
            self._break(f"an answer head longer than {HEAD_LIMIT_BYTES} bytes")
        self._pause_if_full()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("the worker closed the connection")
        if self._to_close and exc is None and self.broken is None:
            self.complete = True  # a body read to close ends when the worker closes
        self._wake()

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes | None) -> None:
        if not self.head_done:  # a chunked body's trailer fields are never headers
            self.headers.append((name.lower(), value or b""))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status == 101 or not 100 <= status < 600:
            self._break(_ODD_STATUS.get(status, f"it answered status {status}, not 100-599"))
            return
        if status < 200:  # interim answers (100 Continue): skip
            self.headers = []
            return
        self.status = status
        self.head_done = True
        names = {name for name, _ in self.headers}
        sized = b"content-length" in names or b"transfer-encoding" in names
        self._to_close = not sized and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self._parser.should_keep_alive()

    # for the pool and the answer

    def usable(self) -> bool:
        return (
            self.lost is None and self._transport is not None and not self._transport.is_closing()
        )

    def send(self, data: bytes) -> None:
        assert self._transport is not None
        self._reset()
        self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def hold(self, parts: list[bytes]) -> None:
        """Put ``parts`` back before the body not yet taken (reading pauses above the
        bound, as for bytes received)."""
        self.body[:0] = parts
        self._buffered += sum(len(part) for part in parts)
        self._pause_if_full()

    def _pause_if_full(self) -> None:
        """Stop reading the socket while more than ``PAUSE_ABOVE_BYTES`` wait untaken."""
        if self._buffered > PAUSE_ABOVE_BYTES and not self._paused and self._transport:
            self._paused = True
            self._transport.pause_reading()

    def take(self) -> bytes:
        """The body bytes received since the last ``take``."""
        body, self.body, self._buffered = self.body, [], 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return body[0] if len(body) == 1 else b"".join(body)

    async def wait(self) -> None:
        """Until ``data_received`` or ``connection_lost`` next runs."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.listener is not None:
            self.listener()

    def _break(self, what: str) -> None:
        self.broken = self.broken or what
        self.close()
