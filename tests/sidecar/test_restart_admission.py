"""A restart refused because the GPU is momentarily busy is retried (#13 item 10)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import openai

from gatekeeper.sidecar.ledger import Promise
from tests.support.sidecar_harness import running_sidecar, settings_for


def test_a_refused_restart_admission_is_retried(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path, gpus="1xH100-80GB", restart_limit=4, restart_backoff_seconds=0.3
    )
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "crash-after-requests:1"
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        deployment_id = r.json()["deployment"]["id"]
        sc.wait_state(deployment_id, ("ready",))
        ledger = sc.app.state.manager.ledger
        gpu = sc.admin.get("/admin/gpus").json()["gpus"][0]
        # Another holder takes the whole GPU while the worker crashes.
        ledger.admit(
            "busy-1",
            "other",
            lambda _: (None, (Promise(gpu["uuid"], gpu["total_bytes"]),)),
            ttl_seconds=60,
        )
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="x", max_retries=0, timeout=30)
        with contextlib.suppress(openai.APIError):
            c.completions.create(model="tiny", prompt="a b c d", max_tokens=8)
        d = sc.app.state.manager.deployments[deployment_id]
        deadline = time.monotonic() + 10
        while "restart not admitted" not in (d.error or "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "restart not admitted" in (d.error or "")
        ledger.release("busy-1")  # the GPU is free again: the next try is admitted
        sc.wait_state(deployment_id, ("ready",), timeout=20)
