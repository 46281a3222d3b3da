"""On a machine with an NVIDIA driver (marker ``gpu``; skipped elsewhere): the real
driver through ``gatekeeper gpus --json``, in a child process so that this process's
pynvml stays free for the stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gatekeeper.errors import UnknownGpuError
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.units import GIB, MIB

pytestmark = pytest.mark.gpu


def test_the_real_driver_gives_a_consistent_snapshot() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    result = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "gpus", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["ok"] and snapshot["source"] == "nvml" and snapshot["gpus"]
    assert snapshot["driver_version"] and snapshot["nvml_version"]
    for gpu in snapshot["gpus"]:
        assert gpu["healthy"], gpu["error"]
        assert gpu["uuid"].startswith(("GPU-", "MIG-")) and gpu["pci_bus_id"]
        reserved = gpu["driver_reserved_bytes"] or 0
        parts = reserved + gpu["used_bytes"] + gpu["free_bytes"]
        assert abs(gpu["total_bytes"] - parts) <= 64 * MIB, gpu
        try:
            product = lookup_gpu(gpu["name"])
        except UnknownGpuError:
            continue
        if gpu["driver_reserved_bytes"] is not None:  # v2: total less reserved is CUDA's
            visible = gpu["total_bytes"] - reserved
            assert abs(visible - product.total_bytes) < 0.1 * GIB, (gpu["name"], visible)
