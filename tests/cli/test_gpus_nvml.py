"""``gatekeeper gpus`` in a child process: the stand-in through ``LD_LIBRARY_PATH``, an
older driver's missing symbols, and a machine without NVML at all."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.gpus.stand_in import (
    H100_RESERVED_BYTES,
    PYNVML_HAS_PROCESSES_V2,
    FakeProcess,
    h100,
    subprocess_env,
    write_state,
)
from gatekeeper.units import GIB


def _gatekeeper(
    *args: str, library_dir: Path | None, state: Path | None, visible: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(library_dir, state)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state.txt"
    write_state(
        path,
        [h100(0, used_bytes=30 * GIB), h100(1), h100(2, mig=True)],
        [FakeProcess(0, 4_194_000, 30 * GIB)],
    )
    return path


def test_table(nvml_stub_lib: Path, state: Path) -> None:
    result = _gatekeeper("gpus", library_dir=nvml_stub_lib.parent, state=state)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("source: nvml, driver 550.54.15, NVML 12.550.54.15, 3 GPUs")
    assert lines[1].split() == [
        "GPU", "NAME", "TOTAL", "DRIVER", "RSVD", "USED", "FREE", "GK", "RSVD", "HEALTH", "PROCESSES"
    ]  # fmt: skip
    assert "79.65 GiB" in lines[2] and "30.00 GiB" in lines[2] and "4194000 (30.00 GiB)" in lines[2]
    assert lines[4].split()[-2:] == ["fenced", "-"]
    assert any(line.startswith("gpu 2: fenced: MIG mode is enabled") for line in lines)
    assert any("PID namespace" in line for line in lines)
    assert result.stderr == ""


def test_json(nvml_stub_lib: Path, state: Path) -> None:
    result = _gatekeeper("gpus", "--json", library_dir=nvml_stub_lib.parent, state=state)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["source"] == "nvml"
    assert data["gpus"][0]["used_bytes"] == 30 * GIB
    assert data["gpus"][0]["processes"] == [{"pid": 4_194_000, "used_bytes": 30 * GIB}]
    assert data["pid_namespace_mismatch"] is True


def test_cuda_visible_devices_in_the_environment(nvml_stub_lib: Path, state: Path) -> None:
    result = _gatekeeper(
        "gpus", "--json", library_dir=nvml_stub_lib.parent, state=state, visible=h100(1).uuid
    )
    assert result.returncode == 0, result.stderr
    assert [g["index"] for g in json.loads(result.stdout)["gpus"]] == [1]
    bad = _gatekeeper("gpus", library_dir=nvml_stub_lib.parent, state=state, visible="0,9")
    assert bad.returncode == 2  # the setting names a GPU that is not there: bad input
    assert "CUDA_VISIBLE_DEVICES='0,9' names GPU 9" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_older_driver_without_v2_memory_or_v3_processes(
    nvml_stub_old_lib: Path, state: Path
) -> None:
    result = _gatekeeper("gpus", "--json", library_dir=nvml_stub_old_lib.parent, state=state)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    busy = data["gpus"][0]
    assert busy["driver_reserved_bytes"] is None
    assert busy["used_bytes"] == 30 * GIB + H100_RESERVED_BYTES
    assert busy["free_bytes"] == lookup_gpu("H100").total_bytes - 30 * GIB
    listed = [{"pid": 4_194_000, "used_bytes": 30 * GIB}] if PYNVML_HAS_PROCESSES_V2 else []
    assert busy["processes"] == listed
    assert any(
        "memory info v2 unavailable (NVML_ERROR_FUNCTION_NOT_FOUND)" in n for n in data["notes"]
    )
    v3 = "nvmlDeviceGetComputeRunningProcesses_v3: NVML_ERROR_FUNCTION_NOT_FOUND"
    assert any(v3 in n for n in data["notes"])


def test_missing_library_is_one_clear_error(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed here, so NVML cannot be missing")
    result = _gatekeeper("gpus", library_dir=tmp_path, state=None)
    assert result.returncode == 2  # as check and plan: the gpus setting does not fit here
    assert result.stdout == ""
    assert result.stderr.startswith("gatekeeper: error: NVML is unavailable")
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in result.stderr
    assert "--node 2xH100-80GB" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    as_json = _gatekeeper("gpus", "--json", library_dir=tmp_path, state=None)
    payload = json.loads(as_json.stdout)
    assert as_json.returncode == 2 == payload["exit_code"] and as_json.stderr == ""
    assert payload["error"]["code"] == "gpus_unreadable"
    assert "NVML_ERROR_LIBRARY_NOT_FOUND" in payload["error"]["message"]
    assert payload["snapshot"]["ok"] is False


def test_declared_node_needs_no_driver(tmp_path: Path) -> None:
    result = _gatekeeper("gpus", "--node", "1xA100-40GB,1xL4", library_dir=tmp_path, state=None)
    assert result.returncode == 0, result.stderr
    assert "A100-40GB" in result.stdout and "22.05 GiB" in result.stdout


def test_bad_declared_node_exits_2_without_traceback(tmp_path: Path) -> None:
    result = _gatekeeper("gpus", "--node", "3xNOPE", library_dir=tmp_path, state=None)
    assert result.returncode == 2
    assert result.stderr.startswith("gatekeeper: error: declared node: 'NOPE' in '3xNOPE'")
    assert "Traceback" not in result.stderr
