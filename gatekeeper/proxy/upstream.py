"""A lean HTTP/1.1 client for the proxy's calls to its workers, with a keep-alive pool.

Each connection is a ``worker_connection.WorkerConnection`` (an ``asyncio.Protocol``
whose answers httptools parses); this module is the pool of them and the answers read
from them. It sends ``POST`` with a body already in memory, over plain TCP, which is all
a vLLM worker on the node needs. The body is handed on as it arrives: what one read from
the socket brought (several streamed events, when they came together) is one item of
``chunks()``, and nothing waits for more.

Why this client and not a library's (issue #15): ``python -m bench.upstream_clients``
on the 2-CPU build machine (uvloop, a simulator worker, a 16-token chat completion,
the CPU time of the client's process per request, median of 5 rounds of 1600, one
request at a time or 16 at once):

==============================  =========  ==========  ==========  ===========
client                          whole      stream      whole x16   stream x16
==============================  =========  ==========  ==========  ===========
this one (upstream.py)          0.072 ms   0.255 ms    0.045 ms    0.155 ms
aiohttp 3.14                    0.189 ms   0.378 ms    0.126 ms    0.242 ms
httpx 0.29                      0.637 ms   0.769 ms    1.128 ms    1.289 ms
==============================  =========  ==========  ==========  ===========

aiohttp costs one and a half to three times the CPU of a client this size, so the
proxy keeps its own. Against the StreamReader client it had before, this one costs
about the same per request and hands on together the events that arrived together
(one send to the client, not one each: ``gatekeeper serve`` relaying a simulator's
16-token stream spent 0.53 ms of CPU per stream before, 0.37 ms after); its parser is
the well-kept C one uvicorn uses (``httptools`` is already a dependency).

Errors (all ``UpstreamError``):

- ``UpstreamConnectError``: the worker refused the connection or did not accept it in
  ``connect_timeout_seconds``; nothing reached it, so another worker may be tried.
- ``UpstreamClosed``: the worker closed the connection or sent something that is not
  HTTP/1.1 before the answer was complete (it died mid-request), or answered what is no
  answer to a POST (a status outside 100-599, a 101 upgrade, a head over the bound:
  ``worker_connection``).

A pooled connection the worker closed while idle (uvicorn's keep-alive timeout is 5 s)
is detected, and a request that finds the connection closed before any byte of the
answer is sent again once on a new connection.

``Upstream.post_now`` is the same POST without a task, for an answer wanted whole: on an
idle pooled connection (None when there is none), its answer taken by the connection's
callbacks and handed to an ``AnswerSink`` when it is whole (``Exchange``), or, once its
body passes a bound, handed on as an ``UpstreamResponse`` to read as it comes. The
proxy's usual case, a non-streaming request to a ready worker, goes this way
(``serving.Proxy.answer_now``, ``worker_call.WorkerCall.now``). ``read_within`` is the
same bound with a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from gatekeeper.proxy.worker_connection import WorkerConnection, post_message

__all__ = [
    "WHOLE_ANSWER_LIMIT_BYTES",
    "Answer",
    "AnswerSink",
    "Exchange",
    "Upstream",
    "UpstreamClient",
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "upstream_client",
]

_Headers = list[tuple[bytes, bytes]]
WHOLE_ANSWER_LIMIT_BYTES = 8 * 1024 * 1024
"""The default bound on a body ``Exchange`` holds before handing the answer on."""


class UpstreamError(Exception):
    """A worker could not be reached or failed mid-request."""


class UpstreamConnectError(UpstreamError):
    """The worker refused the connection or did not accept it in time."""


class UpstreamClosed(UpstreamError):
    """The worker closed the connection, or broke HTTP, before the answer was complete."""


class _NothingSent(Exception):
    """The connection was found closed before any byte of an answer."""


class UpstreamResponse:
    """A worker's answer: status and headers read, the body still on the connection.

    Read it with ``read()`` or ``chunks()`` (once), then ``aclose()`` (always): a complete
    answer gives the connection back to the pool, an incomplete one closes it, which is
    how the worker learns that the client went away."""

    __slots__ = ("_conn", "_key", "_pool", "headers", "status")

    def __init__(self, pool: Upstream, key: tuple[str, int], conn: WorkerConnection) -> None:
        self._pool = pool
        self._key = key
        self._conn: WorkerConnection | None = conn
        self.status = conn.status
        self.headers = conn.headers
        """Lower-case names, in the worker's order."""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while (part := await self._next()) is not None:
            parts.append(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_within(self, limit_bytes: int) -> bytes | None:
        """The whole body if it is at most ``limit_bytes``; else None, and what was read
        comes first from ``chunks()``."""
        parts = []
        size = 0
        while (part := await self._next()) is not None:
            parts.append(part)
            size += len(part)
            if size > limit_bytes:
                assert self._conn is not None
                self._conn.hold(parts)
                return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives: what each read from the socket brought."""
        while (part := await self._next()) is not None:
            yield part

    async def _next(self) -> bytes | None:
        """The body bytes received since the last call, once there are any; None at the end."""
        conn = self._conn
        assert conn is not None, "the body was already read or the response closed"
        while True:
            if conn.body:
                return conn.take()
            if conn.complete:
                return None
            if conn.broken is not None or conn.lost is not None:
                why = conn.broken or repr(conn.lost)
                raise UpstreamClosed(f"the worker closed the connection mid-answer ({why})")
            await conn.wait()

    async def aclose(self) -> None:
        """Give the connection back if the body was read whole, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and conn.keep_alive and not conn.body:
            self._pool._release(self._key, conn)
        else:
            conn.close()


class AnswerSink(Protocol):
    """Where an ``Exchange`` hands its worker's answer; exactly one is called, once."""

    def answered(self, status: int, headers: _Headers, body: bytes) -> None:
        """The whole answer (headers with lower-case names, in the worker's order)."""

    def failed(self, error: UpstreamClosed) -> None:
        """The worker closed the connection or broke HTTP before the answer was whole."""

    def stale(self) -> None:
        """The connection was found closed before any byte of the answer: the worker had
        closed it while idle, and the request may be sent again on a new one."""

    def large(self, answer: UpstreamResponse) -> None:
        """The body passed the exchange's bound before it was whole: the rest is to be
        read from ``answer`` (what was received comes first), and ``answer`` closed."""


class Exchange:
    """A POST on a pooled connection whose answer the connection's callbacks collect
    (``Upstream.post_now``), handed whole to the sink, or as an ``UpstreamResponse`` to
    read on once its body passes ``limit_bytes``; ``cancel()`` closes the connection
    instead, which is how the worker learns that the client went away."""

    __slots__ = ("_conn", "_key", "_limit", "_parts", "_pool", "_sink", "_size")

    def __init__(
        self,
        pool: Upstream,
        key: tuple[str, int],
        conn: WorkerConnection,
        sink: AnswerSink,
        limit_bytes: int,
    ) -> None:
        self._pool = pool
        self._key = key
        self._conn: WorkerConnection | None = conn
        self._sink = sink
        self._limit = limit_bytes
        self._size = 0
        self._parts: list[bytes] = []
        conn.listener = self._read

    def cancel(self) -> None:
        conn = self._detach()
        if conn is not None:
            conn.close()

    def _detach(self) -> WorkerConnection | None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.listener = None
        return conn

    def _read(self) -> None:
        conn = self._conn
        assert conn is not None
        if conn.body:
            part = conn.take()  # taken as it comes: reading never pauses
            self._parts.append(part)
            self._size += len(part)
        if conn.complete:
            self._detach()
            parts = self._parts
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            if conn.keep_alive:
                self._pool._release(self._key, conn)
            else:
                conn.close()
            self._sink.answered(conn.status, conn.headers, body)
        elif conn.broken is not None or conn.lost is not None:
            self._detach()
            conn.close()
            if conn.broken is None and not conn.received:
                self._sink.stale()
                return
            why = conn.broken or repr(conn.lost)
            where = "mid-answer" if conn.head_done else "before answering"
            self._sink.failed(UpstreamClosed(f"the worker closed the connection {where} ({why})"))
        elif self._size > self._limit:  # too large to hold: the rest is read as it comes
            self._detach()
            conn.hold(self._parts)
            self._sink.large(UpstreamResponse(self._pool, self._key, conn))


class Answer(Protocol):
    """A worker's answer with its body still to read (``UpstreamResponse``)."""

    status: int
    headers: _Headers

    def header(self, name: bytes) -> bytes | None: ...

    async def read(self) -> bytes: ...

    async def read_within(self, limit_bytes: int) -> bytes | None: ...

    def chunks(self) -> AsyncGenerator[bytes, None]: ...

    async def aclose(self) -> None: ...


class UpstreamPool(Protocol):
    """Sends a POST to a worker (``Upstream``; ``pool_for`` adapts any httpx client)."""

    async def request(self, base_url: str, path: str, body: bytes, headers: _Headers) -> Answer: ...


class Upstream:
    """Keep-alive connections to workers, per host and port; share one per process."""

    def __init__(
        self, *, connect_timeout_seconds: float = 5.0, max_idle_per_worker: int = 512
    ) -> None:
        self._connect_timeout = connect_timeout_seconds
        self._max_idle = max_idle_per_worker
        self._idle: dict[tuple[str, int], list[WorkerConnection]] = {}
        self._origins: dict[str, tuple[str, int, bytes]] = {}

    async def request(
        self, base_url: str, path: str, body: bytes, headers: _Headers
    ) -> UpstreamResponse:
        """POST ``body`` to ``base_url + path``; the answer's head is read, not its body."""
        host, port, host_header = self._origin(base_url)
        message = post_message(host_header, path, body, headers)
        key = (host, port)
        conn = self._checkout(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, message)
            except _NothingSent:  # the worker closed it while idle: once more, afresh
                pass
        conn = await self._connect(key)
        try:
            return await self._exchange(key, conn, message)
        except _NothingSent as e:
            raise UpstreamClosed(str(e)) from e

    def post_now(
        self,
        base_url: str,
        path: str,
        body: bytes,
        headers: _Headers,
        sink: AnswerSink,
        *,
        limit_bytes: int = WHOLE_ANSWER_LIMIT_BYTES,
    ) -> Exchange | None:
        """POST ``body`` on an idle pooled connection, its whole answer to ``sink``, or
        the answer to read on once its body passes ``limit_bytes`` (module docstring);
        None, and nothing sent, when no connection to the worker is idle."""
        host, port, host_header = self._origin(base_url)
        key = (host, port)
        conn = self._checkout(key)
        if conn is None:
            return None
        exchange = Exchange(self, key, conn, sink, limit_bytes)
        conn.send(post_message(host_header, path, body, headers))
        return exchange

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _origin(self, base_url: str) -> tuple[str, int, bytes]:
        origin = self._origins.get(base_url)
        if origin is None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"only http://host:port worker URLs are supported: {base_url!r}")
            port = parts.port or 80
            origin = (parts.hostname, port, parts.netloc.encode())
            self._origins[base_url] = origin
        return origin

    def _checkout(self, key: tuple[str, int]) -> WorkerConnection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _release(self, key: tuple[str, int], conn: WorkerConnection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle and conn.usable():
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, key: tuple[str, int]) -> WorkerConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(WorkerConnection, *key)
        except (OSError, TimeoutError) as e:
            raise UpstreamConnectError(f"cannot connect to {key[0]}:{key[1]} ({e!r})") from e
        return conn

    async def _exchange(
        self, key: tuple[str, int], conn: WorkerConnection, message: bytes
    ) -> UpstreamResponse:
        try:
            conn.send(message)
            while not conn.head_done:
                if conn.broken is not None:
                    raise UpstreamClosed(f"the worker failed before answering ({conn.broken})")
                if conn.lost is not None:
                    if not conn.received:
                        raise _NothingSent(f"the worker closed the connection ({conn.lost!r})")
                    raise UpstreamClosed(
                        f"the worker closed the connection mid-head ({conn.lost!r})"
                    )
                await conn.wait()
        except BaseException:
            conn.close()
            raise
        return UpstreamResponse(self, key, conn)


class UpstreamClient(httpx.AsyncClient):
    """The sidecar's one HTTP client: httpx for everything else, and an ``Upstream`` pool
    (``.pool``) that the proxy forwards through. ``aclose()`` closes both."""

    def __init__(self, *, connect_timeout_seconds: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = Upstream(connect_timeout_seconds=connect_timeout_seconds)

    async def aclose(self) -> None:
        await self.pool.aclose()
        await super().aclose()


def upstream_client(
    *, max_connections: int = 1024, connect_timeout_seconds: float = 5.0
) -> UpstreamClient:
    """The client to share: keep-alive, a large pool, no read timeout (a generation may
    take minutes; the client's disconnect is what ends it)."""
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=30.0,
    )
    timeout = httpx.Timeout(None, connect=connect_timeout_seconds, pool=connect_timeout_seconds)
    return UpstreamClient(
        connect_timeout_seconds=connect_timeout_seconds,
        limits=limits,
        timeout=timeout,
        trust_env=False,
    )
