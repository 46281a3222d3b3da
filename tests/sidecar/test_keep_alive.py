"""The sidecar's HTTP protocol keeps one keep-alive timer per connection, pushed back by
each answer instead of armed anew after every one (``http_protocol``): an idle
connection still closes ``timeout_keep_alive`` after its last answer, not its first,
and a connection in use is never closed under a request."""

from __future__ import annotations

import asyncio
import socket
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_protocol import sidecar_http_protocol
from tests.support.fake_upstream import serve_in_thread

KEEP_ALIVE_SECONDS = 0.6


async def slow(request: Request) -> PlainTextResponse:
    await asyncio.sleep(2 * KEEP_ALIVE_SECONDS)
    return PlainTextResponse("slow")


APP = Starlette(
    routes=[
        Route("/ok", lambda request: PlainTextResponse("ok")),
        Route("/slow", slow),
    ]
)


def get(conn: socket.socket, path: str) -> bytes:
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while not data.endswith((b"ok", b"slow")):
        chunk = conn.recv(65536)
        assert chunk, f"closed while waiting for {path}: {data!r}"
        data += chunk
    return data


def closed_after(conn: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``conn`` (recv returns b"")."""
    conn.settimeout(limit)
    start = time.monotonic()
    assert conn.recv(65536) == b""
    return time.monotonic() - start


def test_an_idle_connection_closes_a_keep_alive_after_its_last_answer() -> None:
    protocol = sidecar_http_protocol(Settings())
    with serve_in_thread(APP, http=protocol, timeout_keep_alive=KEEP_ALIVE_SECONDS) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as conn:
            first = time.monotonic()
            for _ in range(4):  # answers over 1.2 s: twice the keep-alive, never idle that long
                assert get(conn, "/ok").startswith(b"HTTP/1.1 200")
                time.sleep(KEEP_ALIVE_SECONDS / 2)
            assert time.monotonic() - first > 2 * KEEP_ALIVE_SECONDS
            idle = closed_after(conn, 5.0) + KEEP_ALIVE_SECONDS / 2
            assert 0.8 * KEEP_ALIVE_SECONDS <= idle <= 3 * KEEP_ALIVE_SECONDS


def test_a_request_longer_than_the_keep_alive_is_answered() -> None:
    protocol = sidecar_http_protocol(Settings())
    with serve_in_thread(APP, http=protocol, timeout_keep_alive=KEEP_ALIVE_SECONDS) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as conn:
            assert get(conn, "/ok").startswith(b"HTTP/1.1 200")
            assert get(conn, "/slow").startswith(b"HTTP/1.1 200")  # the timer came meanwhile
            assert get(conn, "/ok").startswith(b"HTTP/1.1 200")
