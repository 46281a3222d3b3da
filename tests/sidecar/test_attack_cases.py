"""The attacks that the installed ``gatekeeper serve`` held when tried by hand (issue #27),
kept as tests against the real command with ``api_keys`` set, through raw sockets:

- request smuggling and framing: every ambiguous or malformed framing (Content-Length
  with Transfer-Encoding, two lengths, obfuscated Transfer-Encoding, bad chunk sizes,
  bare LF, obsolete line folding, NUL in a field) gets one 400 and the connection is
  closed, so the request hidden behind it is never read;
- key bypass: no spelling of a path, method or ``Authorization`` field reaches a model
  or the admin API without its key, and nothing is launched;
- pipelining: requests sent in one write are answered in order on one connection;
- slowloris: hundreds of connections holding unfinished heads neither stop the sidecar
  from serving nor keep their file descriptors past the header deadline;
- ``Expect: 100-continue``: a request without the key is refused before its body is
  asked for; with the key, the body is asked for and the request served.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.raw_http import Conn
from tests.support.serve_cli import ServeProcess, serve_process

KEY = "attack-key"
HEADER_SECONDS = 2.0
CHAT = json.dumps(
    {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}]}
).encode()


@pytest.fixture(scope="module")
def sp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    work = tmp_path_factory.mktemp("attacks")
    with serve_process(
        work, api_keys=[KEY], request_header_timeout_seconds=HEADER_SECONDS
    ) as served:
        yield served


def _read_all(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the server sends within ``seconds``, and whether it closed the connection."""
    sock.settimeout(0.2)
    out, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return out, True
        out += chunk
    return out, False


def _exchange(sp: ServeProcess, data: bytes, seconds: float = 3.0) -> tuple[bytes, bool]:
    with socket.create_connection(("127.0.0.1", sp.port), timeout=5) as sock:
        sock.sendall(data)
        return _read_all(sock, seconds)


HIDDEN = b"GET /admin/deployments HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
KEYED = POST + f"Authorization: Bearer {KEY}\r\n".encode()
SMUGGLING = {
    "content-length-and-chunked": POST
    + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    + HIDDEN,
    "two-content-lengths": POST + b"Content-Length: 0\r\nContent-Length: 44\r\n\r\n" + HIDDEN,
    "chunked-then-identity": POST
    + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"
    + HIDDEN,
    "xchunked": POST + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + HIDDEN,
    "space-before-colon": POST + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + HIDDEN,
    "chunk-size-overflow": KEYED
    + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff1\r\nx\r\n0\r\n\r\n"
    + HIDDEN,
    "chunk-size-0x": KEYED + b"Transfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n" + HIDDEN,
    "bare-lf": b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 0\n\n" + HIDDEN,
    "obs-fold": POST
    + b"Content-Length: 0\r\n  Authorization: Bearer "
    + KEY.encode()
    + b"\r\n\r\n",
    "plus-length": POST + b"Content-Length: +4\r\n\r\nabcd" + HIDDEN,
    "negative-length": POST + b"Content-Length: -1\r\n\r\n" + HIDDEN,
    "nul-in-field": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n" + HIDDEN,
    "space-in-target": b"GET /healthz x HTTP/1.1\r\nHost: x\r\n\r\n" + HIDDEN,
}


@pytest.mark.parametrize("case", sorted(SMUGGLING))
def test_ambiguous_framing_gets_one_400_and_the_connection_closed(
    sp: ServeProcess, case: str
) -> None:
    answer, closed = _exchange(sp, SMUGGLING[case])
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1, f"the hidden request was answered: {answer!r}"
    assert closed, "the connection stayed open after a 400"


def test_chunked_on_http_1_0_is_not_read_as_a_body_with_a_request_behind_it(
    sp: ServeProcess,
) -> None:
    request = b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer, closed = _exchange(sp, request + b"0\r\n\r\n" + HIDDEN)
    assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 401 ")), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1 and closed, answer


NO_KEY_TARGETS = [
    "/v1/chat/completions",
    "/v1/chat/completions/",
    "//v1/chat/completions",
    "/v1//chat/completions",
    "/v1/./chat/completions",
    "/v1/../v1/chat/completions",
    "/./v1/chat/completions",
    "/V1/chat/completions",
    "/v1/chat%2Fcompletions",
    "/%76%31/chat/completions",
    "/v1/chat/completions?x=1",
    "/v1/chat/completions;x=1",
    "/v1/chat/completions%00",
    "/v1/chat/completions%20",
    "http://127.0.0.1/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/audio/transcriptions",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/score",
    "/rerank",
    "/classify",
    "/invocations",
    "/admin/deployments",
    "/admin/../admin/deployments",
    "/%61dmin/deployments",
    "/Admin/deployments",
]
WRONG_AUTH = [None, "Bearer", "Bearer ", "Bearer wrong", f"Bearer {KEY.upper()}", f"Basic {KEY}"]


def _post(sp: ServeProcess, target: str, auth: str | None, method: str = "POST") -> int:
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(CHAT)}\r\n" + (f"Authorization: {auth}\r\n" if auth else "")
    conn = Conn(sp.url)
    try:
        conn.sock.sendall(head.encode() + b"\r\n" + CHAT)
        return conn.head()[0]
    finally:
        conn.close()


def test_no_spelling_of_a_path_method_or_key_reaches_a_model_or_launches_one(
    sp: ServeProcess,
) -> None:
    """Run first in this module: no model has a worker yet, so an answer of 2xx or a
    deployment afterwards would mean a request got past the keys."""
    tried: list[tuple[str, str | None, str]] = [(t, None, "POST") for t in NO_KEY_TARGETS]
    tried += [("/v1/chat/completions", auth, "POST") for auth in WRONG_AUTH]
    tried += [("/v1/chat/completions", None, m) for m in ("PUT", "GET", "PATCH", "OPTIONS")]
    answers = {(t, a, m): _post(sp, t, a, m) for t, a, m in tried}
    passed = {case: status for case, status in answers.items() if status < 300 or status >= 500}
    assert not passed, f"answered without a key: {passed}"
    assert {s for s in answers.values()} <= {307, 401, 404, 405}, answers
    listed = httpx.get(f"{sp.url}/admin/deployments", headers=sp.admin).json()
    assert listed["deployments"] == [], "a request without a key launched a worker"


def test_pipelined_requests_are_answered_in_order_on_one_connection(sp: ServeProcess) -> None:
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    chat = KEYED + f"Content-Length: {len(CHAT)}\r\n\r\n".encode() + CHAT
    conn = Conn(sp.url)
    conn.sock.settimeout(60)  # the chat launches the model's worker
    try:
        conn.sock.sendall(health + chat + health)
        first, second, third = conn.response(), conn.response(), conn.response()
    finally:
        conn.close()
    assert first[0] == 200 and json.loads(first[2])["status"] == "ok"
    assert second[0] == 200 and json.loads(second[2])["object"] == "chat.completion"
    assert third[0] == 200 and json.loads(third[2])["status"] == "ok"


def test_expect_100_continue_asks_for_the_body_only_with_the_key(sp: ServeProcess) -> None:
    expect = f"Content-Length: {len(CHAT)}\r\nExpect: 100-continue\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", sp.port), timeout=5) as sock:
        sock.sendall(POST + expect)
        answer, _ = _read_all(sock, 1.0)
    assert answer.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in answer, answer
    with socket.create_connection(("127.0.0.1", sp.port), timeout=60) as sock:
        sock.sendall(KEYED + expect)
        interim, _ = _read_all(sock, 1.0)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
        sock.sendall(CHAT)
        final, _ = _read_all(sock, 3.0)
    assert final.startswith(b"HTTP/1.1 200 "), final[:300]


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_slowloris_connections_are_closed_at_the_header_deadline_while_others_are_served(
    sp: ServeProcess,
) -> None:
    before = _open_fds(sp.process.pid)
    held = [socket.create_connection(("127.0.0.1", sp.port), timeout=5) for _ in range(300)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        started = time.monotonic()
        assert httpx.get(f"{sp.url}/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < HEADER_SECONDS, "served only after the deadline"
        time.sleep(HEADER_SECONDS + 1.5)
        answers = [_read_all(sock, 0.01) for sock in held]
    finally:
        for sock in held:
            sock.close()
    still_open = sum(1 for _, closed in answers if not closed)
    assert still_open == 0, f"{still_open} of 300 unfinished heads kept past the deadline"
    assert all(a.startswith(b"HTTP/1.1 408 ") for a, _ in answers), answers[0]
    deadline = time.monotonic() + 5
    while _open_fds(sp.process.pid) > before + 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _open_fds(sp.process.pid) <= before + 5, (before, _open_fds(sp.process.pid))


def test_an_h2c_upgrade_is_answered_as_http_1_1(sp: ServeProcess) -> None:
    request = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    answer, _ = _exchange(sp, request, 1.0)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"101" not in answer.split(b"\r\n")[0]
