"""A state directory that turns read-only, or whose ledger files another process touches,
under a running sidecar (#13, item 8): the sidecar answers 503 with the directory and
what to do, keeps serving, and admits again once the directory is writable; nothing of
the ledger is memory-mapped, so no such change can end it with SIGBUS. Real tmpfs and
bind mounts (root only: skipped elsewhere)."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.sidecar.test_state_dir_full import small_tmpfs
from tests.support.sidecar_harness import running_sidecar, settings_for


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` read-only for every path lookup from now on (a bind mount of it onto
    itself, remounted ``ro``); files already open keep their own mount."""
    done = subprocess.run(
        f"mount --bind {directory} {directory} && mount -o remount,bind,ro {directory}",
        shell=True,
        capture_output=True,
    )
    if done.returncode != 0:
        subprocess.run(["umount", str(directory)], check=False)
        pytest.skip(f"cannot bind-mount read-only here: {done.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_state_dir_turned_read_only_is_a_503_and_the_sidecar_goes_on(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "state", size="8m") as state:
        settings = settings_for(state)
        with running_sidecar(settings) as sc:
            with read_only(state):
                r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
                assert r.status_code == 503, r.text
                error = r.json()["error"]
                assert error["type"] == "state_unavailable", error
                assert str(state) in error["message"] and "read-only" in error["message"]
                assert sc.admin.get("/healthz").status_code == 200
                assert sc.admin.get("/admin/deployments").status_code == 200
                scraped = sc.admin.get("/metrics").text
                assert 'gatekeeper_admissions_total{outcome="error",reason="error"} 1.0' in scraped
            r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
            assert r.status_code == 201, r.text
            sc.wait_state(r.json()["deployment"]["id"], ("ready",))


WRITER = """
import os, sys
from pathlib import Path
from gatekeeper.sidecar.ledger import Ledger, Promise
path = Path(sys.argv[1])
with Ledger(path) as ledger:
    def admit(n):
        decide = lambda outstanding: (None, (Promise("GPU-0", 1 << 20),))
        ledger.admit(f"d{n}", "m", decide, ttl_seconds=600)
    admit(0)
    for suffix in ("-shm", "-wal"):
        side = Path(str(path) + suffix)
        if side.exists():
            os.truncate(side, 0)
    admit(1)
    print(len(ledger.outstanding()))
"""


def test_truncating_the_ledger_files_beside_it_cannot_kill_its_writer(tmp_path: Path) -> None:
    """What another opener (an operator's sqlite3 shell on a lock-less file system, a
    cleaner) may do to the files beside the ledger: a WAL ledger died of SIGBUS here."""
    path = ledger_path(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != -signal.SIGBUS, "the ledger's writer died of SIGBUS"
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_wal_ledger_from_an_older_gatekeeper_is_converted_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    path = ledger_path(tmp_path)
    with Ledger(path) as ledger:
        ledger.admit("none", "m", lambda outstanding: (None, ()), ttl_seconds=600)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    conn.execute(
        "INSERT INTO reservations (id, deployment_id, model, gpu_uuid, bytes, state, "
        "created_at, expires_at, payload) VALUES ('r', 'd', 'm', 'GPU-0', 1, 'pending', 0, "
        "1e12, 'null')"
    )
    conn.commit()
    conn.close()
    with Ledger(path) as ledger:
        assert [r.deployment_id for r in ledger.outstanding()] == ["d"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
