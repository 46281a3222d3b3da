"""The sidecar end to end: admin API, launch, readiness, proxy, crash, restart,
adoption, eviction — against the simulator worker, with the openai client as caller."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gatekeeper.sidecar.launcher import process_group_alive
from tests.support.sidecar_harness import TOKEN, free_port_block, running_sidecar, settings_for


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def deploy(sidecar, model: str = "tiny", **body) -> Any:
    r = sidecar.admin.post("/admin/deployments", json={"model": model, **body})
    assert r.status_code == 201, r.text
    return r.json()["deployment"]


def test_deploy_chat_stream_and_undeploy(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        d = deploy(sc)
        assert d["state"] in ("launching", "loading", "admitted")
        ready = sc.wait_state(d["id"], ("ready",))
        assert ready["actual"]["weights_bytes"] > 0 and ready["predicted"]["weights_bytes"] > 0
        assert "--served-model-name" not in ready["vllm_args"]  # added at launch
        c = client(sc.url)
        answer = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello world"}], max_tokens=4
        )
        assert answer.choices[0].message.content
        chunks = list(
            c.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                stream=True,
            )
        )
        assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)
        models = {m.id: m for m in c.models.list().data}
        assert "tiny" in models
        listed = sc.admin.get("/admin/deployments").json()["deployments"]
        assert [x["id"] for x in listed] == [d["id"]]
        pid = ready["pid"]
        stopped = sc.admin.delete(f"/admin/deployments/{d['id']}").json()
        assert stopped["state"] == "stopped"
        assert not process_group_alive(pid)
        assert not list((tmp_path / "deployments").glob("*.json"))


def test_admin_api_needs_the_token(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        assert httpx.get(f"{sc.url}/admin/deployments").status_code == 401
        bad = httpx.get(f"{sc.url}/admin/deployments", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and "token" in bad.json()["error"]["message"]
    with running_sidecar(settings_for(tmp_path / "off", admin_token=None)) as sc:
        r = httpx.get(f"{sc.url}/admin/deployments", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 403 and "GATEKEEPER_ADMIN_TOKEN" in r.json()["error"]["message"]


def test_rejections_and_bad_requests(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        big = sc.admin.post(
            "/admin/deployments", json={"model": "meta-llama/Llama-3.1-405B-Instruct"}
        )
        assert big.status_code == 507
        assert big.json()["decision"]["reasons"] and big.json()["decision"]["suggestions"]
        assert (
            sc.admin.post(
                "/admin/deployments", json={"model": "mistralai/Mixtral-8x7B-Instruct-v0.1"}
            ).status_code
            == 403
        )
        assert sc.admin.post("/admin/deployments", content=b"{not json").status_code == 400
        assert (
            sc.admin.post(
                "/admin/deployments", json={"model": "tiny", "options": {"max_model_len": -5}}
            ).status_code
            == 400
        )
        assert (
            sc.admin.post(
                "/admin/deployments", json={"model": "tiny", "options": {"warp": 9}}
            ).status_code
            == 400
        )
        assert sc.admin.get("/admin/deployments/nope").status_code == 404
        assert sc.admin.get("/admin/gpus").json()["gpus"][0]["reserved_by_gatekeeper_bytes"] == 0
        with pytest.raises(openai.NotFoundError):
            client(sc.url).chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}]
            )
        assert sc.admin.get("/admin/deployments").json()["deployments"] == []


def test_on_demand_launch_answers_the_first_request(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        answer = client(sc.url).completions.create(model="tiny", prompt="one two", max_tokens=2)
        assert answer.choices[0].text
        (d,) = sc.admin.get("/admin/deployments").json()["deployments"]
        assert d["state"] == "ready" and d["name"] == "tiny"


def test_start_up_failure_reports_vllms_reason(tmp_path: Path):
    settings = settings_for(tmp_path, restart_policy="never")
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "max-model-len"
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        failed = sc.wait_state(d["id"], ("failed",))
        assert "max_model_len check" in failed["error"] and "exited with code 1" in failed["error"]
        assert sc.admin.get("/admin/gpus").json()["gpus"][0]["reserved_by_gatekeeper_bytes"] == 0


def test_a_crashed_worker_is_restarted(tmp_path: Path):
    settings = settings_for(tmp_path, restart_limit=2)
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "crash-after-requests:1"
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        sc.wait_state(d["id"], ("ready",))
        with pytest.raises(openai.APIError):
            client(sc.url).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "a b c d"}], max_tokens=8
            )
        deadline = time.monotonic() + 30
        while True:
            now = sc.admin.get(f"/admin/deployments/{d['id']}").json()
            if now["restarts"] >= 1 and now["state"] == "ready":
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.1)


def test_workers_survive_a_sidecar_restart_and_are_adopted(tmp_path: Path):
    settings = settings_for(tmp_path, stop_workers_on_exit=False)
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        pid = sc.wait_state(d["id"], ("ready",))["pid"]
    assert process_group_alive(pid)
    with running_sidecar(settings) as sc:
        adopted = sc.admin.get(f"/admin/deployments/{d['id']}").json()
        assert adopted["state"] == "ready" and adopted["pid"] == pid
        assert client(sc.url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
        sc.admin.delete(f"/admin/deployments/{d['id']}")
    assert not process_group_alive(pid)


def test_idle_worker_is_evicted_for_a_model_that_needs_the_room(tmp_path: Path):
    settings = settings_for(tmp_path, gpus="1xH100-80GB", idle_eviction=True, idle_seconds=0.0)
    with running_sidecar(settings) as sc:
        first = deploy(sc)
        sc.wait_state(first["id"], ("ready",))
        answer = client(sc.url).chat.completions.create(
            model="Qwen/Qwen2.5-7B-Instruct",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=1,
        )
        assert answer.choices
        states = {
            x["name"]: x["state"] for x in sc.admin.get("/admin/deployments").json()["deployments"]
        }
        assert states == {"tiny": "stopped", "Qwen/Qwen2.5-7B-Instruct": "ready"}


def test_gatekeeper_serve_binds_loopback_by_default(tmp_path: Path):
    """The real command, with no host configured, listens on 127.0.0.1 only."""
    port = free_port_block(1)
    env = {k: v for k, v in os.environ.items() if k != "GATEKEEPER_HOST"}
    env |= {"GATEKEEPER_STATE_DIR": str(tmp_path), "GATEKEEPER_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gatekeeper", "serve", "--rehearsal"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "the sidecar did not start"
            time.sleep(0.1)
        listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
        local = [line.split()[1] for line in listening if line.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in local  # 127.0.0.1:port
        assert f"00000000:{port:04X}" not in local  # not 0.0.0.0:port
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"on http://127.0.0.1:{port}" in out and "REHEARSAL" in out


def test_old_released_reservations_are_pruned_at_start(tmp_path: Path):
    from gatekeeper.sidecar.ledger import Ledger, Promise, ledger_path

    week_ago = time.time() - 8 * 24 * 3600
    with Ledger(ledger_path(tmp_path), clock=lambda: week_ago) as ledger:
        ledger.admit("old", "m", lambda _: (None, (Promise("DECLARED-0", 1),)), ttl_seconds=60)
        ledger.release("old")
    with running_sidecar(settings_for(tmp_path)):
        pass
    with Ledger(ledger_path(tmp_path)) as ledger:
        assert ledger.by_deployment("old") == ()
