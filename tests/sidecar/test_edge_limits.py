"""The HTTP edge's limits on what a client makes the sidecar hold (issue #27 items 1-3),
against a real sidecar with simulator workers on a declared node, through raw sockets:

- a request head over ``max_request_head_bytes`` or ``max_request_headers`` gets 431 (a
  request target over the bound: 414) and the connection is closed, also when a header
  line, a chunked body's trailer line or the target never ends (the sidecar does not
  wait for its end);
- a body trickled slower than ``request_body_min_bytes_per_second`` past
  ``request_body_total_seconds`` gets 408 and the connection is closed, while a large
  body that keeps coming at the rate is read whole, up to ``request_body_max_seconds``:
  one that keeps coming just above the rate is cut there;
- with ``api_keys`` set, an open route (``/tokenize``, ``/pooling``, ...) without a key
  reaches only a model with a ready worker: anything that would launch one is 401.
"""

from __future__ import annotations

import json
import select
import time
from collections.abc import Iterator

import pytest

from tests.sidecar.test_lean_path import ask
from tests.sidecar.test_lean_path import post as lean_post
from tests.support.raw_http import Conn
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

KEY = "edge-key"
HEAD_BYTES = 32768
TOTAL_SECONDS = 1.0
RATE = 100_000
"""Bytes per second that earn a body one more second (request_body_min_bytes_per_second)."""
MAX_SECONDS = 2.5
"""The most a whole body may take (request_body_max_seconds)."""


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    settings = settings_for(
        tmp_path_factory.mktemp("edge"),
        api_keys=[KEY],
        request_body_timeout_seconds=10.0,  # per chunk: never what ends these bodies
        request_body_total_seconds=TOTAL_SECONDS,
        request_body_min_bytes_per_second=RATE,
        request_body_max_seconds=MAX_SECONDS,
    )
    assert settings.max_request_head_bytes == HEAD_BYTES
    assert settings.max_request_headers == 100
    with running_sidecar(settings) as sidecar:
        yield sidecar


def post(path: str, body: bytes, *, key: str | None = KEY) -> bytes:
    return lean_post(path, body, key=key)


def refused(sc: Sidecar, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """The answer to ``request`` sent whole, and the server has closed the connection."""
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(request)
        status, headers, body = conn.response()
        assert conn.buffer == b"" and conn.sock.recv(1) == b"", "the connection stayed open"
    finally:
        conn.close()
    return status, headers, body


def endless(sc: Sidecar, start: bytes, piece: bytes) -> tuple[int, dict[str, str], bytes, float]:
    """Send ``start``, then ``piece`` after ``piece`` (a head that never ends) up to
    256 KiB, unless the server answers first: its answer, and how long it took after the
    head passed the bound (the header deadline is 30 s)."""
    conn = Conn(sc.url)
    conn.sock.settimeout(5.0)
    try:
        conn.sock.sendall(start)
        sent, passed = len(start), None
        while sent < 256 << 10 and not select.select([conn.sock], [], [], 0.001)[0]:
            conn.sock.sendall(piece)
            sent += len(piece)
            if passed is None and sent > HEAD_BYTES:
                passed = time.monotonic()
        status, headers, body = conn.response()
        seconds = time.monotonic() - (passed or time.monotonic())
        assert conn.sock.recv(1) == b"", "the connection stayed open"
    finally:
        conn.close()
    return status, headers, body, seconds


def headers(count: int, size: int) -> str:
    return "".join(f"X-Pad-{i}: {'a' * size}\r\n" for i in range(count))


def _assert_431(status: int, answer: bytes) -> None:
    assert status == 431, answer
    error = json.loads(answer)["error"]
    assert error["code"] == "request_header_fields_too_large"
    assert error["type"] == "Request Header Fields Too Large"
    assert (
        "max_request_head_bytes" in error["message"] and "max_request_headers" in error["message"]
    )


def test_a_head_within_the_bounds_is_served(sc: Sidecar) -> None:
    request = f"GET /healthz HTTP/1.1\r\nHost: x\r\n{headers(90, 300)}\r\n".encode()
    assert 27_000 < len(request) < HEAD_BYTES
    assert ask(sc, request)[0] == 200


@pytest.mark.parametrize("target", ["/healthz", "/v1/completions"])
def test_a_head_over_the_bound_gets_431_and_is_closed(sc: Sidecar, target: str) -> None:
    request = f"POST {target} HTTP/1.1\r\nHost: x\r\n{headers(40, 1000)}\r\n".encode()
    status, answer_headers, answer = refused(sc, request)
    _assert_431(status, answer)
    assert answer_headers["connection"] == "close"


def test_one_header_field_too_many_gets_431(sc: Sidecar) -> None:
    assert ask(sc, f"GET /healthz HTTP/1.1\r\n{headers(99, 1)}\r\n".encode())[0] == 200
    status, _, answer = refused(sc, f"GET /healthz HTTP/1.1\r\n{headers(101, 1)}\r\n".encode())
    _assert_431(status, answer)


def test_an_endless_header_line_is_cut_at_the_bound(sc: Sidecar) -> None:
    start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: "
    status, _, answer, seconds = endless(sc, start, b"a" * 4096)
    _assert_431(status, answer)
    assert seconds < 1.0  # cut at the bound, not when the line ends (never) or times out


def test_an_endless_stream_of_header_lines_is_cut_at_the_bound(sc: Sidecar) -> None:
    status, _, answer, seconds = endless(sc, b"GET /healthz HTTP/1.1\r\n", b"X-A: b\r\n" * 8)
    _assert_431(status, answer)
    assert seconds < 1.0


def test_an_endless_trailer_line_of_a_chunked_body_is_cut_at_the_bound(sc: Sidecar) -> None:
    start = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Endless: "
    ).encode()
    status, _, answer, seconds = endless(sc, start, b"a" * 4096)
    _assert_431(status, answer)
    assert seconds < 1.0


def test_a_target_over_the_bound_gets_414(sc: Sidecar) -> None:
    long_target = b"GET /v1/models?" + b"q" * HEAD_BYTES + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    status, _, answer = refused(sc, long_target)
    assert status == 414, answer
    error = json.loads(answer)["error"]
    assert error["code"] == "uri_too_long" and "max_request_head_bytes" in error["message"]
    status, _, answer, seconds = endless(sc, b"GET /", b"a" * 4096)
    assert status == 414 and seconds < 1.0, (status, seconds)


def test_a_trickled_body_gets_408_after_the_total_deadline(sc: Sidecar) -> None:
    body = json.dumps({"model": "tiny", "prompt": "x" * 100}).encode()
    request = post("/v1/completions", body)
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(request[: -len(body)])
        started = time.monotonic()
        sent = 0
        while not select.select([conn.sock], [], [], 0.1)[0] and sent < len(body):
            conn.sock.sendall(body[sent : sent + 1])  # a byte every 0.1 s
            sent += 1
        status, headers_, answer = conn.response()
        seconds = time.monotonic() - started
        assert conn.sock.recv(1) == b"", "the connection stayed open"
    finally:
        conn.close()
    assert status == 408 and headers_["connection"] == "close", answer
    # from the end of the headers (the server's clock: uvloop's, in whole milliseconds)
    assert TOTAL_SECONDS - 0.1 <= seconds < TOTAL_SECONDS + 1.5, seconds
    error = json.loads(answer)["error"]
    assert error["code"] == "request_timeout" and "request_body_total_seconds" in error["message"]


def test_a_large_body_that_keeps_coming_at_the_rate_is_read_whole(sc: Sidecar) -> None:
    body = json.dumps({"model": "no-such-model", "prompt": "x" * (2 * RATE)}).encode()
    request = post("/v1/completions", body)
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(request[: -len(body)])
        started = time.monotonic()
        for at in range(0, len(body), RATE // 10):
            conn.sock.sendall(body[at : at + RATE // 10])
            time.sleep(0.08)  # 1.25 * RATE bytes per second: 1.6 s in all
        assert time.monotonic() - started > 1.5 * TOTAL_SECONDS
        status, _, answer = conn.response()
    finally:
        conn.close()
    assert status == 404, answer  # read whole, then routed: no such model


def test_a_body_just_above_the_rate_is_cut_at_the_ceiling(sc: Sidecar) -> None:
    """1.1 x the rate earns more time than it takes, for ever (the issue's 600 B/s against
    500 held a connection for about 15 hours); the ceiling cuts it at MAX_SECONDS."""
    body = json.dumps({"model": "tiny", "prompt": "x" * (5 * RATE)}).encode()
    request = post("/v1/completions", body)
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(request[: -len(body)])
        started = time.monotonic()
        sent = 0
        while sent < len(body) and not select.select([conn.sock], [], [], 0.0)[0]:
            conn.sock.sendall(body[sent : sent + RATE // 10])
            sent += RATE // 10
            time.sleep(0.09)  # 1.11 x RATE bytes per second
        status, headers_, answer = conn.response()
        seconds = time.monotonic() - started
        assert conn.sock.recv(1) == b"", "the connection stayed open"
    finally:
        conn.close()
    print(
        f"a body at 1.11 x the minimum rate cut after {seconds:.2f} s, {sent} of {len(body)} bytes"
    )
    assert status == 408 and headers_["connection"] == "close", answer
    assert MAX_SECONDS - 0.1 <= seconds < MAX_SECONDS + 1.0, seconds
    assert sent < len(body)  # the rate rule alone would have read it whole
    error = json.loads(answer)["error"]
    assert "request_body_max_seconds" in error["message"]


def _deployments(sc: Sidecar) -> list[str]:
    return [d["name"] for d in sc.admin.get("/admin/deployments").json()["deployments"]]


TOKENIZE = json.dumps({"model": "tiny", "prompt": "one two three"}).encode()
OTHER = "Qwen/Qwen3-0.6B"
"""An allowed model no test here launches."""


@pytest.mark.parametrize("path", ["/tokenize", "/tokenize?via=ordinary", "/pooling", "/score"])
def test_an_open_route_without_a_key_launches_nothing(sc: Sidecar, path: str) -> None:
    body = json.dumps({"model": OTHER, "prompt": "a", "input": "a", "text_1": "a", "text_2": "b"})
    for key in (None, "wrong"):
        status, headers_, answer = ask(sc, post(path, body.encode(), key=key))
        assert status == 401 and headers_["www-authenticate"] == "Bearer", answer
        error = json.loads(answer)["error"]
        assert error["code"] == "invalid_api_key" and "no ready worker" in error["message"]
    assert OTHER not in _deployments(sc)


def test_a_key_launches_and_then_the_open_route_serves_the_running_model(sc: Sidecar) -> None:
    status, _, answer = ask(sc, post("/tokenize", TOKENIZE, key=None))
    assert status == 401, answer
    status, _, answer = ask(sc, post("/tokenize", TOKENIZE))  # with the key: launched
    assert status == 200 and json.loads(answer)["tokens"], answer
    for path in ("/tokenize", "/tokenize?via=ordinary"):
        status, _, answer = ask(sc, post(path, TOKENIZE, key=None))
        assert status == 200 and json.loads(answer)["tokens"], answer
    assert _deployments(sc) == ["tiny"]
