"""SIGKILL of ``gatekeeper serve`` at the steps of a launch, then a restart on the same
state directory (#13): no orphan, no double booking, no killed healthy worker, no stuck
reservation. The sidecar is the installed command in a subprocess, killed for real; the
workers are simulator processes. (The step between a deploy's 201 and the spawn, and the
one between spawn and record, are in test_adoption.py: they cannot be hit from outside.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatekeeper.sidecar.launcher import marked_workers, process_group_alive
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import SIMULATOR, TOKEN, free_port_block

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"


@contextlib.contextmanager
def serve(state: Path, port: int) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    config = state.parent / "gatekeeper.toml"
    config.write_text(
        f"worker_port_min = {port + 1}\nworker_port_max = {port + 19}\n"
        f"worker_command = {json.dumps(SIMULATOR)}\n"
        'gpus = "2xH100-80GB"\nallowed_models = ["Qwen/*"]\n'
        'worker_env = { GATEKEEPER_SIM_STARTUP_SECONDS = "3", GATEKEEPER_SIM_TOKEN_SECONDS = "0" }\n'
        '[[models]]\nname = "tiny"\nmodel = "Qwen/Qwen3-0.6B"\n'
        "options = { max_model_len = 4096 }\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env = {**clean, "GATEKEEPER_STATE_DIR": str(state), "GATEKEEPER_ADMIN_TOKEN": TOKEN}
    argv = [str(GATEKEEPER), "--config", str(config), "serve", "--port", str(port)]
    log = state.parent / "sidecar.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if client.get("/healthz").status_code == 200:
                    break
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the sidecar did not start"
            time.sleep(0.1)
        yield proc, client
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def wait_state(client: httpx.Client, deployment_id: str, states: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        d: dict[str, Any] = client.get(f"/admin/deployments/{deployment_id}").json()
        if d.get("state") in states:
            return d
        assert time.monotonic() < deadline, d
        time.sleep(0.1)


def rows(state: Path) -> list[tuple[str, str]]:
    with Ledger(ledger_path(state)) as ledger:
        return [(r.deployment_id, r.state) for r in ledger.live()]


@pytest.mark.parametrize("kill_when", ["loading", "ready"])
def test_sigkill_of_the_sidecar_then_restart_keeps_the_worker(
    tmp_path: Path, kill_when: str
) -> None:
    state, port = tmp_path / "state", free_port_block()
    state.mkdir()
    try:
        with serve(state, port) as (proc, client):
            r = client.post("/admin/deployments", json={"model": "tiny"})
            assert r.status_code == 201, r.text
            deployment_id = r.json()["deployment"]["id"]
            pid = wait_state(client, deployment_id, (kill_when,))["pid"]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert process_group_alive(pid), "the worker outlives its sidecar"
        with serve(state, port) as (proc, client):
            d = wait_state(client, deployment_id, ("ready", "failed"))
            assert d["state"] == "ready" and d["pid"] == pid, d
            assert rows(state) == [(deployment_id, "ready")], "one ready row, no double booking"
            listed = client.get("/admin/deployments").json()["deployments"]
            assert [x["id"] for x in listed] == [deployment_id]
            assert set(marked_workers(state / "work")) == {pid}, "no orphan"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # A third start long after: the worker's row no longer expires.
        with serve(state, port) as (proc, client):
            d = wait_state(client, deployment_id, ("ready", "failed"))
            assert d["pid"] == pid and rows(state) == [(deployment_id, "ready")]
    finally:
        for leader in marked_workers(state / "work"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
