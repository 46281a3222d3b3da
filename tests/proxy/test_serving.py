"""The OpenAI proxy, end to end on loopback: the official ``openai`` client calls the proxy
(uvicorn in a thread), which forwards to fake vLLM workers (uvicorn in threads)."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from starlette.applications import Starlette

from gatekeeper.proxy import Endpoint, Proxy, RouteError
from gatekeeper.proxy.upstream import upstream_client
from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_protocol import sidecar_http_protocol
from tests.support.fake_upstream import FakeUpstream, closed_port, serve_in_thread


class TableResolver:
    """Workers per model from a table; errors per model; records the reports."""

    def __init__(self, table: dict[str, list[Endpoint]], errors: dict[str, RouteError]) -> None:
        self.table = table
        self.errors = errors
        self.reports: list[tuple[str, str]] = []
        self.asked: list[str] = []
        """The models ``endpoints`` was asked for (the proxy's path with a task)."""

    def ready(self, model: str) -> list[Endpoint] | None:
        return None if model in self.errors else self.table.get(model)

    async def endpoints(self, model: str) -> list[Endpoint]:
        self.asked.append(model)
        if model in self.errors:
            raise self.errors[model]
        if model not in self.table:
            message = f"The model {model!r} does not exist. Served: {sorted(self.table)}."
            raise RouteError(404, message, type="invalid_request_error", code="model_not_found")
        return self.table[model]

    async def models(self) -> list[dict[str, Any]]:
        served = [{"id": m, "object": "model", "owned_by": "gatekeeper"} for m in self.table]
        return [*served, {"id": "later", "object": "model", "state": "not running"}]

    def canonical(self, model: str) -> str:
        return model

    def report(self, endpoint: Endpoint, outcome: str) -> None:
        self.reports.append((endpoint.worker_id, outcome))


class Observed:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, float]] = []

    def observe(self, model: str, status: int, seconds: float) -> None:
        self.seen.append((model, status, seconds))


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Rig:
    def __init__(self, kind: str, a: FakeUpstream, b: FakeUpstream) -> None:
        self.kind = kind
        self.a = a
        self.b = b
        self.resolver: TableResolver
        self.proxy: Proxy
        self.metrics = Observed()
        self.url = ""


@pytest.fixture(scope="module", params=["lean", "httpx", "sidecar-protocol"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The proxy with gatekeeper's client (lean pool) and with a plain httpx client, under
    plain uvicorn; and with gatekeeper's client under the sidecar's HTTP protocol, whose
    lean path takes the forwarding POSTs (``http_protocol``)."""
    rig = Rig(request.param, FakeUpstream("A"), FakeUpstream("B"))
    with (
        serve_in_thread(rig.a.app()) as url_a,
        serve_in_thread(rig.b.app()) as url_b,
        closing_worker() as url_s,
    ):
        a = Endpoint("A", url_a, "m")
        dead = Endpoint("dead", f"http://127.0.0.1:{closed_port()}", "m")
        pair = [Endpoint("A", url_a, "pair"), Endpoint("B", url_b, "pair")]
        table = {
            "m": [a],
            "pair": pair,
            "alias-m": [a],
            "dead": [dead],
            "dead-then-a": [dead, a],
            "m-closing": [Endpoint("S", url_s, "m-closing")],
        }
        errors = {
            "loading": RouteError(
                503, "m is loading (42 s so far).", type="service_unavailable", retry_after=7.5
            ),
            "too-big": RouteError(
                507,
                "big needs 90.0 GiB on one GPU; the best GPU (0) has 70.1 GiB free.",
                type="insufficient_storage",
                code="insufficient_vram",
            ),
        }
        rig.resolver = TableResolver(table, errors)
        client = upstream_client() if request.param != "httpx" else httpx.AsyncClient()
        rig.proxy = Proxy(rig.resolver, client, metrics=rig.metrics, max_body_bytes=1 << 20)

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            await client.aclose()

        app = Starlette(routes=rig.proxy.routes(), lifespan=lifespan)
        options: dict[str, Any] = {}
        if request.param == "sidecar-protocol":
            options["http"] = sidecar_http_protocol(Settings(), rig.proxy.direct_routes())
        with serve_in_thread(app, **options) as url:
            rig.url = url
            yield rig


@contextmanager
def closing_worker() -> Iterator[str]:
    """A worker that answers the first request on each connection, keeps the connection
    and closes it unanswered when the next request comes (as a keep-alive timeout that
    lands just as the proxy sends does); yields its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    answer = json.dumps({"object": "chat.completion", "choices": []}).encode()

    def serve(conn: socket.socket) -> None:
        with conn:
            for reply in (True, False):
                data = b""
                while b"\r\n\r\n" not in data:
                    if not (chunk := conn.recv(65536)):
                        return
                    data += chunk
                if reply:
                    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(answer)}\r\n\r\n"
                    conn.sendall(head.encode() + answer)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@pytest.fixture
def oai(rig: Rig) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=rig.url + "/v1", api_key="k", max_retries=0) as client:
        yield client


@pytest.fixture
def http(rig: Rig) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rig.url, timeout=10) as client:
        yield client


def tag() -> str:
    return uuid.uuid4().hex


def fake(**options: Any) -> dict[str, Any]:
    return {"fake": options}


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


# --- forwarding -------------------------------------------------------------------


def test_chat_completion(rig: Rig, oai: openai.OpenAI) -> None:
    t = tag()
    answer = oai.chat.completions.create(model="m", messages=HI, extra_body=fake(tag=t))
    assert answer.choices[0].message.content == "hello from A"
    [seen] = rig.a.tagged(t)
    assert seen.path == "/v1/chat/completions" and seen.body["messages"] == HI
    assert eventually(lambda: ("m", 200) in [(m, s) for m, s, _ in rig.metrics.seen])


def test_completion_and_embeddings(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="m", prompt="hi", max_tokens=3)
    assert completion.choices[0].text == "hello from A"
    embedding = oai.embeddings.create(model="m", input="hi")
    assert embedding.data[0].embedding == [0.25, -0.5, 1.0]


def test_body_and_headers_pass_through_unchanged(rig: Rig, http: httpx.Client) -> None:
    t = tag()
    raw = (
        b'{ "model" : "m",  "messages": [], "x_unknown": 1.50, "fake": {"tag": "%s"}}' % t.encode()
    )
    response = http.post(
        "/v1/chat/completions", content=raw, headers={"x-trace": "abc", "authorization": "Bearer k"}
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"].startswith("A-")
    assert response.headers["content-type"] == "application/json"
    [seen] = rig.a.tagged(t)
    assert seen.raw == raw
    assert seen.headers["x-trace"] == "abc" and seen.headers["authorization"] == "Bearer k"


def test_large_body_is_forwarded_whole(rig: Rig, oai: openai.OpenAI) -> None:
    t = tag()
    prompt = "y" * (700 << 10)
    oai.completions.create(model="m", prompt=prompt, extra_body=fake(tag=t))
    [seen] = rig.a.tagged(t)
    assert seen.body["prompt"] == prompt


def test_alias_is_rewritten_to_the_served_name(rig: Rig, oai: openai.OpenAI) -> None:
    t = tag()
    answer = oai.chat.completions.create(
        model="alias-m", messages=HI, temperature=0.5, extra_body=fake(tag=t)
    )
    assert answer.model == "m"
    [seen] = rig.a.tagged(t)
    assert seen.body == {"model": "m", "messages": HI, "temperature": 0.5, "fake": {"tag": t}}


def test_models_lists_served_and_allowed(oai: openai.OpenAI) -> None:
    ids = [model.id for model in oai.models.list()]
    assert ids[:2] == ["m", "pair"] and ids[-1] == "later"


def test_upstream_4xx_passes_through(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="m", messages=HI, max_tokens=-1)
    assert caught.value.status_code == 400
    assert "max_tokens must be at least 1" in caught.value.message


# --- streaming --------------------------------------------------------------------


def test_stream_is_not_buffered(rig: Rig, oai: openai.OpenAI) -> None:
    t = tag()
    start = time.perf_counter()
    arrivals: list[float] = []
    texts: list[str] = []
    stream = oai.chat.completions.create(
        model="m", messages=HI, stream=True, extra_body=fake(tag=t, chunks=5, delay=0.2)
    )
    with stream:
        for chunk in stream:
            arrivals.append(time.perf_counter() - start)
            texts.append(chunk.choices[0].delta.content or "")
    assert texts == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 "]
    # The worker takes 0.8 s; buffered, every chunk would arrive at the end.
    assert arrivals[0] < 0.4 and arrivals[-1] - arrivals[0] > 0.5, arrivals
    assert eventually(lambda: ("A", "ok") in rig.resolver.reports)


def test_upstream_4xx_to_a_stream_request_passes_through(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="m", messages=HI, max_tokens=-1, stream=True)
    assert "max_tokens must be at least 1" in caught.value.message


def test_completion_stream(oai: openai.OpenAI) -> None:
    stream = oai.completions.create(model="m", prompt="hi", stream=True)
    with stream:
        assert [c.choices[0].text for c in stream] == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 "]


def test_stream_passes_status_and_content_type(http: httpx.Client) -> None:
    body = {"model": "m", "messages": HI, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "content-length" not in response.headers
        assert response.read().endswith(b"data: [DONE]\n\n")


def test_client_cancelling_a_stream_reaches_the_worker(rig: Rig, oai: openai.OpenAI) -> None:
    t = tag()
    stream = oai.chat.completions.create(
        model="m", messages=HI, stream=True, extra_body=fake(tag=t, chunks=200, delay=0.05)
    )
    with stream:
        next(iter(stream))
        assert rig.proxy.outstanding("A") >= 1
    assert eventually(lambda: t in rig.a.cancelled, timeout=3.0)
    assert eventually(lambda: rig.proxy.outstanding("A") == 0)
    assert eventually(lambda: ("A", "cancelled") in rig.resolver.reports)
    assert eventually(lambda: ("m", 499) in [(m, s) for m, s, _ in rig.metrics.seen])


def test_client_giving_up_on_a_whole_answer_reaches_the_worker(rig: Rig) -> None:
    t = tag()
    oai = openai.OpenAI(base_url=rig.url + "/v1", api_key="k", max_retries=0, timeout=0.3)
    with oai, pytest.raises(openai.APITimeoutError):
        oai.chat.completions.create(model="m", messages=HI, extra_body=fake(tag=t, first_delay=5))
    assert eventually(lambda: t in rig.a.cancelled, timeout=3.0)
    assert eventually(lambda: rig.proxy.outstanding("A") == 0)


def test_whole_answers_on_the_sidecar_protocol_go_without_a_task(
    rig: Rig, http: httpx.Client
) -> None:
    """Under the sidecar's protocol a whole answer from a ready worker with an idle pooled
    connection is sent from callbacks (``Proxy.answer_now``): the resolver's ``ready`` is
    asked, never its async ``endpoints``; its ends are the task path's, reported the same."""
    if rig.kind != "sidecar-protocol":
        pytest.skip("answer_now is offered by the sidecar's HTTP protocol only")

    def without_a_task(step: Callable[[], None]) -> None:
        http.post("/v1/chat/completions", json={"model": "m"}).raise_for_status()  # pooled
        asked = len(rig.resolver.asked)
        step()
        assert rig.resolver.asked[asked:] == []

    def alias() -> None:
        t = tag()
        answer = http.post("/v1/chat/completions", json={"model": "alias-m", **fake(tag=t)})
        assert answer.json()["choices"][0]["message"]["content"] == "hello from A"
        assert rig.a.tagged(t)[0].body["model"] == "m"  # the alias rewritten

    def worker_fails() -> None:
        failed = http.post("/v1/chat/completions", json={"model": "m", **fake(fail_after=0)})
        assert "failed mid-request" in assert_openai_error(failed, 502)["message"]
        assert eventually(lambda: ("A", "upstream_error") in rig.resolver.reports)

    def client_goes() -> None:
        t = tag()
        body = {"model": "m", **fake(tag=t, first_delay=5)}
        with (
            httpx.Client(base_url=rig.url, timeout=0.3) as impatient,
            pytest.raises(httpx.ReadTimeout),
        ):
            impatient.post("/v1/chat/completions", json=body)
        assert eventually(lambda: t in rig.a.cancelled, timeout=3.0)
        assert eventually(lambda: rig.proxy.outstanding("A") == 0)
        assert ("m", 499) in [(m, s) for m, s, _ in rig.metrics.seen]

    for step in (alias, worker_fails, client_goes):
        without_a_task(step)


def test_a_kept_connection_closed_as_it_is_used_is_sent_again(rig: Rig, http: httpx.Client) -> None:
    """The worker closes the pooled connection unanswered (``closing_worker``): the request
    goes again once on a new connection, and the client sees only the answer."""
    if rig.kind == "httpx":
        pytest.skip("httpx's own pool, not gatekeeper's")
    for _ in range(3):
        answer = http.post("/v1/chat/completions", json={"model": "m-closing"})
        assert answer.status_code == 200, answer.text
    assert [outcome for worker, outcome in rig.resolver.reports if worker == "S"] == ["ok"] * 3


def test_least_outstanding_spreads_across_workers(rig: Rig, oai: openai.OpenAI) -> None:
    long = fake(chunks=200, delay=0.05)
    served: list[str] = []
    streams = []
    try:
        for _ in range(3):
            stream = oai.chat.completions.create(
                model="pair", messages=HI, stream=True, extra_body=long
            )
            streams.append(stream)
            served.append(next(iter(stream)).system_fingerprint or "")
        assert served == ["A", "B", "A"]  # A busy → B; then 1 each, tie → first
        assert (rig.proxy.outstanding("A"), rig.proxy.outstanding("B")) == (2, 1)
    finally:
        for stream in streams:
            stream.close()
    assert eventually(lambda: rig.proxy.outstanding("A") + rig.proxy.outstanding("B") == 0)


def test_a_whole_answer_goes_to_the_least_busy_worker_too(
    rig: Rig, oai: openai.OpenAI, http: httpx.Client
) -> None:
    """Whole answers choose as streams do (``answer_now`` under the sidecar's protocol,
    ``forward`` otherwise): with A holding a stream, and an idle pooled connection to A
    at hand, a whole answer for the pair goes to B."""
    stream = oai.chat.completions.create(
        model="pair", messages=HI, stream=True, extra_body=fake(chunks=200, delay=0.05)
    )
    try:
        assert next(iter(stream)).system_fingerprint == "A"
        http.post("/v1/chat/completions", json={"model": "m"}).raise_for_status()
        for _ in range(2):
            answer = http.post("/v1/chat/completions", json={"model": "pair"})
            assert answer.json()["choices"][0]["message"]["content"] == "hello from B"
    finally:
        stream.close()
    assert eventually(lambda: rig.proxy.outstanding("A") + rig.proxy.outstanding("B") == 0)


# --- errors -----------------------------------------------------------------------


def test_unknown_model_is_404(oai: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        oai.chat.completions.create(model="nope", messages=HI)
    assert "'nope' does not exist" in caught.value.message
    error = assert_openai_error(http.post("/v1/completions", json={"model": "nope"}), 404)
    assert error == {
        "message": error["message"],
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_loading_is_503_with_retry_after(oai: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        oai.chat.completions.create(model="loading", messages=HI)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "8"
    error = assert_openai_error(http.post("/v1/embeddings", json={"model": "loading"}), 503)
    assert error["type"] == "service_unavailable"


def test_rejection_carries_the_reasons(http: httpx.Client) -> None:
    error = assert_openai_error(http.post("/v1/chat/completions", json={"model": "too-big"}), 507)
    assert "70.1 GiB free" in error["message"] and error["code"] == "insufficient_vram"


def test_refused_connection_is_502(rig: Rig, oai: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        oai.chat.completions.create(model="dead", messages=HI)
    assert caught.value.status_code == 502
    assert "refused the connection" in caught.value.message
    assert ("dead", "connect_error") in rig.resolver.reports
    assert rig.proxy.outstanding("dead") == 0


def test_refused_connection_falls_over_to_the_next_worker(rig: Rig, oai: openai.OpenAI) -> None:
    answer = oai.chat.completions.create(model="dead-then-a", messages=HI)
    assert answer.choices[0].message.content == "hello from A"


def test_worker_dying_mid_answer_is_502(rig: Rig, http: httpx.Client) -> None:
    body = {"model": "m", **fake(fail_after=0)}
    error = assert_openai_error(http.post("/v1/chat/completions", json=body), 502)
    assert error["type"] == "Bad Gateway" and "failed mid-request" in error["message"]
    assert eventually(lambda: ("A", "upstream_error") in rig.resolver.reports)


def test_worker_dying_mid_stream_ends_with_an_error_event(rig: Rig, oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="m", messages=HI, stream=True, extra_body=fake(chunks=5, fail_after=2)
    )
    texts = []
    with stream, pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            texts.append(chunk.choices[0].delta.content)
    assert texts == ["t0 ", "t1 "]
    assert "failed mid-stream" in caught.value.message
    assert eventually(lambda: rig.proxy.outstanding("A") == 0)


# --- malformed requests: 4xx in OpenAI's shape, never 5xx ---------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", None),
        (b"", None),
        (b"\xff\xfe", None),
        (b"[1, 2]", None),
        (b'"m"', None),
        (b'{"messages": []}', "model"),
        (b'{"model": 5}', "model"),
        (b'{"model": null}', "model"),
        (b'{"model": ["m"]}', "model"),
        (b'{"model": "m", "stream": "maybe"}', "stream"),
    ],
)
def test_malformed_body_is_400(http: httpx.Client, body: bytes, param: str | None) -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        answer = http.post(path, content=body)
        error = assert_openai_error(answer, 400)
        assert error["type"] == "BadRequestError" and error["param"] == param
        assert error["code"] == 400 and answer.headers["x-should-retry"] == "false"


def test_huge_body_is_413(http: httpx.Client) -> None:
    huge = b'{"model": "m", "prompt": "' + b"x" * (2 << 20) + b'"}'
    answer = http.post("/v1/completions", content=huge)
    error = assert_openai_error(answer, 413)
    assert error["code"] == "request_too_large" and answer.headers["x-should-retry"] == "false"

    def chunked() -> Iterator[bytes]:  # no content-length: counted while read
        step = 64 << 10
        for start in range(0, len(huge), step):
            yield huge[start : start + step]

    assert_openai_error(http.post("/v1/completions", content=chunked()), 413)


def test_concurrent_requests_all_succeed(rig: Rig) -> None:
    failures: list[BaseException] = []

    def call() -> None:
        try:
            with openai.OpenAI(base_url=rig.url + "/v1", api_key="k", max_retries=0) as oai:
                for _ in range(5):
                    oai.chat.completions.create(model="pair", messages=HI)
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert eventually(lambda: rig.proxy.outstanding("A") + rig.proxy.outstanding("B") == 0)


def test_connections_are_kept_alive(rig: Rig, http: httpx.Client) -> None:
    t = tag()
    for _ in range(10):
        http.post("/v1/chat/completions", json={"model": "m", **fake(tag=t)}).raise_for_status()
    assert len({r.client_port for r in rig.a.tagged(t)}) == 1
