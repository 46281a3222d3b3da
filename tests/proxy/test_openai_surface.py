"""vLLM's wire format in the proxy: the error shape and its retry headers, the multipart
``model`` field, and the proxy in front of a simulator worker (uvicorn on loopback) with a
small body limit, for the routes that are not JSON; and the 507 message of a real decision."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.proxy import Endpoint, Proxy, RouteError
from gatekeeper.proxy.protocol import (
    FORM_ROUTES,
    JSON_ROUTES,
    error_response,
    error_type,
    form_boundary,
    form_field,
)
from gatekeeper.proxy.upstream import upstream_client
from gatekeeper.sidecar.registry import ModelRegistry
from gatekeeper.sidecar.rejection import rejection_text
from gatekeeper.simulator.http import ServingConfig, build_app
from tests.support.fake_upstream import serve_in_thread

LIMIT = 64 << 10


def multipart(fields: list[tuple[str, str | bytes, str | None]], boundary: str) -> bytes:
    """A multipart/form-data body; a field with a filename is a file part."""
    out = b""
    for name, value, filename in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        data = value.encode() if isinstance(value, str) else value
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data
        out += b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"multipart/form-data; boundary=abc", b"abc"),
        (b'multipart/form-data; charset=utf-8; boundary="a b"', b"a b"),
        (b"Multipart/Form-Data;boundary=x", b"x"),
        (b"application/json", None),
        (b"multipart/form-data", None),
        (b"multipart/form-data; boundary=" + b"x" * 71, None),
    ],
)
def test_form_boundary(header: bytes, expected: bytes | None) -> None:
    assert form_boundary(header) == expected


def test_form_field_finds_the_model_after_a_file() -> None:
    audio = b"--not-a-boundary\r\n\r\n" + bytes(range(256)) * 8
    body = multipart(
        [("file", audio, "a.wav"), ("model", "whisper", None), ("stream", "true", None)], "B0"
    )
    found = form_field(body, b"B0", "model")
    assert found is not None and found.value == "whisper"
    assert body[found.start : found.end] == b"whisper"
    stream = form_field(body, b"B0", "stream")
    assert stream is not None and stream.value == "true"


def test_form_field_ignores_files_and_other_names() -> None:
    body = multipart(
        [("model", b"x", "model.bin"), ("models", "m", None), ("Model", "M", None)], "B1"
    )
    assert form_field(body, b"B1", "model") is None
    upper = b'--B3\r\nCONTENT-DISPOSITION: form-data; NAME="model"\r\n\r\nm\r\n--B3--\r\n'
    found = form_field(upper, b"B3", "model")
    assert found is not None and found.value == "m"
    assert form_field(b"garbage without parts", b"B1", "model") is None
    truncated = multipart([("model", "m", None)], "B2")[:-12]
    assert form_field(truncated, b"B2", "model") is None


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "BadRequestError"),
        (404, "NotFoundError"),
        (503, "ServiceUnavailableError"),
        (413, "Request Entity Too Large"),
        (507, "Insufficient Storage"),
    ],
)
def test_error_types_are_vllms(status: int, kind: str) -> None:
    assert error_type(status) == kind
    body = json.loads(bytes(error_response(status, "m").body))
    assert body == {"error": {"message": "m", "type": kind, "param": None, "code": status}}


def test_retry_headers() -> None:
    loading = error_response(503, "loading", code="model_loading", retry_after=7.2)
    assert loading.headers["retry-after"] == "8" and "x-should-retry" not in loading.headers
    for status in (400, 404, 413, 422, 507):
        answer = error_response(status, "no")
        assert answer.headers["x-should-retry"] == "false" and "retry-after" not in answer.headers
    off = error_response(503, "deploy it first", should_retry=False)
    assert off.headers["x-should-retry"] == "false"


class OneModel:
    """Every known name is served by the one worker; ``alias`` is rewritten."""

    def __init__(self, url: str) -> None:
        self.url = url

    def ready(self, model: str) -> list[Endpoint] | None:
        return [Endpoint("w", self.url, "sim")] if model in ("sim", "alias") else None

    async def endpoints(self, model: str) -> list[Endpoint]:
        if model not in ("sim", "alias"):
            raise RouteError(404, f"The model `{model}` does not exist.", type="NotFoundError")
        return [Endpoint("w", self.url, "sim")]

    async def models(self) -> list[dict[str, Any]]:
        return [{"id": "sim", "object": "model", "state": "ready"}]

    def canonical(self, model: str) -> str:
        return "sim" if model == "alias" else model

    def report(self, endpoint: Endpoint, outcome: str) -> None:
        return None


@pytest.fixture(scope="module")
def proxy_url() -> Iterator[str]:
    config = ServingConfig(
        model="sim-model",
        served_model_names=("sim",),
        max_model_len=1024,
        token_seconds=0.0,
        simulated_version="test",
        log=lambda line: None,
        crash=lambda: None,
    )
    with serve_in_thread(build_app(config)) as worker:
        client = upstream_client()
        proxy = Proxy(OneModel(worker), client, max_body_bytes=LIMIT)

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            await client.aclose()

        with serve_in_thread(Starlette(routes=proxy.routes(), lifespan=lifespan)) as url:
            yield url


def test_every_route_is_mounted(proxy_url: str) -> None:
    with httpx.Client(base_url=proxy_url, timeout=10) as http:
        for path in (*JSON_ROUTES, *FORM_ROUTES):
            answer = http.post(path, json={"model": "unknown"})
            assert answer.status_code in (400, 404), (path, answer.text)
            assert answer.json()["error"]["type"] in ("NotFoundError", "BadRequestError"), path


def test_a_form_over_the_limit_is_413_counted_as_read(proxy_url: str) -> None:
    big = multipart([("file", bytes(LIMIT), "a.wav"), ("model", "sim", None)], "XY")
    headers = {"content-type": "multipart/form-data; boundary=XY"}
    with httpx.Client(base_url=proxy_url, timeout=10) as http:
        sized = http.post("/v1/audio/transcriptions", content=big, headers=headers)
        assert sized.status_code == 413 and sized.headers["x-should-retry"] == "false"

        def chunked() -> Iterator[bytes]:
            for at in range(0, len(big), 4096):
                yield big[at : at + 4096]

        streamed = http.post("/v1/audio/transcriptions", content=chunked(), headers=headers)
        assert streamed.status_code == 413
        small = multipart([("file", bytes(100), "a.wav"), ("model", "alias", None)], "XY")
        answer = http.post("/v1/audio/transcriptions", content=small, headers=headers)
        assert answer.json()["text"] == "100 bytes of audio for sim"  # the alias replaced


def test_a_form_asking_for_a_stream_is_relayed_as_one(proxy_url: str) -> None:
    body = multipart(
        [("file", bytes(10), "a.wav"), ("model", "sim", None), ("stream", "true", None)], "S"
    )
    headers = {"content-type": "multipart/form-data; boundary=S"}
    with httpx.Client(base_url=proxy_url, timeout=10) as http:
        answer = http.post("/v1/audio/transcriptions", content=body, headers=headers)
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in answer.headers  # relayed chunk by chunk, not whole
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    words = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert words == ["10", "bytes", "of", "audio", "for", "sim"]


def test_a_json_body_on_a_form_route_is_400(proxy_url: str) -> None:
    with httpx.Client(base_url=proxy_url, timeout=10) as http:
        answer = http.post("/v1/audio/translations", json={"model": "sim"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "model" and "is not multipart/form-data" in error["message"]


def test_model_card_and_its_404(proxy_url: str) -> None:
    with httpx.Client(base_url=proxy_url, timeout=10) as http:
        assert http.get("/v1/models/sim").json()["state"] == "ready"
        missing = http.get("/v1/models/org/none")
    assert missing.status_code == 404 and missing.headers["x-should-retry"] == "false"
    assert missing.json()["error"]["message"].startswith("The model `org/none` does not exist")


def rejected(model: str, node: str) -> str:
    registry = ModelRegistry.create([], ["*/*"], resolve_model)
    request = registry.request(registry.allowed(model))
    decision = decide(request, StaticInventory(parse_declared_node(node)).snapshot())
    assert not decision.admitted
    return rejection_text(model, decision)


def test_the_507_message_says_what_would_fit() -> None:
    lines = rejected("meta-llama/Llama-3.1-70B-Instruct", "2xH100-80GB").splitlines()
    assert (
        lines[0] == "The model `meta-llama/Llama-3.1-70B-Instruct` does not fit on this node now."
    )
    assert [line.split(" (")[0] for line in lines if line.startswith("GPU ")] == ["GPU 0", "GPU 1"]
    fits = [line for line in lines if line.startswith("Would fit: ")]
    assert fits and fits[0].startswith("Would fit: max_model_len ")
    assert not any("No setting fits" in line for line in lines)


def test_the_507_message_says_plainly_when_nothing_fits() -> None:
    lines = rejected("meta-llama/Llama-3.1-70B-Instruct", "1xH100-80GB").splitlines()
    assert not any(line.startswith("Would fit") for line in lines)
    assert lines[-1].startswith("No setting fits on this node: none of a shorter max_model_len")
    assert "even idle, its 1 GPU(s) cannot hold" in lines[-1]
    short = re.search(r"The closest is GPU 0 \(H100-80GB\), short by (\d+\.\d\d) GiB\.", lines[-1])
    assert short and 100 < float(short.group(1)) < 101, lines[-1]  # 70B in bf16: ~131 GiB
