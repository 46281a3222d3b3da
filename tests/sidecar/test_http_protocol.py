"""Headers that never complete (#13, item 10): ``gatekeeper serve`` answers 408 and closes
the connection once ``request_header_timeout_seconds`` have passed, whether the client
sent half a request or nothing at all, and goes on serving everyone else; requests whose
headers arrive in time, on new or kept-alive connections, are untouched."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.serve_process import sidecar
from tests.support.sidecar_harness import free_port_block

DEADLINE_SECONDS = 1.0


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    work = tmp_path_factory.mktemp("header-deadline")
    port = free_port_block(100)
    extra = f"request_header_timeout_seconds = {DEADLINE_SECONDS}\n"
    with sidecar(Path(work), port, preload=False, worker_env="{}", extra=extra):
        yield port


def read_all(conn: socket.socket, wait_seconds: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and when it closed."""
    conn.settimeout(wait_seconds)
    start, data = time.monotonic(), b""
    while chunk := conn.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def read_one(conn: socket.socket) -> bytes:
    """One whole response on a kept-alive connection (head and body may come apart)."""
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    assert len(body) == length, (head, body)
    return head + b"\r\n\r\n" + body


def healthz(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_all(conn, 10)[0]


def test_headers_that_never_end_get_408_and_the_connection_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        data, seconds = read_all(conn, 10 * DEADLINE_SECONDS)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data
    error = json.loads(body)["error"]
    assert "request_header_timeout_seconds" in error["message"]
    assert seconds < 5 * DEADLINE_SECONDS
    assert healthz(port).startswith(b"HTTP/1.1 200")


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        _, seconds = read_all(conn, 10 * DEADLINE_SECONDS)
    assert seconds < 5 * DEADLINE_SECONDS


def test_a_kept_alive_connection_is_held_to_the_deadline_on_its_next_request(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_one(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        data, _ = read_all(conn, 10 * DEADLINE_SECONDS)
    assert data.startswith(b"HTTP/1.1 408"), data


def test_headers_sent_slowly_but_in_time_are_served(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"Connection: close\r\n\r\n"):
            conn.sendall(part)
            time.sleep(DEADLINE_SECONDS / 4)
        data, _ = read_all(conn, 10)
    assert data.startswith(b"HTTP/1.1 200"), data
