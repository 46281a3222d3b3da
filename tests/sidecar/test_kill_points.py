"""SIGKILL of ``gatekeeper serve`` at the steps of a launch, then a restart on the same
state directory (#13): no orphan, no double booking, no killed healthy worker, no stuck
reservation. The sidecar is the installed command in a subprocess, killed for real; the
workers are simulator processes. (The step between a deploy's 201 and the spawn, and the
one between spawn and record, are in test_adoption.py: they cannot be hit from outside.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.serve_process import TOKEN, sidecar
from gatekeeper.sidecar.launcher import marked_workers, process_group_alive
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import free_port_block


@contextlib.contextmanager
def serve(work: Path, port: int) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    """``gatekeeper serve`` on ``work/state``, its workers loading for 3 s."""
    slow = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "3", GATEKEEPER_SIM_TOKEN_SECONDS = "0" }'
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        sidecar(work, port, preload=False, worker_env=slow) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client,
    ):
        yield proc, client


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
        with serve(tmp_path, port) as (proc, client):
            r = client.post("/admin/deployments", json={"model": "tiny"})
            assert r.status_code == 201, r.text
            deployment_id = r.json()["deployment"]["id"]
            pid = wait_state(client, deployment_id, (kill_when,))["pid"]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert process_group_alive(pid), "the worker outlives its sidecar"
        with serve(tmp_path, port) as (proc, client):
            d = wait_state(client, deployment_id, ("ready", "failed"))
            assert d["state"] == "ready" and d["pid"] == pid, d
            assert rows(state) == [(deployment_id, "ready")], "one ready row, no double booking"
            listed = client.get("/admin/deployments").json()["deployments"]
            assert [x["id"] for x in listed] == [deployment_id]
            assert set(marked_workers(state / "work")) == {pid}, "no orphan"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # A third start long after: the worker's row no longer expires.
        with serve(tmp_path, port) as (proc, client):
            d = wait_state(client, deployment_id, ("ready", "failed"))
            assert d["pid"] == pid and rows(state) == [(deployment_id, "ready")]
    finally:
        for leader in marked_workers(state / "work"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
