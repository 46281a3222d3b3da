"""Adoption after a restart when a dead worker's recorded pid now belongs to another
process: that process is never signalled, the deployment's reservation is released.

The worker is real (the simulator), killed for real; the pid's new owner is a real
``sleep`` in its own process group (so a ``killpg`` on the recorded pid would reach it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gatekeeper.sidecar.launcher import process_group_alive
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import running_sidecar, settings_for


def _deploy_then_kill_the_worker(tmp_path: Path) -> tuple[Any, str]:
    """A ready deployment left to be adopted, whose worker then dies (the sidecar is down)."""
    settings = settings_for(tmp_path, stop_workers_on_exit=False)
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        deployment_id = r.json()["deployment"]["id"]
        pid = sc.wait_state(deployment_id, ("ready",))["pid"]
    os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # the worker was this test process's child: reap it
    deadline = time.monotonic() + 10
    while process_group_alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return settings, deployment_id


@contextlib.contextmanager
def _stranger() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated live process leading its own process group."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _rewrite_record(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data["record"].pop(key, None)
        else:
            data["record"][key] = value
    path.write_text(json.dumps(data))


def _restart_and_check(
    settings: Any, deployment_id: str, stranger: subprocess.Popen[bytes]
) -> None:
    path = Path(settings.state_dir) / "deployments" / f"{deployment_id}.json"
    with running_sidecar(settings) as sc:
        assert sc.admin.get(f"/admin/deployments/{deployment_id}").status_code == 404
    time.sleep(0.3)  # a SIGTERM sent during adoption has landed by now
    assert stranger.poll() is None, f"the unrelated process got signal {-stranger.returncode}"
    assert process_group_alive(stranger.pid)
    assert not path.exists()
    ledger = Ledger(ledger_path(Path(settings.state_dir)))
    try:
        assert deployment_id not in {r.deployment_id for r in ledger.live()}
        assert all(r.state == "released" for r in ledger.by_deployment(deployment_id))
    finally:
        ledger.close()


def test_a_reused_pid_is_never_signalled_and_the_reservation_is_released(tmp_path: Path):
    settings, deployment_id = _deploy_then_kill_the_worker(tmp_path)
    path = tmp_path / "deployments" / f"{deployment_id}.json"
    recorded = json.loads(path.read_text())["record"]
    assert isinstance(recorded["pid_start_ticks"], int)
    with _stranger() as stranger:
        _rewrite_record(path, pid=stranger.pid)  # the kernel handed the pid on
        _restart_and_check(settings, deployment_id, stranger)


def test_a_record_without_a_start_time_is_released_without_signalling(tmp_path: Path):
    """Records written before start times were recorded: the pid is unverifiable."""
    settings, deployment_id = _deploy_then_kill_the_worker(tmp_path)
    path = tmp_path / "deployments" / f"{deployment_id}.json"
    with _stranger() as stranger:
        _rewrite_record(path, pid=stranger.pid, pid_start_ticks=None)
        _restart_and_check(settings, deployment_id, stranger)
