"""``bench/gpu_check.py`` without a GPU: it says why it cannot run (exit 2), and its
comparison of NVML figures with allocations gets the verdicts right."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.gpus.stand_in import GPU_IS_LOST, FakeFailure, h100, subprocess_env, write_state
from gatekeeper.units import GIB, MIB
from tests.support.snapshots import busy_gpu

SCRIPT = Path(gpu_check.__file__)


def _run(library_dir: Path | None, state: Path | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=subprocess_env(library_dir, state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_nvml_it_exits_2_and_says_so(tmp_path: Path) -> None:
    result = _run(tmp_path, None)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpu_check: cannot run here: NVML is unavailable")
    assert "Traceback" not in result.stderr


def test_without_a_placeable_gpu_it_exits_2(nvml_stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.txt"
    write_state(state, [h100(0, mig=True), h100(1)], failures=[FakeFailure(GPU_IS_LOST, gpu=1)])
    result = _run(nvml_stub_lib.parent, state)
    assert result.returncode == 2, result.stderr
    assert "cannot run here: no placeable GPU among 2 (unhealthy or MIG)" in result.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is here")
def test_without_pytorch_it_exits_2(nvml_stub_lib: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.txt"
    write_state(state, [h100(0)])
    result = _run(nvml_stub_lib.parent, state)
    assert result.returncode == 2, result.stderr
    assert "cannot run here: PyTorch is not installed" in result.stderr


BEFORE = InventorySnapshot(gpus=(busy_gpu(0, 0), busy_gpu(1, 5 * GIB)), ok=True)
ALLOCATED = {100: 1 * GIB, 101: 2 * GIB}
TREE = frozenset({100, 101})
CONTEXT = 500 * MIB


def test_compare_by_pid_passes_when_the_figures_agree() -> None:
    during = InventorySnapshot(
        gpus=(
            busy_gpu(0, 3 * GIB + 2 * CONTEXT, (100, GIB + CONTEXT), (101, 2 * GIB + CONTEXT)),
            busy_gpu(1, 5 * GIB),
        ),
        ok=True,
    )
    result = gpu_check.compare(BEFORE, during, 0, TREE, ALLOCATED)
    assert result["attribution"] == "pid"
    assert result["overhead_bytes"] == 2 * CONTEXT
    assert all(result["checks"].values()), result["checks"]


def test_compare_by_pid_fails_when_the_tree_lands_on_anotherbusy_gpu() -> None:
    during = InventorySnapshot(
        gpus=(
            busy_gpu(0, 0),
            busy_gpu(1, 8 * GIB + CONTEXT, (100, GIB + CONTEXT), (101, 2 * GIB)),
        ),
        ok=True,
    )
    checks = gpu_check.compare(BEFORE, during, 0, TREE, ALLOCATED)["checks"]
    failed = {name for name, ok in checks.items() if not ok}
    assert failed == {"tree only on the chosen GPU", "other GPUs unchanged (+/-256 MiB)"}


def test_compare_falls_back_to_the_delta_in_another_pid_namespace() -> None:
    during = InventorySnapshot(
        gpus=(busy_gpu(0, 3 * GIB + CONTEXT, (7001, None)), busy_gpu(1, 5 * GIB)),
        ok=True,
        pid_namespace_mismatch=True,
    )
    result = gpu_check.compare(BEFORE, during, 0, TREE, ALLOCATED)
    assert result["attribution"] == "delta"
    assert result["tree_bytes"] == {0: 3 * GIB + CONTEXT}
    assert all(result["checks"].values()), result["checks"]
    short = InventorySnapshot(
        gpus=(busy_gpu(0, GIB), busy_gpu(1, 5 * GIB)), ok=True, pid_namespace_mismatch=True
    )
    checks = gpu_check.compare(BEFORE, short, 0, TREE, ALLOCATED)["checks"]
    assert checks["used delta covers the allocations"] is False


def test_pick_gpu_takes_the_placeable_gpu_with_most_free() -> None:
    assert gpu_check.pick_gpu(BEFORE, GIB).index == 0
    with pytest.raises(gpu_check.CheckError, match=r"GPU 0 has only 80\.00 GiB free"):
        gpu_check.pick_gpu(BEFORE, 78 * GIB)


def test_ready_lines_arriving_together_are_all_read() -> None:
    """Two lines in one write must not leave the second in a buffer past the deadline."""
    child = subprocess.Popen(
        [sys.executable, "-c", "print('ready 11 5\\nready 12 6', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    lines = gpu_check._line_queue(child.stdout)
    try:
        assert gpu_check._wait_ready(child, lines, 2, timeout=10) == {11: 5, 12: 6}
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    with pytest.raises(RuntimeError, match="exited early"):
        gpu_check._wait_ready(child, lines, 1, timeout=10)
