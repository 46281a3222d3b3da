"""The lean path's request-response cycle (``LeanCycle``), which the sidecar's HTTP
protocol (``http_protocol``) runs a direct route's POST in: uvicorn's cycle with a
``send`` for the proxy's answers (one write for a whole answer's head and body), the
``gatekeeper.disconnect`` extension's callback, and ``relay.Reply`` for a request
offered to its route's ``answer_now``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from starlette.types import ASGIApp
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

__all__ = ["COALESCE_BYTES", "LeanCycle"]

COALESCE_BYTES = 65536
"""A whole answer's body up to this size is written in one piece with its head (one
``send`` call to the kernel instead of two); a larger one is written apart, not copied."""


class LeanCycle(RequestResponseCycle):
    """uvicorn's cycle, with a ``send`` for the proxy's answers: the headers are the
    proxy's own and a worker's (parsed by httptools, so no CR or LF in them), which need
    none of uvicorn's per-header checks; the method is POST (no HEAD to answer without a
    body). The rest is uvicorn's: ``receive``, ``run_asgi`` (500 for an exception), and
    ``send`` itself while writing is paused or the client is gone, or for a message out of
    order (its errors)."""

    _head = b""
    """A whole answer's head, written with the first part of its body."""
    _on_gone: Callable[[], None] | None = None
    route_app: ASGIApp | None = None
    """The request's ASGI app, for a request offered to ``answer_now`` (``fall_back``)."""
    start_app: Callable[[ASGIApp], None] | None = None
    """Starts an ASGI app as the request's task, for a request offered to ``answer_now``
    (``fall_back``, ``run``); once."""

    # relay.Reply, for a request offered to its route's answer_now

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if self.disconnected or self.response_started:
            return
        self._start(status, headers)
        self._body(body, False)

    def fall_back(self) -> None:
        start, self.start_app = self.start_app, None
        if start is not None and self.route_app is not None and not self.disconnected:
            start(self.route_app)

    def run(self, app: ASGIApp) -> None:
        start, self.start_app = self.start_app, None
        if start is not None:
            start(app)

    def watch_disconnect(self, callback: Callable[[], None] | None) -> None:
        """``DISCONNECT_EXTENSION``: ``callback`` is called once when the client goes."""
        self._on_gone = callback
        if callback is not None and self.disconnected:
            self.gone()

    def gone(self) -> None:
        """The client has gone (the protocol calls it): tell the watcher, once."""
        callback, self._on_gone = self._on_gone, None
        if callback is not None:
            callback()

    async def send(self, message: ASGISendEvent) -> None:
        if self._head and self.flow.write_paused and not self.disconnected:
            self.transport.write(self._head)  # what uvicorn would have written already
            self._head = b""
        if self.flow.write_paused or self.disconnected:
            await super().send(message)
        elif not self.response_started and message["type"] == "http.response.start":
            self._start(message["status"], message.get("headers", ()))
        elif (
            self.response_started
            and not self.response_complete
            and message["type"] == "http.response.body"
        ):
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            await super().send(message)

    def _start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.response_started = True
        self.waiting_for_100_continue = False
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += (name, b": ", value, b"\r\n")
        closes = False
        for name, value in headers:
            if name == b"content-length":
                self.expected_content_length = int(value)
                self.chunked_encoding = False
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive, closes = False, True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closes:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        if self.chunked_encoding:  # a stream: its head goes now, before the first event
            self.transport.write(b"".join(content))
        else:  # a whole answer: its head goes with the body, in one write
            self._head = b"".join(content)

    def _body(self, body: bytes, more_body: bool) -> None:
        if self.chunked_encoding:
            chunk = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            self.transport.write(chunk if more_body else chunk + b"0\r\n\r\n")
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            head, self._head = self._head, b""
            if head and len(body) <= COALESCE_BYTES:
                self.transport.write(head + body)
            else:
                if head:
                    self.transport.write(head)
                if body:
                    self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()
