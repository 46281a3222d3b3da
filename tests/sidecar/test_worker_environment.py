"""What a worker inherits (#13, item 5): the sidecar's environment without a single
``GATEKEEPER_*`` setting, the admin token above all, as the worker process itself has
it (``/proc/PID/environ``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sidecar_harness import TOKEN, running_sidecar, settings_for


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if item)
    return {k.decode(): v.decode() for k, v in pairs}


def test_a_worker_gets_no_gatekeeper_setting_and_no_admin_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("GATEKEEPER_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("gatekeeper_admin_token", TOKEN)  # the settings read any case
    monkeypatch.setenv("GATEKEEPER_HUB_TIMEOUT_SECONDS", "7")
    monkeypatch.setenv("GATEKEEPER_SIM_FAIL", "crash-after-requests:1")  # not the worker's
    monkeypatch.setenv("GK_TEST_KEPT", "kept")
    with running_sidecar(settings_for(tmp_path)) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        ready = sc.wait_state(r.json()["deployment"]["id"], ("ready",))
        env = environ_of(ready["pid"])
        sc.admin.delete(f"/admin/deployments/{ready['id']}")
    leaked = {k for k in env if k.upper().startswith("GATEKEEPER_")}
    # only what the settings' worker_env and the rehearsal give the simulator
    assert leaked and all(k.startswith("GATEKEEPER_SIM_") for k in leaked), leaked
    assert "GATEKEEPER_SIM_FAIL" not in env
    assert TOKEN not in env.values()
    assert env["GK_TEST_KEPT"] == "kept"
    assert env["GATEKEEPER_SIM_STARTUP_SECONDS"] == "0.3"  # worker_env still reaches it
