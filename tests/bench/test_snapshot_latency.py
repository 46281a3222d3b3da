"""``bench/snapshot_latency.py`` runs on the stand-in and prints a median."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "bench" / "snapshot_latency.py"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to build the stand-in")
def test_prints_the_median_of_the_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    pattern = r"8 GPUs, 50 processes, 5 runs: median (\d+\.\d+) ms, p90 [\d.]+ ms"
    match = re.search(pattern, result.stdout)
    assert match is not None, result.stdout
    assert 0 < float(match[1]) < 1000
