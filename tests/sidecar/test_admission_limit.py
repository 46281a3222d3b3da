"""An admission has a time limit (#13, item 1): past it the caller gets 503 naming the
setting, the deployment lock is free again, and a reservation the admission's thread
writes after all is released (the thread itself cannot be interrupted)."""

from __future__ import annotations

import time
from pathlib import Path

from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import running_sidecar, settings_for


def test_an_admission_past_its_limit_is_refused_and_reserves_nothing(tmp_path: Path) -> None:
    # A limit no admission can meet: the real admission still runs (and admits) in its
    # thread after the caller was answered.
    settings = settings_for(tmp_path, admission_timeout_seconds=1e-6)
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["field"] == "admission_timeout_seconds"
        assert "nothing was reserved" in error["message"]
        deadline = time.monotonic() + 10
        with Ledger(ledger_path(tmp_path)) as ledger:
            while ledger.outstanding() or ledger.live():
                assert time.monotonic() < deadline, ledger.live()
                time.sleep(0.05)
        listed = sc.admin.get("/admin/deployments").json()
        assert all(d["state"] in ("failed", "stopped") for d in listed["deployments"]), listed
        # the lock is free: a second call is answered too (not queued behind the first)
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 503, r.text
