"""Idle workers put to sleep instead of stopped (#40): through the real sidecar with
simulator workers on a declared node, whose sleep API is vLLM's (``simulator.sleep``).
No clock is mocked: ``idle_seconds`` is a fraction of a second."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from gatekeeper.gpus.host_memory import write_host_files
from gatekeeper.settings import ModelEntry
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.cli.test_rehearsal_output import gatekeeper
from tests.support.sidecar_harness import running_sidecar, settings_for


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def deploy(sidecar, model: str = "tiny", **body: Any) -> dict[str, Any]:
    r = sidecar.admin.post("/admin/deployments", json={"model": model, **body})
    assert r.status_code == 201, r.text
    deployment: dict[str, Any] = r.json()["deployment"]
    return deployment


def rows(state_dir: Path, deployment_id: str) -> list[tuple[str, int]]:
    with Ledger(ledger_path(state_dir)) as ledger:
        live = [r for r in ledger.by_deployment(deployment_id) if r.state != "released"]
    return [(r.state, r.bytes) for r in live]


def ask(url: str, model: str = "tiny") -> str:
    with client(url) as c:  # closed: no socket left to the garbage collector
        answer = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=2
        )
    return answer.choices[0].message.content or ""


def metric(sc, name: str, **labels: str) -> float:
    registry = sc.app.state.metrics_registry
    return registry.get_sample_value(name, labels) or 0.0


def test_an_idle_worker_sleeps_keeps_its_residue_and_a_request_wakes_it(tmp_path: Path):
    settings = settings_for(tmp_path, idle_action="sleep", idle_seconds=0.3)
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        assert d["idle_action"] == "sleep" and d["sleep_level"] == 1
        asleep = sc.wait_state(d["id"], ("sleeping",), timeout=30)
        log = Path(asleep["log_path"]).read_text()
        assert "'enable_sleep_mode': True" in log  # launched with --enable-sleep-mode
        ((state, kept),) = rows(tmp_path, d["id"])
        assert state == "ready" and asleep["gpu_bytes"] == kept
        predicted = asleep["predicted"]
        assert asleep["host_asleep_bytes"] == predicted["weights_bytes"]  # level 1
        assert metric(sc, "gatekeeper_workers", state="sleeping") == 1
        shown = gatekeeper(sc, "ps")
        assert shown.returncode == 0, shown.stderr
        row = next(line for line in shown.stdout.splitlines() if line.startswith(d["id"]))
        assert row.split()[2] == "sleeping"
        gib = f"{kept / 2**30:.2f} GiB of GPU memory"
        assert f"sleeping: {d['id']}: level 1, holds {gib}" in shown.stdout
        assert ask(sc.url)
        woke = sc.admin.get(f"/admin/deployments/{d['id']}").json()
        promise = woke["gpu_bytes"]
        assert woke["state"] == "ready" and woke["host_asleep_bytes"] == 0
        assert kept == promise - predicted["weights_bytes"] - predicted["kv_cache_bytes"]
        assert rows(tmp_path, d["id"]) == [("ready", promise)]
        assert metric(sc, "gatekeeper_worker_wakes_total", model="tiny") == 1
        assert metric(sc, "gatekeeper_worker_wake_duration_seconds_count", model="tiny") == 1
        assert metric(sc, "gatekeeper_worker_sleeps_total", model="tiny") >= 1


def test_a_wake_puts_another_idle_model_to_sleep_for_its_room(tmp_path: Path):
    """One GPU; two 7-8B models that do not fit awake together: each request for the
    sleeping one puts the other (idle, nothing in flight) to sleep first."""
    kv = {"kv_cache_memory_bytes": 40 * 2**30}  # 7-8B + 40 GiB: two do not fit in 80
    models = [
        ModelEntry(name="qwen", model="Qwen/Qwen2.5-7B-Instruct", options=kv),
        ModelEntry(name="llama", model="meta-llama/Llama-3.1-8B-Instruct", options=kv),
    ]
    settings = settings_for(
        tmp_path,
        gpus="1xH100-80GB",
        share_gpus=True,
        models=models,
        idle_action="sleep",
        idle_seconds=30.0,
    )
    with running_sidecar(settings) as sc:
        first, second = "qwen", "llama"
        assert ask(sc.url, first)
        assert ask(sc.url, second)  # the first is put to sleep at once for its room
        states = {
            x["name"]: x["state"] for x in sc.admin.get("/admin/deployments").json()["deployments"]
        }
        assert states == {first: "sleeping", second: "ready"}
        assert ask(sc.url, first)  # wakes: the second sleeps for it
        states = {
            x["name"]: x["state"] for x in sc.admin.get("/admin/deployments").json()["deployments"]
        }
        assert states == {first: "ready", second: "sleeping"}
        assert metric(sc, "gatekeeper_worker_wakes_total", model=first) == 1


def _host_node(tmp_path: Path, host_gib: int, models: list[ModelEntry]) -> Any:
    """One shared H100-80GB and ``host_gib`` GiB of declared host memory; level 1."""
    root = write_host_files(
        tmp_path / "host", total_bytes=host_gib * 2**30, available_bytes=host_gib * 2**30
    )
    return settings_for(
        tmp_path / "state",
        gpus="1xH100-80GB",
        share_gpus=True,
        models=models,
        idle_action="sleep",
        idle_seconds=30.0,
        host_memory_root=root,
    )


def _live_states(sc) -> dict[str, str]:
    listed = sc.admin.get("/admin/deployments").json()["deployments"]
    return {x["name"]: x["state"] for x in listed if x["state"] not in ("stopped", "failed")}


def test_an_idle_worker_is_stopped_when_the_host_cannot_hold_both_asleep(tmp_path: Path):
    """Two 7-8B models fit the GPU together but not the host at level 1 (each promise
    holds its weights, about 15 GiB, of 25 usable): asking for one stops the other (idle,
    nothing in flight) for its host memory, rather than refusing, or putting it to sleep,
    which would free no host memory."""
    kv = {"kv_cache_memory_bytes": 8 * 2**30, "max_model_len": 8192}
    models = [
        ModelEntry(name="qwen", model="Qwen/Qwen2.5-7B-Instruct", options=kv),
        ModelEntry(name="llama", model="meta-llama/Llama-3.1-8B-Instruct", options=kv),
    ]
    with running_sidecar(_host_node(tmp_path, 26, models)) as sc:
        assert ask(sc.url, "qwen")
        assert ask(sc.url, "llama")
        assert _live_states(sc) == {"llama": "ready"}
        assert ask(sc.url, "qwen")
        assert _live_states(sc) == {"qwen": "ready"}
        assert metric(sc, "gatekeeper_worker_sleeps_total", model="qwen") == 0


def test_nothing_is_given_up_for_a_model_the_host_cannot_hold_anyway(tmp_path: Path):
    """The 7B model's host need at level 1 (about 15 GiB) is beyond the 11 GiB usable:
    the idle tiny model is neither stopped nor put to sleep for a refusal."""
    kv = {"kv_cache_memory_bytes": 8 * 2**30, "max_model_len": 8192}
    models = [
        ModelEntry(name="tiny", model="Qwen/Qwen3-0.6B", options={"max_model_len": 4096}),
        ModelEntry(name="qwen", model="Qwen/Qwen2.5-7B-Instruct", options=kv),
    ]
    with running_sidecar(_host_node(tmp_path, 12, models)) as sc:
        assert ask(sc.url)
        with pytest.raises(openai.APIStatusError) as refused:
            ask(sc.url, "qwen")
        assert refused.value.status_code == 507
        assert "host memory" in str(refused.value)
        assert _live_states(sc) == {"tiny": "ready"}
        assert metric(sc, "gatekeeper_worker_sleeps_total", model="tiny") == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [({"sleep_level": 3}, "sleep_level"), ({"sleep_level": 0}, "sleep_level"),
     ({"idle_action": "hibernate"}, "idle_action")],
)  # fmt: skip
def test_bad_sleep_input_is_refused_at_deploy_time(tmp_path: Path, body, field):
    with running_sidecar(settings_for(tmp_path)) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny", **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field


def test_a_failed_wake_restarts_the_worker_and_answers_its_request(tmp_path: Path):
    settings = settings_for(tmp_path, idle_action="sleep", idle_seconds=0.3)
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "wake-error"
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        sc.wait_state(d["id"], ("sleeping",), timeout=30)
        with pytest.raises(openai.APIStatusError) as e:
            ask(sc.url)
        assert e.value.status_code == 503 and "failed to wake" in str(e.value)
        assert (
            metric(sc, "gatekeeper_worker_sleep_failures_total", operation="wake", model="tiny")
            == 1
        )
        again = sc.wait_state(d["id"], ("ready", "sleeping"), timeout=20)
        assert again["restarts"] == 1
        assert [s for s, _ in rows(tmp_path, d["id"])] == ["ready"]


def test_a_hung_wake_is_cut_at_wake_timeout_seconds_and_the_worker_restarted(tmp_path: Path):
    settings = settings_for(
        tmp_path, idle_action="sleep", idle_seconds=0.3, wake_timeout_seconds=1.0
    )
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "wake-hang"
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        sc.wait_state(d["id"], ("sleeping",), timeout=30)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            ask(sc.url)
        assert e.value.status_code == 503 and time.monotonic() - started < 10
        assert "failed to wake (POST /wake_up: ReadTimeout" in str(e.value)
        again = sc.wait_state(d["id"], ("ready", "sleeping"), timeout=30)
        assert again["restarts"] == 1


def test_a_sleeping_worker_killed_from_outside_is_restarted_and_leaks_no_row(tmp_path: Path):
    settings = settings_for(tmp_path, idle_action="sleep", idle_seconds=0.3)
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        asleep = sc.wait_state(d["id"], ("sleeping",), timeout=30)
        os.killpg(asleep["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            now = sc.admin.get(f"/admin/deployments/{d['id']}").json()
            if now["restarts"] == 1 and now["state"] in ("ready", "sleeping"):
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        assert len(rows(tmp_path, d["id"])) == 1
        assert ask(sc.url)


def test_a_restarted_sidecar_adopts_a_sleeping_worker_asleep(tmp_path: Path):
    settings = settings_for(
        tmp_path, idle_action="sleep", idle_seconds=0.3, stop_workers_on_exit=False
    )
    with running_sidecar(settings) as sc:
        d = deploy(sc)
        sc.wait_state(d["id"], ("sleeping",), timeout=30)
        kept = rows(tmp_path, d["id"])
    with running_sidecar(settings.model_copy(update={"stop_workers_on_exit": True})) as sc:
        adopted = sc.admin.get(f"/admin/deployments/{d['id']}").json()
        assert adopted["state"] == "sleeping" and adopted["idle_action"] == "sleep"
        assert rows(tmp_path, d["id"]) == kept
        assert ask(sc.url)
        assert sc.admin.get(f"/admin/deployments/{d['id']}").json()["state"] == "ready"
