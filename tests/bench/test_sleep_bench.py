"""bench/sleep.py's audits: the rows it calls leaked, the host bytes it reads from the
ledger and the counters it carries over a killed sidecar's lives (issue 40)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.sleep import _add_counts, _leaked_rows, _promised
from gatekeeper.sidecar import Ledger
from gatekeeper.sidecar.ledger import Promise
from gatekeeper.units import GIB


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_row_is_leaked_when_its_worker_no_longer_runs(tmp_path: Path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        ledger.restore("alive", "m", (Promise("GPU-0", GIB, 2 * GIB),), ready=True,
                       ttl_seconds=60, pid=os.getpid())  # fmt: skip
        ledger.restore("dead", "m", (Promise("GPU-1", GIB, 3 * GIB),), ready=True,
                       ttl_seconds=60, pid=_dead_pid())  # fmt: skip
        ledger.restore("starting", "m", (Promise("GPU-1", GIB),), ready=False, ttl_seconds=60)
    assert _leaked_rows(path) == 1  # the dead worker's; a row without a pid is a promise
    assert _promised(path) == (2 * GIB, 5 * GIB)  # GPU-1: 1 GiB ready + 1 GiB pending


def test_counters_carry_over_the_lives_of_a_killed_sidecar():
    life = 'gatekeeper_worker_wakes_total{model="a"} 2.0\ngatekeeper_worker_wakes_total{model="b"} 1.0\n'
    first = _add_counts({}, life)
    assert first["wakes (cold starts avoided)"] == 3 and first["launches"] == 0
    assert _add_counts(first, life)["wakes (cold starts avoided)"] == 6
