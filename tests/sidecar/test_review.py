"""Review regressions: reservations and workers are never leaked when a deploy fails
after admission, and concurrent launches of one model do not fail each other."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import openai

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.sidecar.launcher import process_group_alive
from tests.support.sidecar_harness import running_sidecar, settings_for


def _reserved(sc: Any) -> int:
    return sum(
        g["reserved_by_gatekeeper_bytes"] for g in sc.admin.get("/admin/gpus").json()["gpus"]
    )


class SlowInventory:
    """A declared node whose snapshot takes a while (widens the admission window)."""

    def __init__(self, spec: str, delay: float) -> None:
        self._inner = StaticInventory(parse_declared_node(spec))
        self.delay = delay

    def snapshot(self) -> InventorySnapshot:
        time.sleep(self.delay)
        return self._inner.snapshot()


def test_a_failure_writing_the_record_releases_the_reservation_and_stops_the_worker(
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path, restart_policy="never")
    with running_sidecar(settings) as sc:
        # The records directory becomes a file: writing a deployment's record fails.
        shutil.rmtree(tmp_path / "deployments")
        (tmp_path / "deployments").write_text("not a directory")
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        d = sc.wait_state(r.json()["deployment"]["id"], ("failed",), timeout=10)
        assert d["error"]
        assert _reserved(sc) == 0
        pid = d["pid"]
        assert pid is None or not process_group_alive(pid)


def test_on_demand_request_racing_an_admin_deploy_is_served(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with running_sidecar(settings, inventory=SlowInventory("2xH100-80GB", 0.8)) as sc:
        posted: dict[str, Any] = {}

        def admin_deploy() -> None:
            posted["r"] = sc.admin.post("/admin/deployments", json={"model": "tiny"})

        t = threading.Thread(target=admin_deploy)
        t.start()
        time.sleep(0.3)  # the admin deploy holds the manager's lock, admitting
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="x", max_retries=0, timeout=30)
        answer = c.completions.create(model="tiny", prompt="one two", max_tokens=2)
        assert answer.choices[0].text
        t.join(30)
        assert posted["r"].status_code == 201, posted["r"].text
        listed = sc.admin.get("/admin/deployments").json()["deployments"]
        assert len(listed) == 1
        pid = listed[0]["pid"]
        sc.admin.delete(f"/admin/deployments/{listed[0]['id']}")
        assert not process_group_alive(pid)


def test_undeploy_during_a_restart_leaves_no_worker_running(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, restart_limit=2, restart_backoff_seconds=0.2)
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "crash-after-requests:1"
    inventory = SlowInventory("2xH100-80GB", 0.0)
    with running_sidecar(settings, inventory=inventory) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        deployment_id = r.json()["deployment"]["id"]
        sc.wait_state(deployment_id, ("ready",))
        inventory.delay = 0.8  # the restart's admission takes a while
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="x", max_retries=0, timeout=30)
        with contextlib.suppress(openai.APIError):
            c.completions.create(model="tiny", prompt="a b c d", max_tokens=8)
        sc.wait_state(deployment_id, ("failed",), timeout=10)
        time.sleep(0.35)  # past the back-off: the supervisor is admitting the restart
        d = sc.app.state.manager.deployments[deployment_id]
        old = d.worker
        stop = old.stop

        async def slow_stop(grace: float) -> None:  # the old worker takes a while to stop
            await asyncio.sleep(1.5)
            await stop(grace)

        old.stop = slow_stop
        assert sc.admin.delete(f"/admin/deployments/{deployment_id}").status_code == 200
        assert d.state == "stopped"
        assert d.worker is not None
        alive = process_group_alive(d.worker.pid)
        if alive:
            os.killpg(d.worker.pid, signal.SIGKILL)
        assert d.worker is not old, "the restart did not happen during the undeploy"
        assert not alive
        assert _reserved(sc) == 0
