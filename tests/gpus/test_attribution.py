"""Worker attribution: process trees from /proc, sums by pid, the delta fallback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gatekeeper.gpus.attribution import pid_namespace_note, tree_usage, worker_usage
from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot
from gatekeeper.gpus.proctree import (
    descendants,
    parse_ppid,
    pid_exists,
    process_tree,
    read_parent_map,
)
from gatekeeper.units import GIB
from tests.support.snapshots import busy_gpu


def _snapshot(*gpus: GpuInfo, mismatch: bool = False) -> InventorySnapshot:
    return InventorySnapshot(gpus=gpus, ok=True, pid_namespace_mismatch=mismatch)


def _fake_proc(root: Path, parents: dict[int, int], comm: str = "python3") -> Path:
    for pid, ppid in parents.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
    return root


def test_descendants_is_the_whole_tree_and_nothing_else() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20}
    assert descendants(10, parents) == {10, 11, 12, 13}
    assert descendants(13, parents) == {13}
    assert descendants(99, parents) == {99}


def test_parse_ppid_survives_odd_command_names() -> None:
    assert parse_ppid("42 (vllm (worker) 1) S 7 42 42 0") == 7
    assert parse_ppid("42 (x) S") is None
    assert parse_ppid("garbage") is None


def test_read_parent_map_from_a_fixture_proc_tree(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path / "proc", {100: 1, 101: 100, 102: 101}, comm="VLLM::Worker 0)")
    (proc / "self").mkdir()
    (proc / "103").mkdir()  # exited between listing and reading: no stat
    assert read_parent_map(proc) == {100: 1, 101: 100, 102: 101}
    assert process_tree(100, proc) == {100, 101, 102}
    assert pid_exists(101, proc) and not pid_exists(999, proc)
    assert read_parent_map(tmp_path / "absent") == {}


def test_real_proc_sees_this_process() -> None:
    parents = read_parent_map()
    assert parents[os.getpid()] == os.getppid()
    assert os.getpid() in process_tree(os.getppid())


def test_tree_usage_sums_the_tree_per_gpu_and_ignores_others() -> None:
    snapshot = _snapshot(
        busy_gpu(0, 31 * GIB, (11, 30 * GIB), (10, GIB)),
        busy_gpu(1, 40 * GIB, (12, 30 * GIB), (999, 10 * GIB)),
        busy_gpu(2, 5 * GIB, (999, 5 * GIB)),
    )
    assert tree_usage(snapshot, {10, 11, 12}) == {0: 31 * GIB, 1: 30 * GIB}
    usage = worker_usage(snapshot, {10, 11, 12})
    assert usage.method == "pid"
    assert usage.per_gpu_bytes == ((0, 31 * GIB), (1, 30 * GIB))
    assert usage.total_bytes == 61 * GIB


def test_unreported_usage_counts_zero() -> None:
    snapshot = _snapshot(busy_gpu(0, 8 * GIB, (11, None), (12, 2 * GIB)))
    assert tree_usage(snapshot, {11, 12}) == {0: 2 * GIB}


def test_pid_namespace_mismatch_falls_back_to_deltas() -> None:
    """The sidecar sees host pids 5001/5002 that are not its workers' pids 10-12."""
    snapshot = _snapshot(
        busy_gpu(0, 32 * GIB, (5001, 30 * GIB)),
        busy_gpu(1, 30 * GIB, (5002, 30 * GIB)),
        busy_gpu(2, 0),
        mismatch=True,
    )
    usage = worker_usage(
        snapshot, {10, 11, 12}, gpu_indices=[0, 1], baseline_used_bytes={0: 2 * GIB, 1: 0}
    )
    assert usage.method == "delta"
    assert usage.per_gpu_bytes == ((0, 30 * GIB), (1, 30 * GIB))
    assert "PID namespace" in usage.note


def test_unreported_usage_falls_back_to_deltas() -> None:
    snapshot = _snapshot(busy_gpu(0, 12 * GIB, (11, None)))
    usage = worker_usage(snapshot, {11}, gpu_indices=[0], baseline_used_bytes={0: 2 * GIB})
    assert (usage.method, usage.per_gpu_bytes) == ("delta", ((0, 10 * GIB),))


def test_no_match_in_the_same_namespace_is_nothing_yet() -> None:
    snapshot = _snapshot(busy_gpu(0, 12 * GIB, (999, 12 * GIB)))
    usage = worker_usage(snapshot, {10}, gpu_indices=[0], baseline_used_bytes={0: 0})
    assert (usage.method, usage.per_gpu_bytes, usage.total_bytes) == ("none", (), 0)


def test_delta_skips_unhealthy_and_unknown_gpus() -> None:
    lost = GpuInfo(1, "GPU-1", "H100", "", 0, 0, 0, healthy=False, error="lost")
    snapshot = _snapshot(busy_gpu(0, 3 * GIB), lost, mismatch=True)
    usage = worker_usage(snapshot, {10}, gpu_indices=[0, 1, 2], baseline_used_bytes={0: 4 * GIB})
    assert usage.per_gpu_bytes == ((0, 0),)


@pytest.mark.parametrize(
    ("pids", "alive", "mismatch"),
    [([], set(), False), ([1, 2], {1, 2}, False), ([1, 2, 2, 3], {1}, True)],
)
def test_pid_namespace_note(pids: list[int], alive: set[int], mismatch: bool) -> None:
    flagged, note = pid_namespace_note(pids, alive.__contains__)
    assert flagged is mismatch
    assert (note is not None) is mismatch
    if note:
        assert note.startswith("2 of 3 GPU process pids (2, 3)")
