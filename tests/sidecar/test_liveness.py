"""A worker that stops answering while it serves is taken out and restarted (#27 item
7): a real simulator worker frozen with SIGSTOP (a real signal to a real process) misses
its liveness probes, becomes ``unhealthy`` (the admin API, ``/healthz`` and the metric
say so, and ``gatekeeper ps``), gets no traffic, and is stopped (SIGTERM with SIGCONT, so
it ends without sitting out the grace period) and restarted per the restart policy
(``unhealthy`` until then). Short
intervals keep it quick; the times from freeze to ``unhealthy`` and to the restarted
worker's readiness are printed (``pytest -s``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from gatekeeper.sidecar.launcher import process_group_alive
from tests.support.sidecar_harness import TOKEN, running_sidecar, settings_for

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"

INTERVAL, TIMEOUT, FAILURES = 0.5, 1.0, 3  # a loaded CI machine answers in 1 s
GRACE = 60.0


def _poll(sc, deployment_id: str, done, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        d: dict[str, Any] = sc.admin.get(f"/admin/deployments/{deployment_id}").json()
        if done(d):
            return d
        assert time.monotonic() < deadline, d
        time.sleep(0.05)


def test_a_frozen_worker_becomes_unhealthy_gets_no_traffic_and_is_restarted(
    tmp_path: Path,
) -> None:
    settings = settings_for(
        tmp_path,
        health_interval_seconds=INTERVAL,
        health_timeout_seconds=TIMEOUT,
        health_failures=FAILURES,
        stop_grace_seconds=GRACE,  # SIGCONT after SIGTERM: the frozen worker ends at once
        restart_backoff_seconds=2.0,  # unhealthy through the stop and the back-off
    )
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        deployment_id = r.json()["deployment"]["id"]
        ready = sc.wait_state(deployment_id, ("ready",))
        time.sleep(3 * INTERVAL)  # answered probes: still ready
        assert sc.admin.get(f"/admin/deployments/{deployment_id}").json()["state"] == "ready"

        frozen = ready["pid"]
        os.killpg(frozen, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            sick = _poll(sc, deployment_id, lambda d: d["state"] != "ready")
            to_unhealthy = time.monotonic() - t0
            assert sick["state"] == "unhealthy", sick
            assert "stopped answering /health" in sick["error"], sick
            ps = subprocess.run(
                [str(GATEKEEPER), "ps", "--url", sc.url, "--token", TOKEN],
                capture_output=True,
                text=True,
                timeout=30,
                env={k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")},
            )
            row = [line for line in ps.stdout.splitlines() if line.startswith(deployment_id)]
            assert row and " unhealthy " in row[0], ps.stdout + ps.stderr
            health = httpx.get(f"{sc.url}/healthz", timeout=5).json()
            assert health["status"] == "degraded" and health["unhealthy_workers"] == [
                deployment_id
            ], health
            # No traffic to the frozen worker: the request waits for the restarted one.
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            chat = httpx.post(f"{sc.url}/v1/chat/completions", json=body, timeout=20)
            assert chat.status_code == 200, chat.text
            back = _poll(sc, deployment_id, lambda d: d["state"] == "ready")
            to_ready = time.monotonic() - t0
        finally:
            if process_group_alive(frozen):
                os.killpg(frozen, signal.SIGCONT)
        assert back["pid"] != frozen and back["restarts"] == 1, back
        assert not process_group_alive(frozen), "the frozen worker was stopped"
        metrics = httpx.get(f"{sc.url}/metrics", timeout=5).text
        assert 'gatekeeper_worker_unhealthy_total{model="tiny"} 1.0' in metrics
        assert httpx.get(f"{sc.url}/healthz", timeout=5).json()["status"] == "ok"
        bound = (INTERVAL + TIMEOUT) * FAILURES + 2.0  # + the polling, on a busy machine
        assert to_unhealthy < bound, to_unhealthy
        assert to_ready < bound + 15.0 < GRACE, f"the frozen worker sat out its grace: {to_ready}"
        print(
            f"\nfreeze -> unhealthy {to_unhealthy:.2f} s, -> restarted and ready {to_ready:.2f} s"
        )
