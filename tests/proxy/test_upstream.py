"""The proxy's lean HTTP/1.1 client (``gatekeeper.proxy.upstream`` and its
``worker_connection``) against raw asyncio servers on loopback that answer in ways
uvicorn does not: HTTP/1.0 read to close, chunked with extensions and trailers, a kept
connection closed unanswered, a body cut short, an interim 100, an answer that is not
HTTP, a body larger than the read-ahead bound."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from gatekeeper.proxy.upstream import (
    Exchange,
    Upstream,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamResponse,
    upstream_client,
)
from tests.support.fake_upstream import closed_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


async def with_raw_server(
    handler: Handler,
    client: Callable[[str, Upstream], Awaitable[None]],
    pool: Upstream | None = None,
) -> None:
    """Serve ``handler`` on a free port while ``client(url, pool)`` runs; closes every
    socket, the pool's too."""
    pool = pool or Upstream()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await client(f"http://127.0.0.1:{port}", pool)
    finally:
        await pool.aclose()
        server.close()
        await server.wait_closed()


def test_upstream_reads_http10_to_close_and_chunked_with_trailers() -> None:
    answers = [
        b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil close",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
        b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: 1\r\n\r\n",
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answers.pop(0))
        await writer.drain()
        writer.close()

    async def client(url: str, pool: Upstream) -> None:
        answer = await pool.request(url, "/x", b"{}", [])
        assert (answer.status, await answer.read()) == (200, b"until close")
        await answer.aclose()
        answer = await pool.request(url, "/x", b"{}", [(b"x-b", b"2")])
        assert answer.header(b"x-a") == b"1"
        # Chunks that arrived together come as one item: nothing waits for more.
        assert [chunk async for chunk in answer.chunks()] == [b"abcde"]
        await answer.aclose()

    asyncio.run(with_raw_server(handler, client))


def test_upstream_hands_each_chunk_on_as_it_arrives() -> None:
    """The worker sends the next event only once the client has seen the previous one."""
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            assert await asyncio.wait_for(seen.get(), 5) == event
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def client(url: str, pool: Upstream) -> None:
        answer = await pool.request(url, "/x", b"{}", [])
        async for chunk in answer.chunks():
            seen.put_nowait(chunk)
        await answer.aclose()

    asyncio.run(with_raw_server(handler, client))


def test_upstream_skips_interim_answers_and_refuses_what_is_not_http() -> None:
    big = b"x" * (3 << 20)  # past the read-ahead bound: reading pauses and resumes
    answers = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big),
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            await read_request(reader)
            writer.write(answers.pop(0))
            await writer.drain()
        await reader.read()

    async def client(url: str, pool: Upstream) -> None:
        answer = await pool.request(url, "/x", b"{}", [])
        assert (answer.status, await answer.read()) == (201, b"ok")
        await answer.aclose()
        answer = await pool.request(url, "/x", b"{}", [])
        assert await answer.read() == big
        await answer.aclose()
        with pytest.raises(UpstreamClosed, match=r"not an HTTP/1\.x answer"):
            await pool.request(url, "/x", b"{}", [])

    asyncio.run(with_raw_server(handler, client))


def test_upstream_resends_once_when_a_kept_connection_was_closed() -> None:
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the next request on this connection:
        writer.close()  # closed unanswered, as at the end of a keep-alive timeout

    async def client(url: str, pool: Upstream) -> None:
        for _ in range(3):
            answer = await pool.request(url, "/x", b"{}", [])
            assert await answer.read() == b"ok"
            await answer.aclose()

    asyncio.run(with_raw_server(handler, client))
    assert len(connections) == 3


class Sink:
    """An ``AnswerSink`` that records what it was handed, and wakes the test."""

    def __init__(self) -> None:
        self.got: list[tuple[str, Any]] = []
        self.done = asyncio.Event()

    def answered(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.got.append(("answered", (status, dict(headers), body)))
        self.done.set()

    def failed(self, error: UpstreamClosed) -> None:
        self.got.append(("failed", str(error)))
        self.done.set()

    def stale(self) -> None:
        self.got.append(("stale", None))
        self.done.set()

    def large(self, answer: UpstreamResponse) -> None:
        self.got.append(("large", answer.status))
        self.done.set()


async def post_now(pool: Upstream, url: str) -> tuple[Exchange | None, Sink]:
    sink = Sink()
    exchange = pool.post_now(url, "/x", b"{}", [(b"x-b", b"2")], sink)
    if exchange is not None:
        await asyncio.wait_for(sink.done.wait(), 5)
    return exchange, sink


def test_post_now_takes_a_whole_answer_on_an_idle_connection_only() -> None:
    """``post_now`` sends only on an idle pooled connection; the answer, in several
    writes, chunked, comes whole to the sink and the connection goes back to the pool."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        for _ in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head)
            await reader.readexactly(2)
            writer.write(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"3\r\nabc\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"2\r\nde\r\n0\r\n\r\n")
        await reader.read()

    async def client(url: str, pool: Upstream) -> None:
        assert pool.post_now(url, "/x", b"{}", [], Sink()) is None  # nothing idle yet
        answer = await pool.request(url, "/x", b"{}", [])
        assert await answer.read() == b"ok"
        await answer.aclose()
        for _ in range(2):  # the second finds the first's connection back in the pool
            exchange, sink = await post_now(pool, url)
            assert exchange is not None
            [(what, (status, headers, body))] = sink.got
            assert (what, status, headers[b"x-a"], body) == ("answered", 201, b"1", b"abcde")

    asyncio.run(with_raw_server(handler, client))
    assert all(b"x-b: 2\r\n" in head and b"content-length: 2" in head for head in seen)


def test_post_now_tells_a_stale_connection_from_a_failed_answer() -> None:
    """A kept connection the worker closes unanswered is ``stale`` (the caller may send
    again); one cut mid-answer is ``failed``; ``cancel`` closes the connection, which the
    worker sees."""
    ends: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)
        if len(ends) == 0:
            ends.append("closed unanswered")  # as at the end of a keep-alive timeout
        elif len(ends) == 1:
            ends.append("cut")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ncut")
            await writer.drain()
        else:
            ends.append("cancelled" if await reader.read() == b"" else "more came")

    async def client(url: str, pool: Upstream) -> None:
        for expected in ("stale", "failed"):
            answer = await pool.request(url, "/x", b"{}", [])
            await answer.read()
            await answer.aclose()
            _, sink = await post_now(pool, url)
            assert [what for what, _ in sink.got] == [expected]
        assert "mid-answer" in str(sink.got[0][1])
        answer = await pool.request(url, "/x", b"{}", [])
        await answer.read()
        await answer.aclose()
        sink = Sink()
        exchange = pool.post_now(url, "/x", b"{}", [], sink)
        assert exchange is not None
        await asyncio.sleep(0.05)
        exchange.cancel()
        for _ in range(100):
            if len(ends) == 3:
                break
            await asyncio.sleep(0.01)
        assert sink.got == []  # a cancelled exchange hands nothing on

    asyncio.run(with_raw_server(handler, client))
    assert ends == ["closed unanswered", "cut", "cancelled"]


def test_upstream_errors() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\ncut")
        await writer.drain()
        writer.close()

    async def client(url: str, pool: Upstream) -> None:
        answer = await pool.request(url, "/x", b"{}", [])
        with pytest.raises(UpstreamClosed):
            await answer.read()
        await answer.aclose()
        with pytest.raises(UpstreamConnectError):
            await pool.request(f"http://127.0.0.1:{closed_port()}", "/x", b"{}", [])
        with pytest.raises(ValueError, match="http://host:port"):
            await pool.request("https://example.com", "/x", b"{}", [])

    asyncio.run(with_raw_server(handler, client, Upstream(connect_timeout_seconds=1.0)))


def test_a_body_read_to_close_cut_by_a_reset_is_not_complete() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nhalf")
        await writer.drain()
        await asyncio.sleep(0.05)
        linger = struct.pack("ii", 1, 0)  # close with a reset, not an orderly end
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)

    async def client(url: str, pool: Upstream) -> None:
        answer = await pool.request(url, "/x", b"{}", [])
        with pytest.raises(UpstreamClosed):
            await answer.read()
        await answer.aclose()

    asyncio.run(with_raw_server(handler, client))


def test_upstream_client_is_an_httpx_client_that_closes_its_pool() -> None:
    async def main() -> None:
        client = upstream_client()
        assert isinstance(client, httpx.AsyncClient)
        await client.aclose()
        assert client.is_closed

    asyncio.run(main())
