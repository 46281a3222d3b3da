"""The ledger's host bytes: written with each admission's rows, summed per deployment,
carried by a restore, a schema-2 file (before host memory was counted) migrated in place
with its rows promising 0 host bytes, and a worker that will sleep at level 1 promised
its weights on the host (``admission.admit`` with a ``HostBudget``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal

import pytest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.host_memory import ProcHostMemory, write_host_files
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import Decision, PlacementRequest
from gatekeeper.sidecar import admission
from gatekeeper.sidecar.host_admission import HostBudget, pending_host_bytes
from gatekeeper.sidecar.ledger import (
    SCHEMA_VERSION,
    Ledger,
    Promise,
    Reservation,
    host_promises,
    ledger_path,
)
from gatekeeper.sidecar.ledger_file import LedgerError

GiB = 1 << 30

V2_SCHEMA = (
    "CREATE TABLE reservations (id TEXT PRIMARY KEY, deployment_id TEXT NOT NULL,"
    " model TEXT NOT NULL, gpu_uuid TEXT NOT NULL, bytes INTEGER NOT NULL CHECK (bytes > 0),"
    " state TEXT NOT NULL CHECK (state IN ('pending', 'ready', 'released')),"
    " created_at REAL NOT NULL, expires_at REAL NOT NULL, released_at REAL, pid INTEGER,"
    " payload TEXT NOT NULL, ready_at REAL);"
    " CREATE INDEX reservations_by_state ON reservations (state, expires_at);"
    " CREATE INDEX reservations_by_deployment ON reservations (deployment_id);"
)
"""Version 2 as gatekeeper wrote it before #40 (no ``host_bytes``)."""


def admit(ledger: Ledger, deployment: str, promises: tuple[Promise, ...]) -> None:
    def decide(_: tuple[Reservation, ...]) -> tuple[str, tuple[Promise, ...]]:
        return "ok", promises

    ledger.admit(deployment, "m", decide, ttl_seconds=60)


def test_host_bytes_are_spread_over_the_rows_and_add_up(tmp_path: Path) -> None:
    promises = host_promises([("GPU-0", 10 * GiB), ("GPU-1", 10 * GiB)], 5 * GiB + 1)
    assert [p.host_bytes for p in promises] == [5 * GiB // 2 + 1, 5 * GiB // 2]
    with Ledger(ledger_path(tmp_path)) as ledger:
        admit(ledger, "d1", promises)
        rows = ledger.outstanding()
        assert pending_host_bytes(rows) == 5 * GiB + 1
        assert {r.gpu_uuid: r.bytes for r in rows} == {"GPU-0": 10 * GiB, "GPU-1": 10 * GiB}
        ledger.release("d1")
        assert pending_host_bytes(ledger.outstanding()) == 0


def test_restore_writes_the_host_bytes_back(tmp_path: Path) -> None:
    with Ledger(ledger_path(tmp_path)) as ledger:
        ledger.restore("d1", "m", (Promise("GPU-0", GiB, 3 * GiB),), ready=True, ttl_seconds=60)
        assert [(r.state, r.host_bytes) for r in ledger.live()] == [("ready", 3 * GiB)]


def test_negative_host_bytes_are_refused_naming_the_field(tmp_path: Path) -> None:
    with Ledger(ledger_path(tmp_path)) as ledger:
        with pytest.raises(LedgerError, match="host bytes") as info:
            admit(ledger, "d1", (Promise("GPU-0", GiB, -1),))
        assert info.value.field == "host_bytes"
        assert ledger.by_deployment("d1") == ()


def test_a_version_2_file_is_migrated_with_no_host_promises(tmp_path: Path) -> None:
    path = ledger_path(tmp_path)
    conn = sqlite3.connect(path)
    conn.executescript(V2_SCHEMA)
    conn.execute(
        "INSERT INTO reservations (id, deployment_id, model, gpu_uuid, bytes, state,"
        " created_at, expires_at, pid, payload, ready_at)"
        " VALUES ('r1', 'old', 'm', 'GPU-0', ?, 'ready', 990, 2000, 11, '{}', 995)",
        (GiB,),
    )
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    with Ledger(path) as ledger:
        assert [(r.deployment_id, r.state, r.host_bytes) for r in ledger.live()] == [
            ("old", "ready", 0)
        ]
        admit(ledger, "new", (Promise("GPU-1", GiB, 2 * GiB),))
        assert pending_host_bytes(ledger.outstanding()) == 2 * GiB
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    conn.close()


def test_a_worker_that_will_sleep_at_level_1_is_promised_its_weights_on_the_host(
    tmp_path: Path,
) -> None:
    request = PlacementRequest(
        resolve_model("meta-llama/Llama-3.1-8B-Instruct"), ServeOptions(max_model_len=8192)
    )
    snap = parse_declared_node("1xH100-80GB")
    root = write_host_files(tmp_path / "host", total_bytes=64 * GiB, available_bytes=12 * GiB)
    reading = ProcHostMemory(root).read()
    with Ledger(ledger_path(tmp_path)) as ledger:

        def admitted(deployment: str, level: Literal[0, 1, 2]) -> Decision:
            budget = HostBudget(reading, GiB, 0, sleep_level=level)
            return admission.admit(
                ledger, request, snap, deployment_id=deployment, policy=PlacementPolicy(),
                ttl_seconds=60, host=budget,
            )  # fmt: skip

        asleep = admitted("level-1", 1)  # 15 GiB of weights kept on the host while asleep
        assert not asleep.admitted and "sleeping_weights" in asleep.reasons[0]
        assert [s.options for s in asleep.suggestions] == [{"sleep_level": 2}]
        assert ledger.by_deployment("level-1") == ()
        dropped = admitted("level-2", 2)
        assert dropped.admitted and dropped.placement is not None
        host = dropped.placement.estimate.host.host_bytes
        assert pending_host_bytes(ledger.outstanding()) == host < 2 * GiB
