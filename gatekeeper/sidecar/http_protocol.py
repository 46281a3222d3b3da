"""How ``gatekeeper serve`` runs under uvicorn (``server_config``; the tests' sidecar runs
the same), and its HTTP/1.1 protocol: uvicorn's httptools protocol with bounds on
request heads and deadlines on request headers and bodies, which uvicorn does not have,
and a lean path for the proxy's POSTs. The limits and their answers are
``http_limits``'s.

- **Head bounds** (``max_request_head_bytes``, ``max_request_headers``): uvicorn's
  httptools protocol keeps every header field a client sends until the head ends (one
  client grew the sidecar by 2.4 GB in 3 s, issue #27). Here ``on_url`` and
  ``on_header`` (uvicorn's, which run anyway) count the target's and the fields' bytes
  and the fields; and since httptools holds a line until it ends, ``data_received``
  counts the reads that begin inside an unfinished head. Over a bound: 431 (the target:
  414), and the connection lingers a moment (``http_limits.linger``) and closes. Trailer
  fields count with the head and are dropped: a chunked body's trailers would otherwise
  join ``scope["headers"]`` (the same list) while the app runs.

- **Header deadline** (``request_header_timeout_seconds``): uvicorn arms its keep-alive
  timer only after a response, and cancels it on the first byte of the next request: a
  client that connects and sends nothing, or sends a request line and then headers that
  never end (slowloris), holds its connection and file descriptor forever, and enough of
  them exhaust the sidecar's. Here a timer is armed when a connection opens and when a
  request's first byte arrives, and cancelled when its headers are complete.
- **Body deadlines** (``request_body_timeout_seconds``): from the end of the headers to
  the end of the body, each wait for the next chunk is bounded (one timer per request,
  pushed back by each chunk rather than re-armed). A client that announces more than it
  sends and stalls ties up its request's task and whatever it holds. The same timer
  bounds the whole body (``request_body_total_seconds`` plus a second per
  ``request_body_min_bytes_per_second`` bytes received), which a body trickled a byte
  at a time would otherwise never meet, and never past ``request_body_max_seconds``
  (a body kept just above the rate would otherwise take hours).
- Either deadline past: the client gets 408 (the proxy's JSON error shape: vLLM's
  ``type`` on ``/v1``, the admin API's ``request_timeout`` elsewhere) and its connection
  is closed; the request's app, if one is running, sees ``http.disconnect``.
- **Lean path** (``direct``: exact path to ASGI app): a ``POST`` whose target is exactly
  one of the proxy's OpenAI paths is handed straight to its app by the protocol, in a
  ``RequestResponseCycle`` whose ``send`` writes the proxy's own headers without
  uvicorn's per-header checks and a whole answer's head and body in one write, past
  Starlette and every middleware (the app given is already behind the API-key check:
  ``HttpGuard.direct_routes``); the cycle calls the proxy back when the client goes
  (``relay.DISCONNECT_EXTENSION``), so that the proxy needs no timer and task per
  request to notice. A target with a query or an escape takes the ordinary path to the
  same app. Measured on the shipped path (issue #15), uvicorn's cycle and the app stack
  around the proxy cost more CPU than the proxy's own work: interleaved A/B, CPU per
  proxied request 0.189 -> 0.159 ms for the lean path and the body deadline's move here
  alone (``python -m bench.proxy`` has the figures against vllm-router).
- **Answer now**: a lean POST whose body is announced and small (``content-length`` up
  to uvicorn's read-ahead bound, 64 KiB; no ``Expect: 100-continue``; the client not
  holding back its reads) is read whole before any task starts, then offered to its
  route's ``answer_now`` (``relay.AnswerNow``): the proxy answers a whole answer from a
  ready worker from the connection callbacks, through the cycle (``relay.Reply``), and
  no task exists for the request at all; anything it declines runs the app's task as
  before (``fall_back``). One task and its futures cost about 30 µs of CPU per request
  here; with it the sidecar's CPU per proxied request went from 1.09-1.15x vllm-router's
  in the same run to 0.91-1.03x (four runs of ``python -m bench.proxy``, 0.162-0.219 ms
  against 0.178-0.214).
- **Keep-alive**: one timer per connection, pushed back by each answer (uvicorn arms one
  after every answer and cancels it on the next request's first byte, about 2 µs each).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import ClassVar

import httptools
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    HttpToolsProtocol,
    RequestResponseCycle,
)

from gatekeeper.proxy.relay import DISCONNECT_EXTENSION, AnswerNow
from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_cycle import LeanCycle
from gatekeeper.sidecar.http_limits import ProtocolOptions, linger, protocol_options

__all__ = ["SidecarHttpProtocol", "server_config", "sidecar_http_protocol"]


def server_config(app: Starlette, *, host: str, port: int, settings: Settings) -> uvicorn.Config:
    """How ``gatekeeper serve`` runs the app under uvicorn (the tests' sidecar too). The
    lean path's routes are the app's ``state.direct_routes`` (``build_app`` sets them)."""
    direct: Mapping[str, ASGIApp] = getattr(app.state, "direct_routes", {})
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        # No access log: at "warning" it never prints, yet uvicorn formats each line's
        # arguments per response. uvloop and httptools (the protocol's base) are
        # dependencies, named so that the proxy's hot path does not depend on "auto".
        access_log=False,
        loop="uvloop",
        # Nothing in the sidecar reads the client's address or scheme, so uvicorn need not
        # copy every request's headers into a dict to look for X-Forwarded-* (loopback).
        proxy_headers=False,
        lifespan="on",
        http=sidecar_http_protocol(settings, direct),
    )


def sidecar_http_protocol(
    settings: Settings, direct: Mapping[str, ASGIApp] | None = None
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the limits and deadlines of ``settings``
    (``http_limits``), and ``direct``'s POST routes dispatched on the lean path."""
    options = protocol_options(settings, direct or {})
    limits = {"_bytes_budget": options.max_head_bytes, "_fields_budget": options.max_headers}
    return type("SidecarHttpProtocol", (SidecarHttpProtocol,), {"options": options, **limits})


class _Refused(Exception):
    """Raised by a parser callback to stop the parser: the request passed a limit, and
    gets ``answer`` (``http_limits``)."""

    def __init__(self, answer: bytes) -> None:
        super().__init__()
        self.answer = answer


def _small(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request's announced body is small enough to wait for whole before its app
    runs (an app that sees a large one's length at once may refuse it before it comes; a
    chunked one is taken as it comes)."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) <= HIGH_WATER_LIMIT
    return False


class SidecarHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines and the lean path (module docstring);
    ``sidecar_http_protocol`` makes one with its options."""

    options: ClassVar[ProtocolOptions]
    # The timers are armed only when a read leaves headers or a body incomplete, so
    # that a request that arrives whole (the usual case) arms none.
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _in_head = False
    _in_body = False
    _body_seen = 0.0
    """When the last chunk of the current request's body arrived (loop time)."""
    _body_start = 0.0
    """When the current request's body began (its headers' end, or its start in turn)."""
    _body_bytes = 0
    """The current request's body bytes so far."""
    _head_read = 0
    """Bytes of the reads that began inside the current unfinished head."""
    _framing_read = 0
    """Bytes of the reads in a row inside the current body that brought none of it: a
    chunked body's framing, extensions and trailer lines, which httptools may hold."""
    _bytes_left = 0
    """Bytes the current request's target and header (and trailer) fields may still take."""
    _fields_left = 0
    """Header (and trailer) fields the current request may still have."""
    _bytes_budget: ClassVar[int]
    _fields_budget: ClassVar[int]
    _idle_since: float | None = None
    """When the connection's last answer ended, while no next request has come."""
    _running: RequestResponseCycle | None = None
    _offer: tuple[LeanCycle, ASGIApp, AnswerNow] | None = None
    """A lean request whose app waits for its whole body, to be offered to its route's
    ``answer_now`` first."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True  # nothing yet is a request whose headers are incomplete
        self._header_timer = self.loop.call_later(
            self.options.header_seconds, self._headers_too_late
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._in_head = self._in_body = False
        self._disarm()
        super().connection_lost(exc)  # tells the latest request, not one running before it
        self._tell_gone()

    def data_received(self, data: bytes) -> None:
        """uvicorn's, with the head's bound and the deadlines' timers."""
        if self._in_head:  # a read that starts inside a head is the head's up to its end
            self._head_read += len(data)
        body_before = self._body_bytes if self._in_body else -1
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as e:
            self._refuse_or_400(e)
            return
        if self._in_head:
            if self._head_read > self.options.max_head_bytes:  # a line that never ends
                self._refuse(self.options.head_too_large)
            elif self._header_timer is None:
                self._header_timer = self.loop.call_later(
                    self.options.header_seconds, self._headers_too_late
                )
        elif self._in_body:
            if body_before == self._body_bytes:  # a read inside a body that brought none
                self._framing_read += len(data)
                if self._framing_read > self.options.max_head_bytes:  # say, endless trailers
                    self._refuse(self.options.head_too_large)
                    return
            else:
                self._framing_read = 0
            if self._body_timer is None:
                self._body_timer = self.loop.call_at(self._body_due(), self._body_too_late)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._idle_since = None  # a request: in use, not idle
        self._head_read = 0
        self._bytes_left = self._bytes_budget
        self._fields_left = self._fields_budget

    # The head's bounds ride on the parser's callbacks: uvicorn's on_url and on_header,
    # each counting down what the request may still send (two budgets: about 80 ns a
    # field). httptools holds a header line until it ends, which a client may never do:
    # data_received counts the reads of an unfinished head for that.

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._bytes_left -= len(url)
        if self._bytes_left < 0:
            raise _Refused(self.options.target_too_long)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields_left -= 1
        self._bytes_left -= len(name) + len(value)
        if self._bytes_left < 0 or self._fields_left < 0:
            raise _Refused(self.options.head_too_large)
        if not self._in_head:  # a chunked body's trailer field: no header of the request
            return
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace (uvicorn's note)
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._in_body = True
        self._body_seen = self._body_start = self.loop.time()
        self._body_bytes = self._framing_read = 0
        app = self.options.routes.get(self.url) if self.parser.get_method() == b"POST" else None
        if app is None or self.parser.should_upgrade() or self.limit_concurrency:
            super().on_headers_complete()
        else:
            self._start_direct(app)

    def on_body(self, body: bytes) -> None:
        self._body_seen = self.loop.time()
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()
        offer, self._offer = self._offer, None
        if offer is not None:
            cycle, app, now = offer
            self._running = cycle
            cycle.route_app = app
            cycle.start_app = lambda a: self._start_asgi_task(cycle, a)  # type: ignore[arg-type]
            if not now(cycle.scope, bytes(cycle.body), cycle):  # type: ignore[arg-type]
                cycle.fall_back()

    def _start_direct(self, app: ASGIApp) -> None:
        """``on_headers_complete`` for a POST to one of ``direct``'s paths (the
        target is the path itself: no query, no escapes)."""
        http_version = self.parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = self.root_path + self.url.decode("ascii")
        scope["raw_path"] = self.root_path.encode("ascii") + self.url
        scope["query_string"] = b""
        existing = self.cycle
        self.cycle = cycle = LeanCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=False,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        scope["extensions"] = {DISCONNECT_EXTENSION: {"watch": cycle.watch_disconnect}}
        if existing is None or existing.response_complete:
            now = self.options.now.get(self.url)
            if (
                now is not None
                and not (self.flow.write_paused or self.expect_100_continue)
                and _small(self.headers)
            ):
                self._offer = (cycle, app, now)  # on_message_complete offers it
            else:
                self._start_asgi_task(self.cycle, app)  # type: ignore[arg-type]
        else:  # pipelined behind an answer still going, as uvicorn queues them
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, app))  # type: ignore[arg-type]

    def _disarm(self) -> None:
        for timer in (self._header_timer, self._body_timer, self.timeout_keep_alive_task):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self.timeout_keep_alive_task = None

    # Keep-alive: uvicorn arms a timer after every response and cancels it on the next
    # request's first byte; here one timer per connection is pushed back instead.

    def on_response_complete(self) -> None:
        """uvicorn's, but for the keep-alive timer: armed only if none is pending."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = self.loop.time()
        self.flow.resume_reading()
        if self.pipeline:  # a pipelined request waits: start it
            self._idle_since = None
            self._body_seen = self._body_start = self.loop.time()  # its deadlines run from now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(
                self._idle_since + self.timeout_keep_alive, self._keep_alive_due
            )

    def _unset_keepalive_if_required(self) -> None:
        """uvicorn calls it on every read to cancel its timer; here a request's first byte
        ends the idle time (``on_message_begin``), not any read: stray bytes between
        requests do not keep a connection open."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._running = cycle  # the request whose answer is going (a later one may wait)
        super()._start_asgi_task(cycle, app)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:  # in use: the next response arms it again
            return
        due = self._idle_since + self.timeout_keep_alive
        if due > self.loop.time():  # used since it was armed: wait from its last answer
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def _held_back(self) -> bool:
        """Whether the client cannot be sending now because the server holds it back:
        reading paused (a full buffer, a request queued behind an answer still going),
        or a client waiting for ``100 Continue``."""
        cycle = self.cycle
        return (
            self.flow.read_paused
            or bool(self.pipeline)
            or (cycle is not None and cycle.waiting_for_100_continue)
        )

    def _headers_too_late(self) -> None:
        self._header_timer = None
        if self._held_back():  # its time starts when the server reads again
            self._header_timer = self.loop.call_later(
                self.options.header_seconds, self._headers_too_late
            )
            return
        cycle = self.cycle  # the request before, if any: its answer may still be going
        self._time_out(
            self.options.headers_late if cycle is None or cycle.response_complete else None
        )

    def _body_due(self) -> float:
        """When the current body passes a deadline: its next chunk's, or the whole body's
        (``request_body_total_seconds`` from its start, and a second per
        ``request_body_min_bytes_per_second`` bytes received, at most
        ``request_body_max_seconds`` from its start)."""
        options = self.options
        whole = self._body_start + options.body_total_seconds
        return min(
            self._body_seen + options.body_seconds,
            whole + self._body_bytes / options.body_min_rate,
            self._body_start + options.body_max_seconds,
        )

    def _body_too_late(self) -> None:
        self._body_timer = None
        now = self.loop.time()
        if self._held_back():  # its time starts again when the server reads again
            self._body_seen = self._body_start = now
            self._body_bytes = 0
        deadline = self._body_due()
        if deadline > now:  # a chunk came meanwhile: wait from it
            self._body_timer = self.loop.call_at(deadline, self._body_too_late)
            return
        path = self.scope.get("path", "")
        started = self.cycle is not None and self.cycle.response_started
        self._time_out(
            None if started else self.options.body_late[path == "/v1" or path.startswith("/v1/")]
        )

    def _refuse_or_400(self, error: httptools.HttpParserError) -> None:
        """A parser error: a limit passed in a callback (``_Refused``), else uvicorn's 400."""
        if isinstance(error.__context__, _Refused):
            self._refuse(error.__context__.answer)
        elif not self.transport.is_closing():
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)

    def _refuse(self, answer: bytes) -> None:
        """Close the connection over a limit, with ``answer`` unless an earlier request's
        answer is still to come or going (then it is cut, not written into)."""
        own = None if self._in_head else self.cycle  # trailers: their request's own cycle
        quiet = all(
            c is None or c.response_complete or (c is own and not c.response_started)
            for c in (self.cycle, self._running)
        )
        self._in_head = self._in_body = False
        if not quiet or self.transport.is_closing():
            self._time_out(None)
            return
        self.transport.write(answer)
        self._disarm()
        self._tell_gone()
        self.connections.discard(self)  # its connection_lost goes to the lingering protocol
        linger(self.transport)
        self.parser = None  # type: ignore[assignment]  # as connection_lost: no cycle, no held line

    def _time_out(self, answer: bytes | None) -> None:
        """Send ``answer`` (None once an answer has started), close the connection,
        and tell a running app."""
        if self.transport.is_closing():
            return
        if answer is not None:
            self.transport.write(answer)
        self._tell_gone()
        self.transport.close()

    def _tell_gone(self) -> None:
        """The client is gone: the latest request and the one running (if another) see
        ``http.disconnect``, and a lean cycle's watcher is called back."""
        for cycle in {id(c): c for c in (self.cycle, self._running) if c is not None}.values():
            if cycle.response_complete:
                continue
            cycle.disconnected = True
            cycle.message_event.set()
            if isinstance(cycle, LeanCycle):
                cycle.gone()
