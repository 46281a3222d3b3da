"""Worker answers the proxy does not expect, and hop-by-hop headers (issue #27 items 5, 6),
through the sidecar's HTTP protocol (its lean path and its ordinary one) in front of a
stand-in worker on loopback that records the raw requests it gets and answers as each
request's ``mode`` says:

- a status outside 100-599 (999) and a 101 upgrade become a 502 in OpenAI's shape,
  never a dropped connection or an error the server logs;
- an answer larger than ``max_whole_answer_bytes`` is relayed as it comes (the client
  has its first megabyte before the worker sends the rest), and one the worker cuts
  leaves the client's chunked body unfinished and its connection closed;
- Connection and the fields it names, Keep-Alive, TE, Trailer, Transfer-Encoding,
  Upgrade, Proxy-*, Expect and trailer fields reach neither the worker nor the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from starlette.applications import Starlette

from gatekeeper.proxy import Endpoint, Proxy
from gatekeeper.proxy.upstream import upstream_client
from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_guard import HttpGuard
from gatekeeper.sidecar.http_protocol import server_config
from tests.support.fake_upstream import serve_in_thread
from tests.support.raw_http import Conn

LIMIT = 1 << 20
LARGE = 3 * LIMIT
PATHS = ["/v1/completions", "/v1/completions?via=ordinary"]


class OddWorker:
    """A worker on a raw socket: keeps each request's raw head, answers by ``mode``."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.release = threading.Event()
        """Set by the test to let a ``large`` answer's second half go."""
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None

    @contextmanager
    def running(self) -> Iterator[str]:
        started = threading.Event()
        thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        thread.start()
        assert started.wait(10)
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        started.set()
        try:
            self.loop.run_forever()
        finally:
            self.server.close()
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.server.wait_closed())
            self.loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                if head.startswith(b"GET "):  # /v1/responses/{id}?model=m&mode=...
                    mode = head.split(b" ")[1].split(b"mode=")[1].decode()
                else:
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    mode = json.loads(await reader.readexactly(length))["mode"]
                if not await self._answer(mode, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, mode: str, writer: asyncio.StreamWriter) -> bool:
        """Answer in ``mode``; False when the connection is to be closed."""
        if mode == "plain":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
            writer.write(b'content-length: 12\r\n\r\n{"ok": true}')
        elif mode == "status999":
            writer.write(b"HTTP/1.1 999 Odd\r\ncontent-length: 2\r\n\r\n{}")
        elif mode == "upgrade":
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n")
            writer.write(b"connection: upgrade\r\n\r\n\x81\x05hello")
        elif mode == "hop":
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"connection: x-hop-answer\r\nx-hop-answer: 1\r\nkeep-alive: timeout=5\r\n"
                b"proxy-authenticate: Basic\r\nproxy-connection: keep-alive\r\n"
                b"trailer: x-answer-trailer\r\nx-end-answer: 1\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
                b"2\r\n{}\r\n0\r\nx-answer-trailer: 1\r\n\r\n"
            )
        else:  # large, cut: LARGE bytes announced, the second half after release
            half = b"x" * (LARGE // 2)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (LARGE, half))
            await writer.drain()
            if mode == "cut":
                return False
            await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 10)
            writer.write(half)
        await writer.drain()
        return mode not in ("upgrade",)


class ReadyResolver:
    """Every model is served by the one worker, ready (the proxy's lean path too)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def ready(self, model: str) -> list[Endpoint]:
        return [Endpoint("odd", self.url, model)]

    async def endpoints(self, model: str) -> list[Endpoint]:
        return self.ready(model)

    async def models(self) -> list[dict[str, Any]]:
        return []

    def canonical(self, model: str) -> str:
        return model

    def report(self, endpoint: Endpoint, outcome: str) -> None:
        pass


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[OddWorker, str]]:
    worker = OddWorker()
    with worker.running() as worker_url:
        client = upstream_client()
        proxy = Proxy(ReadyResolver(worker_url), client, max_whole_answer_bytes=LIMIT)

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            await client.aclose()

        app = Starlette(routes=proxy.routes(), lifespan=lifespan)
        guard = HttpGuard(app.build_middleware_stack(), api_keys=[], direct=proxy.direct_routes())
        app.middleware_stack = guard
        app.state.direct_routes = guard.direct_routes()
        config = server_config(app, host="127.0.0.1", port=0, settings=Settings())
        options = {"http": config.http, "loop": "uvloop", "log_level": "warning"}
        with serve_in_thread(app, **options) as url:
            yield worker, url


def request(path: str, mode: str, extra: str = "") -> bytes:
    body = json.dumps({"model": "m", "mode": mode}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def warmed(url: str, path: str) -> Conn:
    """A connection that has had one plain answer: the proxy holds an idle connection to
    the worker now, so the next whole-answer POST on the lean path is taken without a
    task (``Proxy.answer_now``); with a query it takes the ordinary path."""
    conn = Conn(url)
    conn.sock.sendall(request(path, "plain"))
    status, _, body = conn.response()
    assert (status, body) == (200, b'{"ok": true}')
    return conn


def ask(url: str, path: str, mode: str, extra: str = "") -> tuple[int, dict[str, str], bytes]:
    conn = warmed(url, path)
    try:
        conn.sock.sendall(request(path, mode, extra))
        return conn.response()
    finally:
        conn.close()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["status999", "upgrade"])
def test_an_odd_status_or_an_upgrade_from_a_worker_is_a_502(
    rig: tuple[OddWorker, str], path: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    try:
        status, _, body = ask(rig[1], path, mode)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert status == 502, body
    error = json.loads(body)["error"]
    assert error["code"] == "worker_failed_mid_request" and error["type"] == "Bad Gateway"
    assert ("999" if mode == "status999" else "101 Switching Protocols") in error["message"]
    assert "Exception" not in caplog.text and "Traceback" not in caplog.text


@pytest.mark.parametrize("path", PATHS)
def test_a_large_answer_is_relayed_as_it_comes(rig: tuple[OddWorker, str], path: str) -> None:
    worker, url = rig
    worker.release.clear()
    conn = warmed(url, path)
    try:
        conn.sock.sendall(request(path, "large"))
        status, headers = conn.head()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        while len(conn.buffer) < LIMIT:  # before the worker has sent its second half
            conn._fill()
        assert not worker.release.is_set()
        worker.release.set()
        body = b""
        while size := int(conn._line(), 16):
            body += conn._take(size)
            assert conn._take(2) == b"\r\n"
        assert body == b"x" * LARGE
    finally:
        worker.release.set()
        conn.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_large_answer_the_worker_cuts_is_left_unfinished(
    rig: tuple[OddWorker, str], path: str
) -> None:
    conn = warmed(rig[1], path)
    try:
        conn.sock.sendall(request(path, "cut"))
        status, headers = conn.head()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        assert not conn.chunks_to_close()  # closed before the last chunk
    finally:
        conn.close()


HOP_REQUEST = (
    "Connection: keep-alive, X-Hop-Request\r\nX-Hop-Request: 1\r\nKeep-Alive: timeout=5\r\n"
    "TE: trailers\r\nTrailer: X-Request-Trailer\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\n"
    "Proxy-Authorization: Basic eDp5\r\nX-End-Request: 1\r\n"
)


def _names(head: bytes) -> set[str]:
    lines = head.decode().split("\r\n")[1:]
    return {line.split(":", 1)[0].strip().lower() for line in lines if ":" in line}


@pytest.mark.parametrize("path", PATHS)
def test_hop_by_hop_fields_are_dropped_both_ways(rig: tuple[OddWorker, str], path: str) -> None:
    worker, url = rig
    worker.heads.clear()
    status, headers, body = ask(url, path, "hop", HOP_REQUEST)
    assert status == 200 and json.loads(body) == {}
    hop = {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
    hop |= {"proxy-connection", "proxy-authorization", "proxy-authenticate", "expect"}
    received = _names(worker.heads[-1])
    assert "x-end-request" in received and not received & (hop | {"x-hop-request"}), received
    assert "x-end-answer" in headers
    assert not set(headers) & (hop | {"x-hop-answer", "x-answer-trailer"}), headers


@pytest.mark.parametrize("path", PATHS)
def test_trailers_and_expect_are_never_passed_on(rig: tuple[OddWorker, str], path: str) -> None:
    worker, url = rig
    worker.heads.clear()
    body = json.dumps({"model": "m", "mode": "plain"}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        "Expect: 100-continue\r\nX-End-Request: 1\r\n\r\n"
    )
    conn = Conn(url)
    try:
        conn.sock.sendall(head.encode())
        assert conn.head() == (100, {})
        conn.sock.sendall(b"%x\r\n%b\r\n0\r\nX-Request-Trailer: evil\r\n\r\n" % (len(body), body))
        status, _, answer = conn.response()
    finally:
        conn.close()
    assert status == 200, answer
    received = _names(worker.heads[-1])
    assert "x-end-request" in received, received
    assert not received & {"x-request-trailer", "expect", "transfer-encoding"}, received


STORED = "/v1/responses/resp-1?model=m&mode="


def get(url: str, target: str) -> Conn:
    conn = Conn(url)
    conn.sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return conn


def test_a_stored_response_is_bounded_like_a_whole_answer(rig: tuple[OddWorker, str]) -> None:
    """GET /v1/responses/{id}?model= goes through httpx, not the lean pool: the same
    rules hold (a status outside 200-599 is a 502, a large answer is relayed)."""
    worker, url = rig
    conn = get(url, STORED + "plain")
    try:
        status, headers, body = conn.response()
        assert (status, body) == (200, b'{"ok": true}') and headers["content-length"] == "12"
    finally:
        conn.close()
    conn = get(url, STORED + "status999")
    try:
        status, _, body = conn.response()
        assert status == 502 and "999" in json.loads(body)["error"]["message"], body
    finally:
        conn.close()
    worker.release.clear()
    conn = get(url, STORED + "large")
    try:
        status, headers = conn.head()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        while len(conn.buffer) < LIMIT:  # before the worker has sent its second half
            conn._fill()
        worker.release.set()
        assert conn.chunks_to_close()
    finally:
        worker.release.set()
        conn.close()
