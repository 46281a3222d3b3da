"""A lean HTTP/1.1 client for the proxy's calls to its workers, with a keep-alive pool.

Why not httpx: on this kind of machine an ``httpx.AsyncClient`` request costs about
0.9 ms of CPU (httpcore's anyio and h11 layers), twice what vllm-router spends on a whole
proxied request; this client costs about 0.1 ms. It speaks only what a vLLM worker on
the node needs: plain HTTP/1.1 over TCP, ``POST`` with a body already in memory, answers
with ``Content-Length``, chunked or read-to-close bodies, keep-alive.

Errors (all ``UpstreamError``):

- ``UpstreamConnectError``: the worker refused the connection or did not accept it in
  ``connect_timeout_seconds``; nothing reached it, so another worker may be tried.
- ``UpstreamClosed``: the worker closed the connection or sent something that is not
  HTTP/1.1 before the answer was complete (it died mid-request).

A pooled connection the worker closed while idle (uvicorn's keep-alive timeout is 5 s)
is detected, and a request that finds the connection closed before any byte of the
answer is sent again once on a new connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

__all__ = [
    "Answer",
    "Upstream",
    "UpstreamClient",
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "pool_for",
    "upstream_client",
]

_Headers = list[tuple[bytes, bytes]]
_READ_LIMIT = 1 << 20
"""Longest head line or head the client accepts (asyncio's StreamReader limit)."""
_DRAIN_ABOVE_BYTES = 1 << 16


class UpstreamError(Exception):
    """A worker could not be reached or failed mid-request."""


class UpstreamConnectError(UpstreamError):
    """The worker refused the connection or did not accept it in time."""


class UpstreamClosed(UpstreamError):
    """The worker closed the connection, or broke HTTP, before the answer was complete."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())


class UpstreamResponse:
    """A worker's answer: status and headers read, the body still on the connection.

    Read it with ``read()`` or ``chunks()`` (once), then ``close()`` (always): a complete
    answer gives the connection back to the pool, an incomplete one closes it, which is
    how the worker learns that the client went away."""

    __slots__ = ("_conn", "_done", "_keep_alive", "_key", "_length", "_pool", "headers", "status")

    def __init__(
        self,
        pool: Upstream,
        key: tuple[str, int],
        conn: _Connection,
        status: int,
        headers: _Headers,
        http10: bool = False,
    ) -> None:
        self._pool = pool
        self._key = key
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers
        """Lower-case names, in the worker's order."""
        self._length: int | None = None  # None: chunked; -1: until the connection closes
        self._keep_alive = not http10
        self._done = False
        chunked = False
        for name, value in headers:
            if name == b"content-length":
                self._length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                self._keep_alive = b"close" not in value.lower() and (
                    not http10 or b"keep-alive" in value.lower()
                )
        if chunked:
            self._length = None
        elif self._length is None:
            self._length = 0 if status in (204, 304) else -1
            self._keep_alive = self._keep_alive and self._length == 0

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives (chunked bodies: one item per chunk)."""
        assert self._conn is not None, "the body was already read or the response closed"
        reader = self._conn.reader
        try:
            if self._length is None:
                while size := int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
                    chunk = await reader.readexactly(size + 2)
                    yield chunk[:-2]
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer
                    pass
            elif self._length > 0:
                yield await reader.readexactly(self._length)
            elif self._length < 0:
                while chunk := await reader.read(_READ_LIMIT):
                    yield chunk
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise UpstreamClosed(f"the worker closed the connection mid-answer ({e!r})") from e
        self._done = True

    async def aclose(self) -> None:
        """Give the connection back if the body was read whole, else close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep_alive:
            self._pool._release(self._key, conn)
        else:
            conn.writer.close()


class Answer(Protocol):
    """A worker's answer with its body still to read (``UpstreamResponse``)."""

    status: int
    headers: _Headers

    def header(self, name: bytes) -> bytes | None: ...

    async def read(self) -> bytes: ...

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
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._origins: dict[str, tuple[str, int, bytes]] = {}

    async def request(
        self, base_url: str, path: str, body: bytes, headers: _Headers
    ) -> UpstreamResponse:
        """POST ``body`` to ``base_url + path``; the answer's head is read, not its body."""
        host, port, host_header = self._origin(base_url)
        head = b"".join(
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
            ]
        )
        key = (host, port)
        conn = self._checkout(key)
        if conn is not None:
            try:
                return await self._exchange(key, conn, head, body)
            except _NothingSent:  # the worker closed it while idle: once more, afresh
                pass
        conn = await self._connect(key)
        try:
            return await self._exchange(key, conn, head, body)
        except _NothingSent as e:
            raise UpstreamClosed(str(e)) from e

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.writer.close()

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

    def _checkout(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.writer.close()
        return None

    def _release(self, key: tuple[str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self._max_idle and conn.usable():
            idle.append(conn)
        else:
            conn.writer.close()

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(*key, limit=_READ_LIMIT)
        except (OSError, TimeoutError) as e:
            raise UpstreamConnectError(f"cannot connect to {key[0]}:{key[1]} ({e!r})") from e
        return _Connection(reader, writer)

    async def _exchange(
        self, key: tuple[str, int], conn: _Connection, head: bytes, body: bytes
    ) -> UpstreamResponse:
        try:
            conn.writer.write(head + body if len(body) < _DRAIN_ABOVE_BYTES else head)
            if len(body) >= _DRAIN_ABOVE_BYTES:
                conn.writer.write(body)
                await conn.writer.drain()
            status, headers, http10 = _parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
            while 100 <= status < 200:  # interim answers (100 Continue): skip
                status, headers, http10 = _parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
        except asyncio.IncompleteReadError as e:
            conn.writer.close()
            if not e.partial:
                raise _NothingSent("the worker closed the connection without answering") from e
            raise UpstreamClosed(f"the worker closed the connection mid-head ({e!r})") from e
        except (OSError, ValueError, asyncio.LimitOverrunError) as e:
            conn.writer.close()
            if isinstance(e, ConnectionResetError):
                raise _NothingSent(f"the worker reset the connection ({e!r})") from e
            raise UpstreamClosed(f"the worker failed before answering ({e!r})") from e
        except BaseException:
            conn.writer.close()
            raise
        return UpstreamResponse(self, key, conn, status, headers, http10)


class _NothingSent(Exception):
    """The connection was found closed before any byte of an answer."""


def _parse_head(raw: bytes) -> tuple[int, _Headers, bool]:
    """Status, lower-cased headers, and whether the answer is HTTP/1.0."""
    lines = raw.split(b"\r\n")
    first = lines[0]
    if first[:7] != b"HTTP/1." or first[8:9] != b" ":
        raise ValueError(f"not an HTTP/1.x answer: {first[:80]!r}")
    headers = []
    for line in lines[1:-2]:
        name, _, value = line.partition(b":")
        headers.append((name.lower(), value.strip()))
    return int(first[9:12]), headers, first[7:8] == b"0"


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


def pool_for(client: httpx.AsyncClient) -> UpstreamPool:
    """The lean pool of an ``UpstreamClient``; any other httpx client, adapted."""
    if isinstance(client, UpstreamClient):
        return client.pool
    return _HttpxPool(client)


class _HttpxPool:
    """``UpstreamPool`` over a plain ``httpx.AsyncClient`` (slower: about 0.9 ms of CPU a
    request more); for clients injected in tests or with custom transports."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def request(self, base_url: str, path: str, body: bytes, headers: _Headers) -> Answer:
        request = self._client.build_request("POST", base_url + path, content=body, headers=headers)
        try:
            response = await self._client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise UpstreamConnectError(f"cannot connect to {base_url} ({e!r})") from e
        except httpx.TransportError as e:
            raise UpstreamClosed(f"the worker failed before answering ({e!r})") from e
        return _HttpxAnswer(response)


class _HttpxAnswer:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = [(k.lower(), v) for k, v in response.headers.raw]

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.TransportError as e:
            raise UpstreamClosed(f"the worker closed the connection mid-answer ({e!r})") from e

    async def aclose(self) -> None:
        await self._response.aclose()
