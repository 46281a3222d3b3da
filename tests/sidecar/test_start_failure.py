"""A model whose worker fails at start (#13, item 9): the failure is remembered with
vLLM's reason, the next requests are answered at once without a launch, and a launch is
tried again only after a back-off that doubles. The sidecar and the simulator are real;
only the router's clock is replaced, to let the back-off pass."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

BODY = {"model": "tiny", "prompt": "one two", "max_tokens": 2}


def _launches(sc: Sidecar) -> int:
    deployments = sc.admin.get("/admin/deployments").json()["deployments"]
    return sum(1 + d["restarts"] for d in deployments)


def _settle(sc: Sidecar) -> list[dict[str, Any]]:
    """The deployments once the failed one has been stopped (no restart pending)."""
    deadline = time.monotonic() + 10
    while True:
        ds: list[dict[str, Any]] = sc.admin.get("/admin/deployments").json()["deployments"]
        if all(d["state"] == "stopped" for d in ds) or time.monotonic() > deadline:
            return ds
        time.sleep(0.05)


def test_a_start_up_failure_is_remembered_and_backed_off(tmp_path: Path):
    settings = settings_for(
        tmp_path, restart_limit=3, request_wait_seconds=20.0, start_failure_backoff_seconds=40.0
    )
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "max-model-len"
    with running_sidecar(settings) as sc:
        router = sc.app.state.router
        assert router.config.start_failure_backoff_seconds == 40.0  # the setting reaches it
        now = [1000.0]
        router.clock = lambda: now[0]
        proxy = httpx.Client(base_url=sc.url, timeout=60)

        started = time.monotonic()
        first = proxy.post("/v1/completions", json=BODY)
        assert time.monotonic() - started < 10  # not request_wait_seconds
        assert first.status_code == 503, first.text
        error = first.json()["error"]
        assert error["code"] == "worker_failed"
        assert "max_model_len check" in error["message"]
        (d,) = _settle(sc)
        assert d["state"] == "stopped" and d["restarts"] == 0  # one launch, no restarts

        started = time.monotonic()
        second = proxy.post("/v1/completions", json=BODY)
        assert time.monotonic() - started < 0.5
        assert second.status_code == 503
        assert second.json()["error"]["code"] == "worker_failed"
        assert "max_model_len check" in second.json()["error"]["message"]
        assert 1 <= int(second.headers["retry-after"]) <= 40
        assert _launches(sc) == 1

        now[0] += 41  # the back-off has passed: a launch is tried again
        third = proxy.post("/v1/completions", json=BODY)
        assert third.status_code == 503 and "max_model_len check" in third.text
        ds = _settle(sc)
        assert len(ds) == 2 and _launches(sc) == 2
        fourth = proxy.post("/v1/completions", json=BODY)
        assert 40 < int(fourth.headers["retry-after"]) <= 80  # doubled
        assert _launches(sc) == 2
        proxy.close()


def test_an_admin_deploy_is_not_blocked_by_a_remembered_failure(tmp_path: Path):
    settings = settings_for(tmp_path)
    settings.worker_env["GATEKEEPER_SIM_FAIL"] = "max-model-len"
    with running_sidecar(settings) as sc:
        proxy = httpx.Client(base_url=sc.url, timeout=60)
        assert proxy.post("/v1/completions", json=BODY).status_code == 503
        _settle(sc)
        sc.app.state.manager.config.worker_env.pop("GATEKEEPER_SIM_FAIL")  # cause fixed
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        sc.wait_state(r.json()["deployment"]["id"], ("ready",))
        answer = proxy.post("/v1/completions", json=BODY)
        assert answer.status_code == 200, answer.text
        proxy.close()
