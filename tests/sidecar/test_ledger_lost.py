"""A ledger that is lost cannot double-book (#27 item 4): moved aside before a restart,
or under a running sidecar, its rows are written back from the deployments (their
records and NVML's figure) before an admission counts on it. Real sidecars, real
simulator workers, a real SQLite file; sharing is off, so a second worker on the GPU of
the first would be a double booking."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gatekeeper.sidecar.ledger import Ledger, Promise, ledger_path
from gatekeeper.sidecar.ledger_file import LedgerLostError
from tests.support.sidecar_harness import running_sidecar, settings_for

GiB = 2**30


def _rows(state: Path) -> list[tuple[str, str, str, int]]:
    with Ledger(ledger_path(state)) as ledger:
        return [(r.deployment_id, r.state, r.gpu_uuid, r.bytes) for r in ledger.live()]


def _deploy(sc: object, name: str) -> dict[str, object]:
    r = sc.admin.post("/admin/deployments", json={"model": "tiny", "name": name})  # type: ignore[attr-defined]
    assert r.status_code == 201, r.text
    deployment: dict[str, object] = r.json()["deployment"]
    return deployment


def test_a_ledger_moved_aside_before_a_restart_is_rebuilt_from_the_adopted_workers(
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path, stop_workers_on_exit=False)
    with running_sidecar(settings) as sc:
        first = sc.wait_state(str(_deploy(sc, "first")["id"]), ("ready",))
        before = _rows(tmp_path)
    assert [(d, s) for d, s, _, _ in before] == [(first["id"], "ready")]
    # What the start-up advice for a damaged ledger says to do.
    ledger_path(tmp_path).rename(tmp_path / "reservations.sqlite3.damaged")
    with running_sidecar(settings.model_copy(update={"stop_workers_on_exit": True})) as sc:
        adopted = sc.wait_state(str(first["id"]), ("ready",))
        assert adopted["pid"] == first["pid"], "the surviving worker was adopted"
        assert _rows(tmp_path) == before, "its row (GPU and bytes) is back in the new ledger"
        second = _deploy(sc, "second")
        assert second["gpus"] != adopted["gpus"], "the second worker landed on the first's GPU"
        sc.wait_state(str(second["id"]), ("ready",))


def test_a_ledger_removed_under_a_running_sidecar_is_recreated_before_the_next_admission(
    tmp_path: Path,
) -> None:
    with running_sidecar(settings_for(tmp_path)) as sc:
        first = _deploy(sc, "first")
        sc.wait_state(str(first["id"]), ("ready",))
        ledger_path(tmp_path).unlink()
        second = _deploy(sc, "second")
        assert second["gpus"] != first["gpus"], "the lost ledger let a GPU be promised twice"
        rows = {d: (s, g) for d, s, g, _ in _rows(tmp_path)}
        assert rows[str(first["id"])][0] == "ready", rows
        assert rows[str(second["id"])][0] in ("pending", "ready"), rows
        sc.wait_state(str(second["id"]), ("ready",))
        third = sc.admin.post("/admin/deployments", json={"model": "tiny", "name": "third"})
        assert third.status_code == 507, "both GPUs are taken and the new ledger knows it"


def test_a_write_to_a_vanished_ledger_says_so_and_reopen_starts_a_new_one(
    tmp_path: Path,
) -> None:
    path = ledger_path(tmp_path)
    with Ledger(path) as ledger:
        ledger.admit("a", "m", lambda _: (None, (Promise("G0", GiB),)), ttl_seconds=60)
        assert not ledger.vanished()
        path.rename(tmp_path / "aside")
        assert ledger.vanished()
        with pytest.raises(LedgerLostError, match="removed or replaced while the sidecar ran"):
            ledger.admit("b", "m", lambda _: (None, (Promise("G0", GiB),)), ttl_seconds=60)
        ledger.reopen()
        assert not ledger.vanished() and ledger.live() == ()
        promise = (Promise("G0", GiB),)
        assert ledger.restore("a", "m", promise, ready=True, ttl_seconds=60, pid=7) == 1
        assert ledger.restore("a", "m", promise, ready=True, ttl_seconds=60) == 0
        (row,) = ledger.live()
        assert (row.state, row.bytes, row.pid, row.ready_at is not None) == ("ready", GiB, 7, True)


def test_a_ledger_removed_under_a_running_sidecar_is_recreated_by_the_liveness_round(
    tmp_path: Path,
) -> None:
    """No admission needed: the next liveness round sees the file gone and rebuilds it."""
    with running_sidecar(settings_for(tmp_path, health_interval_seconds=0.2)) as sc:
        first = sc.wait_state(str(_deploy(sc, "first")["id"]), ("ready",))
        before = _rows(tmp_path)
        ledger_path(tmp_path).unlink()
        deadline = time.monotonic() + 10
        while not (ledger_path(tmp_path).exists() and _rows(tmp_path) == before):
            assert time.monotonic() < deadline, "the running worker's row did not come back"
            time.sleep(0.05)
        assert before[0][0] == first["id"]
