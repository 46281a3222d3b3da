"""API keys on /v1 and stalled request bodies (#13 item 10), against a real sidecar with
simulator workers on a declared node; the stalled client is a raw socket."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from gatekeeper.settings import Settings, SettingsError, load_settings
from gatekeeper.sidecar.http_guard import HttpGuard
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

KEYS = ["key-one", "key-two"]
BODY = {"model": "tiny", "prompt": "one two", "max_tokens": 2}
TIMEOUT_SECONDS = 0.5


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    settings = settings_for(
        tmp_path_factory.mktemp("guard"),
        api_keys=KEYS,
        request_body_timeout_seconds=TIMEOUT_SECONDS,
    )
    with running_sidecar(settings) as sidecar:
        yield sidecar


def _client(sc: Sidecar, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.Client(base_url=sc.url, headers=headers, timeout=60)


def _assert_invalid_key(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["type"] == "AuthenticationError" and error["param"] is None
    assert error["code"] == "invalid_api_key"
    assert "api_keys" in error["message"]


def test_v1_needs_one_of_the_keys(sc: Sidecar):
    with _client(sc, None) as none:
        _assert_invalid_key(none.post("/v1/completions", json=BODY))
        _assert_invalid_key(none.get("/v1/models"))
    with _client(sc, "key-three") as wrong:
        _assert_invalid_key(wrong.post("/v1/completions", json=BODY))
    with _client(sc, "key-on") as prefix:
        _assert_invalid_key(prefix.get("/v1/models"))
    with httpx.Client(base_url=sc.url, headers={"Authorization": "Basic key-one"}) as basic:
        _assert_invalid_key(basic.get("/v1/models"))
    for key in KEYS:
        with _client(sc, key) as right:
            answer = right.post("/v1/completions", json=BODY)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"]


def test_health_metrics_schema_stay_open_and_admin_keeps_its_token(sc: Sidecar):
    with _client(sc, None) as none:
        for path in ("/healthz", "/metrics", "/openapi.json"):
            assert none.get(path).status_code == 200, path
        assert none.get("/admin/deployments").status_code == 401
    with _client(sc, KEYS[0]) as key:  # an API key is not the admin token
        assert key.get("/admin/deployments").status_code == 401
    assert sc.admin.get("/admin/deployments").status_code == 200  # no API key needed


def test_the_response_path_is_not_timed(sc: Sidecar):
    """A stream outlasting the body timeout runs to its end; and a client leaving a
    stream after that time is still noticed (the proxy waits on ``receive`` for it)."""
    body = {**BODY, "max_tokens": 80, "stream": True}  # ~0.8 s at 10 ms a token
    started = time.monotonic()
    with _client(sc, KEYS[0]) as key, key.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    assert time.monotonic() - started > TIMEOUT_SECONDS
    assert "[DONE]" in text and '"error"' not in text

    (d,) = sc.admin.get("/admin/deployments").json()["deployments"]
    proxy = sc.app.state.proxy
    long = {**BODY, "max_tokens": 600, "stream": True}  # ~6 s
    with _client(sc, KEYS[0]) as key, key.stream("POST", "/v1/completions", json=long) as r:
        chunks = r.iter_bytes()  # kept: a dropped iterator closes the stream
        assert next(chunks).startswith(b"data: ")
        time.sleep(2 * TIMEOUT_SECONDS)
        assert next(chunks)
        assert proxy.outstanding(d["id"]) == 1
    left = time.monotonic()
    while proxy.outstanding(d["id"]) and time.monotonic() - left < 3:
        time.sleep(0.02)
    assert proxy.outstanding(d["id"]) == 0, "the client's disconnect went unnoticed"


def _stall(sc: Sidecar, path: str, headers: str = "") -> socket.socket:
    """A client that announces 1000 bytes of body, sends 10 and stalls."""
    port = int(sc.url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: 1000\r\n{headers}\r\n"
    )
    s.sendall(head.encode() + b'{"model": ')
    return s


def _read_to_close(s: socket.socket) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the answer, read until the server closes."""
    data = b""
    while chunk := s.recv(65536):  # raises on the socket's timeout if never closed
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return int(head.split()[1]), json.loads(body)


def test_a_stalled_v1_body_gets_408_and_others_are_served_meanwhile(sc: Sidecar):
    with _client(sc, KEYS[0]) as first:  # the first listing may still resolve the models
        assert first.get("/v1/models").status_code == 200
    started = time.monotonic()
    stalled = _stall(sc, "/v1/completions", f"Authorization: Bearer {KEYS[0]}\r\n")
    with _client(sc, KEYS[0]) as other:
        assert other.get("/v1/models").status_code == 200
        assert other.get("/healthz").status_code == 200
    assert time.monotonic() - started < TIMEOUT_SECONDS  # served while the stall waits
    status, body = _read_to_close(stalled)
    assert status == 408 and time.monotonic() - started < 2 * TIMEOUT_SECONDS + 1
    error = body["error"]
    assert isinstance(error, dict)
    assert error["type"] == "Request Timeout" and error["code"] == "request_timeout"
    assert "request_body_timeout_seconds" in error["message"]


def test_a_stalled_admin_body_gets_408_in_the_admin_shape(sc: Sidecar):
    started = time.monotonic()
    stalled = _stall(sc, "/admin/deployments", "Authorization: Bearer test-token\r\n")
    status, body = _read_to_close(stalled)
    assert status == 408 and time.monotonic() - started < 2 * TIMEOUT_SECONDS + 1
    assert body["error"] == {
        "message": body["error"]["message"],  # type: ignore[index]
        "type": "request_timeout",
        "param": None,
        "code": "request_timeout",
    }


def test_settings_read_keys_from_the_environment_and_refuse_blank_ones(
    monkeypatch: pytest.MonkeyPatch,
):
    assert Settings().api_keys == [] and Settings().request_body_timeout_seconds == 30.0
    monkeypatch.setenv("GATEKEEPER_API_KEYS", json.dumps(KEYS))
    assert Settings().api_keys == KEYS
    assert "key-one" not in repr(Settings())
    monkeypatch.setenv("GATEKEEPER_API_KEYS", '["key-one", " "]')
    with pytest.raises(SettingsError, match=r"api_keys\[1\]"):
        load_settings()


def test_the_key_is_not_passed_on_to_the_app_behind():
    """The proxy forwards the request's headers to the worker (tests/proxy); the guard
    removes Authorization from /v1 requests it lets through, so no key reaches a worker."""
    seen: list[dict[bytes, bytes]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = HttpGuard(app, api_keys=KEYS)
    headers = {"Authorization": f"Bearer {KEYS[1]}", "X-Trace": "abc"}

    async def calls() -> list[int]:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answers = [await client.post(path, headers=headers) for path in ("/v1/x", "/admin/x")]
        return [a.status_code for a in answers]

    assert asyncio.run(calls()) == [204, 204]
    v1, admin = seen
    assert b"authorization" not in v1 and v1[b"x-trace"] == b"abc"
    assert admin[b"authorization"] == f"Bearer {KEYS[1]}".encode()  # the admin API's to check


def test_the_key_policy_is_vllms_on_both_paths_to_a_forwarding_route():
    """vLLM guards /v1, /v2, /inference and /cohere by prefix; /tokenize and the like stay
    open. The same holds whether a forwarding POST reaches its app through the guard (a
    target with a query, as uvicorn's ordinary path) or through ``direct_routes`` (the
    lean path), and no request passes the Authorization header on."""
    seen: list[dict[bytes, bytes]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    direct = {"/tokenize": app, "/v1/completions": app, "/v2/rerank": app}
    guard = HttpGuard(app, api_keys=KEYS, direct=direct)
    lean = guard.direct_routes()

    async def status(target: ASGIApp, path: str, key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        transport = httpx.ASGITransport(app=target)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.post(path, headers=headers)).status_code

    async def statuses() -> list[int]:
        return [
            await status(guard, "/tokenize?x=1", None),
            await status(lean["/tokenize"], "/tokenize", None),
            await status(guard, "/tokenize?x=1", KEYS[0]),
            await status(lean["/tokenize"], "/tokenize", KEYS[0]),
            await status(guard, "/v1/completions?x=1", None),
            await status(lean["/v1/completions"], "/v1/completions", None),
            await status(guard, "/v2/rerank?x=1", None),
            await status(lean["/v2/rerank"], "/v2/rerank", None),
            await status(guard, "/v2/rerank?x=1", KEYS[1]),
            await status(lean["/v2/rerank"], "/v2/rerank", KEYS[1]),
        ]

    assert asyncio.run(statuses()) == [204, 204, 204, 204, 401, 401, 401, 401, 204, 204]
    assert len(seen) == 6 and all(b"authorization" not in headers for headers in seen)
