"""Sending a worker's answer to the client, and noticing when the client leaves.

- ``WholeAnswer``: a complete answer, sent as received.
- ``StreamRelay``: a worker's event stream, relayed as it arrives (what one read from
  the worker brought is one send to the client, never held for more); when
  the worker fails mid-stream the stream ends with a ``data: {"error": ...}`` event.
  It relays a whole answer too large to hold the same way, chunked; a worker that fails
  in one has the client's connection closed before the last chunk, which tells the
  client the answer is incomplete.
  However it ends (done, worker failed, client gone), the upstream answer is closed and
  ``done(outcome)`` is called once.
- ``DisconnectWatch``: cancels the request's task when the client disconnects.
- ``Reply``: how a server that offers ``answer_now`` (below) answers a request the proxy
  took without a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gatekeeper.proxy.protocol import error_type, sse_error_event
from gatekeeper.proxy.upstream import Answer, UpstreamError

__all__ = [
    "DISCONNECT_EXTENSION",
    "AnswerNow",
    "DisconnectWatch",
    "Outcome",
    "Reply",
    "StreamRelay",
    "WholeAnswer",
]

Outcome = Literal["ok", "upstream_error", "cancelled", "connect_error"]
"""How a request sent to a worker ended, as ``Resolver.report`` receives it."""

_Headers = list[tuple[bytes, bytes]]


class WholeAnswer:
    """A worker's whole answer, sent as received, with its ``content-length`` (which
    ``headers``, already without the hop-by-hop fields, does not carry)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: _Headers, body: bytes) -> None:
        self.status = status
        self.headers = [*headers, (b"content-length", str(len(body)).encode())]
        self.body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


DISCONNECT_EXTENSION = "gatekeeper.disconnect"
"""An ASGI extension a server may offer in ``scope["extensions"]`` (the sidecar's HTTP
protocol does, on its lean path): ``{"watch": f}``, where ``f(callback)`` has the server
call ``callback`` once when the client goes away, and ``f(None)`` drops it; one callback
at a time."""


class Reply(Protocol):
    """A request a server has read whole and offered to ``AnswerNow``: how the proxy
    answers it from a callback, without a task."""

    def respond(self, status: int, headers: _Headers, body: bytes) -> None:
        """Send a whole answer (``headers`` carry its ``content-length``); nothing once the
        client has gone."""

    def watch_disconnect(self, callback: Callable[[], None] | None) -> None:
        """As ``DISCONNECT_EXTENSION``'s ``watch``: ``callback`` once when the client goes."""

    def fall_back(self) -> None:
        """Run the request's ASGI app after all, as if it had never been offered."""

    def run(self, app: ASGIApp) -> None:
        """Run ``app`` as the request's ASGI app (a task): for an answer the proxy took
        on and cannot give whole (``StreamRelay`` of an answer too large to hold)."""


class AnswerNow(Protocol):
    """A direct route's ``answer_now``: the server calls it with a request read whole
    (scope as for the ASGI app, the body) before starting the app's task; True when it
    took the request (it will answer through ``reply``, or fall back), False when the
    server must run the app (nothing was done)."""

    def __call__(self, scope: Scope, body: bytes, reply: Reply) -> bool: ...


class DisconnectWatch:
    """Cancels the current task when the client disconnects (``disconnected`` says so).

    uvicorn neither cancels a request's task nor fails ``send`` when the client goes
    away. A server that offers ``DISCONNECT_EXTENSION`` calls back; elsewhere a task
    waits on ``receive()`` meanwhile, as vLLM and Starlette do. That task starts only if
    the request is still going after ``after_seconds``, so that quick answers do not pay
    for it (about 0.03 ms); a disconnect before then is seen as soon as it starts."""

    __slots__ = ("_notify", "_receive", "_task", "_timer", "_watcher", "disconnected")

    def __init__(self, receive: Receive, scope: Scope, after_seconds: float = 0.05) -> None:
        self.disconnected = False
        self._receive = receive
        self._task = asyncio.current_task()
        self._watcher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        extension = (scope.get("extensions") or {}).get(DISCONNECT_EXTENSION)
        self._notify = extension["watch"] if extension else None
        if self._notify is not None:
            self._notify(self._gone)
        elif after_seconds > 0:
            self._timer = asyncio.get_running_loop().call_later(after_seconds, self._start)
        else:
            self._start()

    def _start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        message: Message = await self._receive()
        while message["type"] != "http.disconnect":
            message = await self._receive()
        self._gone()

    def _gone(self) -> None:
        self.disconnected = True
        if self._task is not None:
            self._task.cancel()

    def absorb(self) -> None:
        """Called on ``CancelledError``: swallow it if it is ours, else re-raise it."""
        if not self.disconnected or self._task is None:
            raise asyncio.CancelledError
        self._task.uncancel()

    def stop(self) -> None:
        if self._notify is not None:
            self._notify(None)
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()


class StreamRelay:
    """Relays a worker's event stream as it arrives; closes it and reports, however it ends."""

    __slots__ = ("_done", "_events", "_headers", "_upstream")

    def __init__(
        self,
        upstream: Answer,
        headers: _Headers,
        done: Callable[[Outcome], None],
        *,
        events: bool = True,
    ) -> None:
        self._upstream = upstream
        self._headers = headers
        self._done = done
        self._events = events
        """An event stream (a failure ends it with an error event), or a whole answer
        (a failure leaves it incomplete: the server closes the connection)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: Outcome = "cancelled"
        watch = DisconnectWatch(receive, scope)
        chunks = self._upstream.chunks()
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self._upstream.status,
                    "headers": self._headers,
                }
            )
            try:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                outcome = "ok"
            except UpstreamError as e:
                outcome = "upstream_error"
                if not self._events:
                    return  # unfinished: the server closes the client's connection
                message = f"The worker failed mid-stream ({e}). Retry."
                event = sse_error_event(message, type=error_type(502), code=502)
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            watch.absorb()
        except OSError:  # ASGI 2.4 servers: sending to a client that has gone away
            pass
        finally:
            watch.stop()
            await chunks.aclose()
            await self._upstream.aclose()
            self._done(outcome)
