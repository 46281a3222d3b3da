"""A full state directory (#13, item 8): an undeploy whose release the ledger refuses
answers 503 with the directory to free, keeps the deployment visible as stopping, and
releases the reservation once the disk has room again. The disk is a real tmpfs of
1 MiB, really filled (root only: skipped elsewhere)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import running_sidecar, settings_for


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    return filler


def test_an_undeploy_on_a_full_disk_releases_its_reservation_once_there_is_room(
    tmp_path: Path,
) -> None:
    with small_tmpfs(tmp_path / "state") as state:
        settings = settings_for(state)
        with running_sidecar(settings) as sc:
            filler = fill(state)
            r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert "is full" in error["message"] and "move it aside" not in error["message"]
            filler.unlink()
            r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
            assert r.status_code == 201, r.text
            deployment_id = r.json()["deployment"]["id"]
            sc.wait_state(deployment_id, ("ready",))
            filler = fill(state)
            r = sc.admin.delete(f"/admin/deployments/{deployment_id}")
            if r.status_code == 200:
                pytest.skip("the ledger's write found room in its WAL on this kernel")
            assert r.status_code == 503, r.text
            assert str(state) in r.json()["error"]["message"]
            shown = sc.admin.get(f"/admin/deployments/{deployment_id}").json()
            assert shown["state"] == "stopping", shown
            with Ledger(ledger_path(state)) as ledger:
                assert [x.state for x in ledger.by_deployment(deployment_id)] == ["ready"]
            filler.unlink()
            sc.wait_state(deployment_id, ("stopped",), timeout=15)
            with Ledger(ledger_path(state)) as ledger:
                assert [x.state for x in ledger.by_deployment(deployment_id)] == ["released"]
            assert sc.admin.get("/healthz").status_code == 200
