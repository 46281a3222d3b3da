"""A sidecar restarted at each awkward moment of a launch (#13, items 2 and 7): what the
earlier sidecar left is adopted, released or stopped, never left to block a GPU.

The earlier sidecar stops without stopping its workers (``stop_workers_on_exit`` off),
which leaves the ledger and the records exactly as a SIGKILL would: its supervisors are
cancelled, nothing is written. The workers are real processes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from gatekeeper.sidecar.launcher import WORKER_MARKER_ENV, process_group_alive
from gatekeeper.sidecar.ledger import Ledger, Promise, ledger_path
from tests.support.sidecar_harness import running_sidecar, settings_for


def _rows(state: Path, deployment_id: str) -> list[str]:
    with Ledger(ledger_path(state)) as ledger:
        return [r.state for r in ledger.by_deployment(deployment_id)]


def test_a_worker_still_loading_is_adopted_awaited_and_its_row_made_ready(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path,
        stop_workers_on_exit=False,
        worker_env={"GATEKEEPER_SIM_STARTUP_SECONDS": "3", "GATEKEEPER_SIM_TOKEN_SECONDS": "0"},
    )
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        deployment_id = r.json()["deployment"]["id"]
        pid = sc.wait_state(deployment_id, ("loading",))["pid"]
    assert process_group_alive(pid), "the earlier sidecar left its worker loading"
    assert _rows(tmp_path, deployment_id) == ["pending"]
    with running_sidecar(settings.model_copy(update={"stop_workers_on_exit": True})) as sc:
        ready = sc.wait_state(deployment_id, ("ready", "failed"), timeout=30)
        assert ready["state"] == "ready", ready
        assert ready["pid"] == pid, "the loading worker was adopted, not relaunched"
        assert _rows(tmp_path, deployment_id) == ["ready"], "its row no longer expires"
        reply = httpx_chat(sc.url)
        assert reply == 200


def httpx_chat(url: str) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code


def test_a_serving_worker_whose_row_was_left_pending_is_made_ready(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, stop_workers_on_exit=False)
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        deployment_id = r.json()["deployment"]["id"]
        pid = sc.wait_state(deployment_id, ("loading",))["pid"]
    # The earlier sidecar died while the worker loaded; the worker became ready alone.
    time.sleep(1.0)
    assert _rows(tmp_path, deployment_id) == ["pending"]
    with running_sidecar(settings.model_copy(update={"stop_workers_on_exit": True})) as sc:
        d = sc.wait_state(deployment_id, ("ready",))
        assert d["pid"] == pid
        assert _rows(tmp_path, deployment_id) == ["ready"]


def test_a_reservation_without_a_worker_is_released_at_start(tmp_path: Path) -> None:
    """The sidecar was killed after a deploy's 201 and before the worker was spawned."""
    settings = settings_for(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    with Ledger(ledger_path(tmp_path)) as ledger:
        ledger.admit(
            "ghost-00000001",
            "Qwen/Qwen3-0.6B",
            lambda outstanding: (None, (Promise("DECLARED-0", 40 * 2**30),)),
            ttl_seconds=960,
            payload=lambda d: "{}",
        )
    with running_sidecar(settings):
        assert _rows(tmp_path, "ghost-00000001") == ["released"]


def test_a_worker_spawned_but_never_recorded_is_stopped_at_start(tmp_path: Path) -> None:
    """The sidecar was killed between spawning a worker and writing its record."""
    settings = settings_for(tmp_path)
    marker = tmp_path / "work" / "ghost-00000002"
    env = {**os.environ, WORKER_MARKER_ENV: str(marker)}
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    orphan = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        with running_sidecar(settings):
            assert orphan.wait(timeout=15) != 0, "the unrecorded worker was stopped"
            assert stranger.poll() is None, "a process without the marker is left alone"
    finally:
        for p in (orphan, stranger):
            p.kill()
            p.wait()
