"""Bad requests to every admin route, against a real sidecar (#14): each answer is in the
proxy's error shape (``{"error": {"message", "type", "param", "code"}}``, built by
``gatekeeper.proxy.protocol.error_response``), names the field in ``param`` and in the
message with the value given, and says what to send; no Python exception text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.sidecar_harness import TOKEN, Sidecar, running_sidecar, settings_for

LEAKS = ("TypeError", "ValueError", "AttributeError", "Traceback", "pydantic", "errors.pydantic")


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with running_sidecar(settings_for(tmp_path_factory.mktemp("admin"))) as sidecar:
        yield sidecar


def error_of(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), body
    assert error["param"] == param, body
    assert not any(leak in error["message"] for leak in LEAKS), error["message"]
    return error


def post(sc: Sidecar, raw: bytes) -> httpx.Response:
    return sc.admin.post(
        "/admin/deployments", content=raw, headers={"content-type": "application/json"}
    )


@pytest.mark.parametrize("raw", [b"[]", b'"tiny"', b"null", b"5", b"[{}]"])
def test_a_body_that_is_not_an_object_says_send_an_object(sc: Sidecar, raw: bytes):
    error = error_of(post(sc, raw), 400, "body")
    assert error["type"] == "bad_request"
    assert f"must be a JSON object, not {raw.decode()}" in error["message"]
    assert '{"model": "NAME"' in error["message"]


def test_a_body_that_is_not_json_says_so(sc: Sidecar):
    error = error_of(post(sc, b"model=tiny"), 400, "body")
    assert "not valid JSON" in error["message"] and '{"model": "NAME"' in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "needles"),
    [
        ({}, "model", ["'model' is missing", "configured model name"]),
        ({"options": {}}, "model", ["'model' is missing"]),
        ({"model": 5}, "model", ["'model' = 5", "as a string"]),
        ({"model": ["tiny"]}, "model", ['["tiny"]', "as a string"]),
        ({"model": "tiny", "options": [1]}, "options", ["'options' = [1]", "vllm serve flags"]),
        ({"model": "tiny", "name": ""}, "name", ["'name' = \"\"", "non-empty string"]),
        ({"model": "tiny", "min_sequences": "x"}, "min_sequences", ['= "x"', "above 0"]),
        ({"model": "tiny", "min_kv_tokens": -1}, "min_kv_tokens", ["= -1", "above 0"]),
        ({"model": "tiny", "extra": 1}, "extra", ["'extra' (= 1)", "the fields are model"]),
        ({"modle": "tiny"}, "model", ["'model' is missing"]),
    ],
)
def test_a_wrong_field_is_named_with_its_value_and_what_to_give(
    sc: Sidecar, body: dict[str, Any], param: str, needles: list[str]
):
    error = error_of(sc.admin.post("/admin/deployments", json=body), 400, param)
    for needle in needles:
        assert needle in error["message"], error["message"]


def test_a_misspelt_field_gets_did_you_mean(sc: Sidecar):
    r = sc.admin.post("/admin/deployments", json={"model": "tiny", "optoins": {}})
    error = error_of(r, 400, "optoins")
    assert "did you mean 'options'?" in error["message"]
    assert "vllm serve flags go inside 'options'" in error["message"]


@pytest.mark.parametrize(
    ("options", "param", "value"),
    [
        ({"max_model_len": [1]}, "max_model_len", "[1]"),
        ({"max_model_len": "abc"}, "max_model_len", '"abc"'),
        ({"enable_lora": "yes"}, "enable_lora", '"yes"'),
        ({"kv_cache_dtype": 5}, "kv_cache_dtype", "5"),
        ({"no_such_flag": 1}, "no_such_flag", "'no_such_flag'"),
    ],
)
def test_a_wrong_option_is_named_with_its_value(
    sc: Sidecar, options: dict[str, Any], param: str, value: str
):
    r = sc.admin.post("/admin/deployments", json={"model": "tiny", "options": options})
    error = error_of(r, 400, param)
    assert param in error["message"] and value in error["message"], error["message"]


def test_every_answer_is_json_in_the_shape_even_for_a_bug(sc: Sidecar):
    # limit_mm_per_prompt as a list reached an AttributeError in the flag table once;
    # whatever the status, the answer is the JSON error shape, never plain text.
    r = sc.admin.post(
        "/admin/deployments", json={"model": "tiny", "options": {"limit_mm_per_prompt": [1]}}
    )
    assert r.status_code in (400, 500), r.text
    error_of(r, r.status_code, "limit_mm_per_prompt" if r.status_code == 400 else None)


def test_a_body_too_large_is_413_naming_the_limit(sc: Sidecar):
    raw = json.dumps({"model": "tiny", "name": "x" * (1 << 20)}).encode()
    error = error_of(post(sc, raw), 413, "body")
    assert str(len(raw)) in error["message"] and "1048576" in error["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/deployments/nope"),
        ("DELETE", "/admin/deployments/nope"),
        ("GET", "/admin/deployments/nope/log"),
    ],
)
def test_an_unknown_deployment_is_404_naming_the_id(sc: Sidecar, method: str, path: str):
    # a body on these routes is not read: garbage there changes nothing
    r = sc.admin.request(method, path, content=b"\x00not json")
    error = error_of(r, 404, "id")
    assert (
        "'nope' does not exist" in error["message"] and "GET /admin/deployments" in error["message"]
    )


def test_a_bad_log_offset_names_the_value_and_what_to_send(sc: Sidecar):
    created = sc.admin.post("/admin/deployments", json={"model": "tiny", "name": "logged"})
    assert created.status_code == 201, created.text
    deployment_id = created.json()["deployment"]["id"]
    try:
        r = sc.admin.get(f"/admin/deployments/{deployment_id}/log", params={"offset": "ten"})
        error = error_of(r, 400, "offset")
        assert "offset = 'ten'" in error["message"] and "?offset=0" in error["message"]
    finally:
        sc.admin.delete(f"/admin/deployments/{deployment_id}")


def test_the_token_errors_are_in_the_same_shape(sc: Sidecar):
    bare = httpx.get(f"{sc.url}/admin/deployments")
    assert error_of(bare, 401, None)["type"] == "unauthorized"
    wrong = httpx.get(f"{sc.url}/admin/gpus", headers={"Authorization": f"Bearer {TOKEN}x"})
    assert "Authorization: Bearer" in error_of(wrong, 401, None)["message"]


def test_a_rejection_is_507_with_the_decision_beside_the_error(sc: Sidecar):
    body = {"model": "meta-llama/Llama-3.3-70B-Instruct", "options": {"max_model_len": 131072}}
    r = sc.admin.post("/admin/deployments", json=body)
    error = error_of(r, 507, None)
    assert error["type"] == "does_not_fit" and "does not fit on this node" in error["message"]
    assert r.json()["decision"]["admitted"] is False
    assert r.headers["x-should-retry"] == "false"  # error_response's: a retry cannot help
