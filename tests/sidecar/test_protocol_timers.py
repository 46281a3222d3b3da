"""The sidecar's HTTP protocol's timers and its lean path's bookkeeping
(``http_protocol``), on a real uvicorn server with raw sockets:

- one keep-alive timer per connection, pushed back by each answer: an idle connection
  closes ``timeout_keep_alive`` after its last answer, not its first, stray bytes between
  requests do not keep it open, and a request longer than the keep-alive is answered;
- the header and body deadlines count only time in which the client could send: not
  while the server holds reading back (a full buffer, a request queued behind an answer
  still going);
- a client gone mid-stream cancels the stream even with a request queued behind it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gatekeeper.proxy.relay import DisconnectWatch
from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_protocol import sidecar_http_protocol
from tests.support.fake_upstream import serve_in_thread

KEEP_ALIVE_SECONDS = 0.6
DEADLINE_SECONDS = 0.5
EVENTS = 10
events: list[str] = []


async def slow(request: Request) -> PlainTextResponse:
    await asyncio.sleep(2 * KEEP_ALIVE_SECONDS)
    return PlainTextResponse("slow")


async def _body(receive: Receive) -> bytes | None:
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def whole(scope: Scope, receive: Receive, send: Send) -> None:
    body = await _body(receive)
    await PlainTextResponse(f"len={len(body or b'')}")(scope, receive, send)


async def late_reader(scope: Scope, receive: Receive, send: Send) -> None:
    await asyncio.sleep(3 * DEADLINE_SECONDS)  # reads nothing meanwhile: reading pauses
    body = await _body(receive)
    await PlainTextResponse(f"len={len(body or b'')}")(scope, receive, send)


async def stream(scope: Scope, receive: Receive, send: Send) -> None:
    await _body(receive)
    watch = DisconnectWatch(receive, scope)
    try:
        start = {"type": "http.response.start", "status": 200, "headers": []}
        await send(start)
        for i in range(EVENTS):
            await asyncio.sleep(0.1)
            await send(
                {"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        events.append("done")
    except asyncio.CancelledError:
        events.append("cancelled")
        watch.absorb()
    finally:
        watch.stop()


APP = Starlette(
    routes=[Route("/ok", lambda request: PlainTextResponse("ok")), Route("/slow", slow)]
)
DIRECT = {"/whole": whole, "/late": late_reader, "/stream": stream}


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    settings = Settings(
        request_header_timeout_seconds=DEADLINE_SECONDS,
        request_body_timeout_seconds=DEADLINE_SECONDS,
    )
    protocol = sidecar_http_protocol(settings, DIRECT)
    with serve_in_thread(APP, http=protocol, timeout_keep_alive=KEEP_ALIVE_SECONDS) as url:
        yield int(url.rsplit(":", 1)[1])


def get(conn: socket.socket, path: str) -> bytes:
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while not data.endswith((b"ok", b"slow")):
        chunk = conn.recv(65536)
        assert chunk, f"closed while waiting for {path}: {data!r}"
        data += chunk
    return data


def post(path: str, body: bytes = b"{}") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def read_to_close(conn: socket.socket, limit: float = 10.0) -> tuple[bytes, float]:
    """Everything until the server closes ``conn``, and the seconds it took."""
    conn.settimeout(limit)
    start, data = time.monotonic(), b""
    while chunk := conn.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def test_an_idle_connection_closes_a_keep_alive_after_its_last_answer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        first = time.monotonic()
        for _ in range(4):  # answers over 1.2 s: twice the keep-alive, never idle that long
            assert get(conn, "/ok").startswith(b"HTTP/1.1 200")
            time.sleep(KEEP_ALIVE_SECONDS / 2)
        assert time.monotonic() - first > 2 * KEEP_ALIVE_SECONDS
        data, seconds = read_to_close(conn)
        assert data == b""
        idle = seconds + KEEP_ALIVE_SECONDS / 2
        assert 0.8 * KEEP_ALIVE_SECONDS <= idle <= 3 * KEEP_ALIVE_SECONDS


def test_stray_bytes_between_requests_do_not_keep_a_connection_open(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        assert get(conn, "/ok").startswith(b"HTTP/1.1 200")
        conn.sendall(b"\r\n")  # no request begins
        _, seconds = read_to_close(conn)
        assert seconds <= 3 * KEEP_ALIVE_SECONDS


def test_a_request_longer_than_the_keep_alive_is_answered(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        assert get(conn, "/ok").startswith(b"HTTP/1.1 200")
        assert get(conn, "/slow").startswith(b"HTTP/1.1 200")  # the timer came meanwhile
        assert get(conn, "/ok").startswith(b"HTTP/1.1 200")


def test_a_body_the_server_has_not_read_yet_is_not_timed(port: int) -> None:
    """4 MiB sent at once to an app that reads it 1.5 s later: uvicorn pauses reading
    past 64 KiB, so the rest of the body waits on the server, not the client."""
    body = b"x" * (4 << 20)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        sender = threading.Thread(target=conn.sendall, args=(post("/late", body),))
        sender.start()
        conn.settimeout(10)
        data = b""
        while not data.endswith(b"len=%d" % len(body)):
            chunk = conn.recv(65536)
            assert chunk, data
            data += chunk
        sender.join(10)
        assert data.startswith(b"HTTP/1.1 200")


def test_a_stream_outlives_the_header_deadline_of_requests_queued_behind_it(
    port: int,
) -> None:
    """A stream, a whole request queued behind it, and the half headers of a third: the
    third's deadline starts when the server reads again (after the stream)."""
    events.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(post("/stream") + post("/whole") + b"POST /whole HTTP/1.1\r\nHost: x\r\n")
        data, seconds = read_to_close(conn)
    assert data.count(b"data: ") == EVENTS and b"len=2" in data
    assert data.index(b"len=2") < data.index(b"408 Request Timeout")  # then its deadline
    assert seconds >= EVENTS * 0.1 and events == ["done"]


def test_a_client_gone_mid_stream_cancels_it_with_a_request_queued_behind(port: int) -> None:
    events.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(post("/stream") + post("/whole"))
        conn.recv(200)
        time.sleep(0.3)
    deadline = time.monotonic() + 5
    while not events and time.monotonic() < deadline:
        time.sleep(0.05)
    assert events == ["cancelled"]
