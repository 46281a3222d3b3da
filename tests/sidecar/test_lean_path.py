"""The lean HTTP path and the protocol's body deadline (#15), against a real sidecar with
simulator workers on a declared node, through raw sockets: a POST to exactly one of the
proxy's paths goes straight to the proxy's app; with a query it takes the ordinary path."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from gatekeeper.proxy.serving import DEFAULT_MAX_BODY_BYTES
from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_guard import HttpGuard
from gatekeeper.sidecar.http_protocol import server_config
from tests.support.raw_http import Conn
from tests.support.sidecar_harness import TOKEN, Sidecar, running_sidecar, settings_for

KEY = "lean-key"
TIMEOUT_SECONDS = 0.5
BODY = {"model": "tiny", "prompt": "one two", "max_tokens": 2}


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    settings = settings_for(
        tmp_path_factory.mktemp("lean"),
        api_keys=[KEY],
        request_body_timeout_seconds=TIMEOUT_SECONDS,
    )
    with running_sidecar(settings) as sidecar:
        yield sidecar


def post(path: str, body: bytes, *, key: str | None = KEY, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{auth}{extra}\r\n"
    )
    return head.encode() + body


def ask(sc: Sidecar, request: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(request)
        return conn.response()
    finally:
        conn.close()


def completion(**fields: Any) -> bytes:
    return json.dumps({**BODY, **fields}).encode()


def shape(value: Any) -> Any:
    """The JSON's keys and value types, not its values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def test_lean_and_ordinary_paths_give_the_same_answer(sc: Sidecar) -> None:
    status, _, lean = ask(sc, post("/v1/completions", completion()))
    assert status == 200, lean
    status, _, ordinary = ask(sc, post("/v1/completions?x=1", completion()))
    assert status == 200, ordinary
    assert shape(json.loads(lean)) == shape(json.loads(ordinary))
    assert json.loads(lean)["choices"][0]["text"]


def test_a_stream_on_the_lean_path_relays_sse_to_done(sc: Sidecar) -> None:
    status, headers, body = ask(sc, post("/v1/completions", completion(stream=True)))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]" and len(events) >= 3, events
    assert all(json.loads(e)["choices"] for e in events[:-1])


def test_the_lean_path_needs_the_key(sc: Sidecar) -> None:
    status, headers, body = ask(sc, post("/v1/completions", completion(), key=None))
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    error = json.loads(body)["error"]
    assert error["type"] == "AuthenticationError" and error["code"] == "invalid_api_key"
    assert ask(sc, post("/v1/completions", completion(), key="wrong"))[0] == 401
    assert ask(sc, post("/v1/completions", completion()))[0] == 200


def test_the_lean_path_does_not_pass_the_key_on(tmp_path: Path) -> None:
    """The simulator does not show a worker's headers, so the proxy's app is stood in for by
    one that records them, on the sidecar's server config (and so its lean path)."""
    seen: list[dict[bytes, bytes]] = []

    async def recorder(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = HttpGuard(Starlette(), api_keys=[KEY], direct={"/v1/completions": recorder})
    app = Starlette()
    app.state.direct_routes = guard.direct_routes()
    settings = Settings(state_dir=tmp_path, admin_token=TOKEN)
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=0, settings=settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    try:
        port = server.servers[0].sockets[0].getsockname()[1]
        conn = Conn(f"http://127.0.0.1:{port}")
        conn.sock.sendall(post("/v1/completions", b"{}", extra="X-Trace: abc\r\n"))
        assert conn.head()[0] == 204
        conn.close()
    finally:
        server.should_exit = True
        thread.join(10)
    (headers,) = seen
    assert b"authorization" not in headers and headers[b"x-trace"] == b"abc"


def test_pipelined_lean_posts_answer_in_order_then_the_connection_serves_more(sc: Sidecar) -> None:
    conn = Conn(sc.url)
    try:
        first, second = completion(max_tokens=3), completion(prompt="three four five six")
        conn.sock.sendall(post("/v1/completions", first) + post("/v1/completions", second))
        answers = [conn.response(), conn.response()]
        assert [status for status, _, _ in answers] == [200, 200], answers
        usage = [json.loads(body)["usage"] for _, _, body in answers]
        assert [u["completion_tokens"] for u in usage] == [3, 2]
        assert usage[0]["prompt_tokens"] < usage[1]["prompt_tokens"]
        conn.sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert conn.response()[0] == 200
    finally:
        conn.close()


def test_expect_100_continue_on_the_lean_path(sc: Sidecar) -> None:
    body = completion()
    request = post("/v1/completions", body, extra="Expect: 100-continue\r\n")
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(request.removesuffix(body))
        assert conn.head() == (100, {})
        conn.sock.sendall(body)
        status, _, answer = conn.response()
        assert status == 200, answer
    finally:
        conn.close()


def test_the_body_deadline_bounds_each_chunk_not_the_whole_body(sc: Sidecar) -> None:
    body = completion()
    request = post("/v1/completions", body)
    head = request.removesuffix(body)
    cut = len(body) // 5
    pieces = [body[i * cut : (i + 1) * cut] for i in range(4)] + [body[4 * cut :]]
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(head)
        started = time.monotonic()
        for piece in pieces:
            time.sleep(0.6 * TIMEOUT_SECONDS)
            conn.sock.sendall(piece)
        assert time.monotonic() - started > 2 * TIMEOUT_SECONDS
        status, _, answer = conn.response()
        assert status == 200, answer
    finally:
        conn.close()


def _stall(sc: Sidecar, request: bytes) -> tuple[int, dict[str, str], bytes, float]:
    """Headers in one packet, a part of the body in a second, then nothing: the answer,
    how long it took, and the server has closed the connection."""
    head, _, body = request.partition(b"\r\n\r\n")
    conn = Conn(sc.url)
    try:
        conn.sock.sendall(head + b"\r\n\r\n")
        started = time.monotonic()
        time.sleep(0.1)
        conn.sock.sendall(body[:10])
        status, headers, answer = conn.response()
        seconds = time.monotonic() - started
        assert conn.buffer == b"" and conn.sock.recv(1) == b"", "the connection stayed open"
    finally:
        conn.close()
    return status, headers, answer, seconds


def test_a_stalled_lean_body_gets_408_and_the_connection_closed(sc: Sidecar) -> None:
    status, headers, body, seconds = _stall(sc, post("/v1/completions", completion()))
    assert status == 408 and headers["connection"] == "close", body
    assert seconds < 2 * TIMEOUT_SECONDS
    error = json.loads(body)["error"]
    assert error["type"] == "Request Timeout" and error["code"] == "request_timeout"
    assert "request_body_timeout_seconds" in error["message"]


def _deployment_ids(sc: Sidecar) -> list[str]:
    return [d["id"] for d in sc.admin.get("/admin/deployments").json()["deployments"]]


def test_a_stalled_admin_body_gets_408_quietly(
    sc: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    before = _deployment_ids(sc)
    uvicorn_log = logging.getLogger("uvicorn")  # it does not propagate to the root
    uvicorn_log.addHandler(caplog.handler)
    try:
        body = json.dumps({"model": "Qwen/Qwen3-0.6B", "name": "stalled"}).encode()
        request = post("/admin/deployments", body, key=TOKEN)
        status, headers, answer, seconds = _stall(sc, request)
        time.sleep(0.2)  # the admin API's answer to the disconnect, logged if it fails
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert status == 408 and headers["connection"] == "close", answer
    assert seconds < 2 * TIMEOUT_SECONDS
    error = json.loads(answer)["error"]
    assert error["type"] == "request_timeout" and error["code"] == "request_timeout"
    assert "Traceback" not in caplog.text and "internal error" not in caplog.text.lower()
    assert _deployment_ids(sc) == before  # nothing was created from half a body


def test_a_body_over_the_limit_gets_413_before_it_is_sent(sc: Sidecar) -> None:
    head = post("/v1/completions", b"").replace(
        b"Content-Length: 0", f"Content-Length: {DEFAULT_MAX_BODY_BYTES + 1}".encode()
    )
    started = time.monotonic()
    status, headers, body = ask(sc, head)
    assert status == 413 and time.monotonic() - started < TIMEOUT_SECONDS, body
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and error["param"] is None
    assert str(DEFAULT_MAX_BODY_BYTES) in error["message"]
    assert headers["x-should-retry"] == "false"


def test_a_pipelined_body_stalling_behind_a_stream_leaves_the_stream_whole(
    sc: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream may be cut when the pipelined request times out, but not written into."""
    uvicorn_log = logging.getLogger("uvicorn")
    uvicorn_log.addHandler(caplog.handler)
    stalled = post("/v1/completions", completion())
    conn = Conn(sc.url)
    try:
        stream = post("/v1/completions", completion(stream=True, max_tokens=100))  # ~1 s
        conn.sock.sendall(stream + stalled[:-5])
        assert conn.head()[0] == 200
        conn.chunks_to_close()
        time.sleep(0.2)  # the stream's app, if it fails, has logged it by now
    finally:
        conn.close()
        uvicorn_log.removeHandler(caplog.handler)
    assert "Exception in ASGI application" not in caplog.text
