"""The official ``openai`` client against a real sidecar on 127.0.0.1 (uvicorn in a
thread) whose workers are simulator processes launched on demand, as in a rehearsal:
errors parse as the client's exceptions with vLLM's types, the deterministic ones are
not retried, vLLM's other routes pass through, ``/v1/models`` lists what may be called,
and catalog aliases reach the model they name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

HI: list[Any] = [{"role": "user", "content": "hello there"}]
TOO_BIG = "meta-llama/Llama-3.1-405B-Instruct"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with running_sidecar(settings_for(tmp_path_factory.mktemp("sidecar"))) as sc:
        yield sc


class Counted:
    """An ``openai`` client that counts the HTTP requests it sends (retries included)."""

    def __init__(self, url: str, max_retries: int = 2) -> None:
        self.sent: list[str] = []
        hook = {"request": [lambda r: self.sent.append(f"{r.method} {r.url.path}")]}
        self.http = openai.DefaultHttpxClient(event_hooks=hook, timeout=60)
        self.client = openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=max_retries, http_client=self.http
        )


@pytest.fixture
def counted(sidecar: Sidecar) -> Iterator[Counted]:
    c = Counted(sidecar.url)
    yield c
    c.http.close()


@pytest.fixture
def oai(counted: Counted) -> openai.OpenAI:
    return counted.client


def deployment_names(sidecar: Sidecar) -> set[str]:
    return {d["name"] for d in sidecar.admin.get("/admin/deployments").json()["deployments"]}


def test_does_not_fit_is_507_and_not_retried(counted: Counted, sidecar: Sidecar) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        counted.client.chat.completions.create(model=TOO_BIG, messages=HI)
    error = caught.value
    assert len(counted.sent) == 1, counted.sent  # max_retries=2, yet one attempt
    assert error.status_code == 507
    assert error.response.headers["x-should-retry"] == "false"
    assert (error.code, error.type) == ("model_does_not_fit", "Insufficient Storage")
    assert isinstance(error.body, dict)
    lines = error.body["message"].splitlines()
    assert lines[0] == f"The model `{TOO_BIG}` does not fit on this node now."
    gpu_lines = [line for line in lines if line.startswith("GPU ")]
    assert [line[:6] for line in gpu_lines] == ["GPU 0 ", "GPU 1 "]
    assert all("short by" in line for line in gpu_lines)
    assert not any(line.startswith("Would fit") for line in lines)
    assert lines[-1].startswith("No setting fits on this node")
    assert "The closest is GPU 0 (H100-80GB), short by" in lines[-1]
    assert TOO_BIG not in deployment_names(sidecar)


def test_unknown_model_is_not_found_and_not_retried(counted: Counted) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        counted.client.chat.completions.create(model="no-such-model", messages=HI)
    e = caught.value
    assert len(counted.sent) == 1
    assert (e.type, e.code, e.param) == ("NotFoundError", "model_not_found", "model")
    assert "`no-such-model` does not exist" in e.message
    assert e.response.headers["x-should-retry"] == "false"


def test_a_body_without_model_is_400_naming_the_field(oai: openai.OpenAI, counted: Counted) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.post("/chat/completions", body={"messages": HI}, cast_to=object)
    e = caught.value
    assert len(counted.sent) == 1
    assert (e.type, e.param) == ("BadRequestError", "model")
    assert isinstance(e.body, dict)
    assert e.body == {"message": e.body["message"], **vars_of(e), "code": 400}  # vLLM's int
    assert "'model'" in e.message
    assert e.response.headers["x-should-retry"] == "false"
    bad_json = counted.http.post(f"{counted.client.base_url}completions", content=b"{nope")
    assert bad_json.status_code == 400 and bad_json.headers["x-should-retry"] == "false"
    assert bad_json.json()["error"]["type"] == "BadRequestError"
    assert "not a JSON object" in bad_json.json()["error"]["message"]


def vars_of(e: openai.APIError) -> dict[str, Any]:
    return {"type": e.type, "param": e.param}


def test_chat_streams_through_an_on_demand_worker(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="tiny", messages=HI, stream=True, max_tokens=4, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello there hello there"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    whole = oai.completions.create(model="tiny", prompt="one two", max_tokens=3)
    assert whole.choices[0].text == "one two one"


def test_models_list_shows_running_and_on_demand_models(oai: openai.OpenAI) -> None:
    oai.completions.create(model="tiny", prompt="warm", max_tokens=1)
    cards = {m.id: m.model_dump() for m in oai.models.list().data}
    tiny = cards["tiny"]
    assert (tiny["state"], tiny["max_model_len"], tiny["root"]) == (
        "ready",
        4096,
        "Qwen/Qwen3-0.6B",
    )
    assert {"object", "created", "owned_by", "parent", "permission"} <= set(tiny)
    # an allowed model not running (pattern Qwen/*, known to the catalog), at its own length
    qwen8 = cards["Qwen/Qwen3-8B"]
    assert (qwen8["state"], qwen8["max_model_len"]) == ("not running", 40960)
    assert cards["meta-llama/Llama-3.1-8B-Instruct"]["max_model_len"] == 131072
    assert not any(name.startswith("google/") for name in cards)  # not allowed: not listed


def test_models_retrieve_one_or_not_found(oai: openai.OpenAI, counted: Counted) -> None:
    assert oai.models.retrieve("tiny").id == "tiny"
    card = oai.models.retrieve("Qwen/Qwen3-8B").model_dump()
    assert (card["id"], card["state"]) == ("Qwen/Qwen3-8B", "not running")
    with pytest.raises(openai.NotFoundError) as caught:
        oai.models.retrieve("nope")
    assert caught.value.code == "model_not_found"
    assert counted.sent[-1] == "GET /v1/models/nope"


def test_an_alias_reaches_the_allowed_model(oai: openai.OpenAI, sidecar: Sidecar) -> None:
    answer = oai.completions.create(model="qwen3:0.6b", prompt="via alias", max_tokens=2)
    assert answer.model == "Qwen/Qwen3-0.6B" and answer.choices[0].text == "via alias"
    assert oai.models.retrieve("qwen3:0.6b").id == "Qwen/Qwen3-0.6B"
    assert "Qwen/Qwen3-0.6B" in deployment_names(sidecar)
    # its card shows the worker's own max_model_len, as the worker's /v1/models says it
    listed = sidecar.admin.get("/admin/deployments").json()["deployments"]
    port = next(d["port"] for d in listed if d["name"] == "Qwen/Qwen3-0.6B")
    own = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["max_model_len"]
    card = oai.models.retrieve("Qwen/Qwen3-0.6B").model_dump()
    assert (card["state"], card["max_model_len"]) == ("ready", own)


def test_an_alias_of_a_model_not_allowed_launches_nothing(
    oai: openai.OpenAI, sidecar: Sidecar
) -> None:
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model="gemma3", messages=HI)  # google/gemma-3-4b-it
    assert not any(name.startswith("google/") for name in deployment_names(sidecar))


def test_vllms_other_routes_pass_through(oai: openai.OpenAI, sidecar: Sidecar) -> None:
    response = oai.responses.create(model="tiny", input="say this", max_output_tokens=2)
    assert response.output_text == "say this" and response.model == "tiny"
    stored = oai.responses.retrieve(response.id, extra_query={"model": "tiny"})
    assert stored.id == response.id
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.retrieve(response.id)
    assert caught.value.param == "model" and "?model=" in caught.value.message
    with httpx.Client(base_url=sidecar.url, timeout=30) as http:
        tokens = http.post("/tokenize", json={"model": "tiny", "prompt": "a b c"}).json()
        assert (tokens["count"], tokens["max_model_len"]) == (3, 4096)
        text = http.post("/detokenize", json={"model": "tiny", "tokens": [1, 2]}).json()
        assert text == {"prompt": "<1> <2>"}
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            body = {"model": "tiny", "query": "q", "documents": ["a", "b", "c"]}
            assert len(http.post(path, json=body).json()["results"]) == 3, path
        for path in ("/score", "/v1/score"):
            body = {"model": "tiny", "text_1": "q", "text_2": ["a", "b"]}
            assert [d["index"] for d in http.post(path, json=body).json()["data"]] == [0, 1]
        pooled = http.post("/pooling", json={"model": "tiny", "input": ["x", "y"]}).json()
        assert [d["object"] for d in pooled["data"]] == ["pooling", "pooling"]
        classified = http.post("/classify", json={"model": "tiny", "input": "x"}).json()
        assert classified["data"][0]["num_classes"] == 2


def test_audio_is_routed_by_the_form_field(oai: openai.OpenAI) -> None:
    audio = b"RIFF" + bytes(range(256)) * 40
    done = oai.audio.transcriptions.create(model="tiny", file=("a.wav", audio))
    assert done.text == f"{len(audio)} bytes of audio for tiny"


def test_an_alias_in_a_form_is_replaced(sidecar: Sidecar) -> None:
    audio = b"RIFF" + bytes(200)
    form = {"model": "qwen3:0.6b", "response_format": "json"}
    with httpx.Client(base_url=sidecar.url, timeout=30) as http:
        answer = http.post("/v1/audio/translations", data=form, files={"file": ("a.wav", audio)})
        # the worker serves only Qwen/Qwen3-0.6B: it answers only if the field was replaced
        assert answer.json() == {"text": "204 bytes of audio for Qwen/Qwen3-0.6B", "usage": None}
        no_model = http.post("/v1/audio/transcriptions", files={"file": ("a.wav", audio)})
        assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
        assert "has no 'model' field" in no_model.json()["error"]["message"]


def test_unknown_paths_and_methods_answer_in_the_same_shape(sidecar: Sidecar) -> None:
    with httpx.Client(base_url=sidecar.url, timeout=10) as http:
        path = http.get("/v1/no-such-route")
        method = http.delete("/v1/chat/completions")
    assert path.status_code == 404 and path.headers["x-should-retry"] == "false"
    assert path.json()["error"] | {"message": ""} == {
        "message": "",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    assert method.status_code == 405 and method.json()["error"]["type"] == "Method Not Allowed"
    assert method.headers["allow"] == "POST"


def test_a_loading_model_is_503_with_retry_after_and_listed_loading(tmp_path: Path) -> None:
    env = {"GATEKEEPER_SIM_STARTUP_SECONDS": "3", "GATEKEEPER_SIM_TOKEN_SECONDS": "0.01"}
    settings = settings_for(tmp_path, request_wait_seconds=0.3, worker_env=env)
    with running_sidecar(settings) as sc:
        c = Counted(sc.url, max_retries=0)
        with c.http:
            with pytest.raises(openai.APIStatusError) as caught:
                c.client.completions.create(model="tiny", prompt="x", max_tokens=1)
            e = caught.value
            assert (e.status_code, e.type) == (503, "ServiceUnavailableError")
            assert e.code == "model_loading" and e.response.headers["retry-after"] == "5"
            assert "x-should-retry" not in e.response.headers  # waiting helps: may retry
            assert c.client.models.retrieve("tiny").model_dump()["state"] == "loading"


def test_on_demand_off_is_503_that_is_not_retried(tmp_path: Path) -> None:
    with running_sidecar(settings_for(tmp_path, on_demand=False)) as sc:
        c = Counted(sc.url, max_retries=2)
        with c.http, pytest.raises(openai.InternalServerError) as caught:
            c.client.completions.create(model="tiny", prompt="x", max_tokens=1)
        assert len(c.sent) == 1
        e = caught.value
        assert (e.status_code, e.code) == (503, "model_not_running")
        assert e.response.headers["x-should-retry"] == "false"
        assert "on_demand = false" in e.message
