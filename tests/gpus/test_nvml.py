"""``NvmlInventory`` against the stand-in driver, in this process (real pynvml)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gatekeeper.errors import NvmlUnavailable
from gatekeeper.gpus.attribution import tree_usage, worker_usage
from gatekeeper.gpus.inventory import GpuProcess
from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.proctree import process_tree
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.gpus.stand_in import (
    ARGUMENT_VERSION_MISMATCH,
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    H100_RESERVED_BYTES,
    H100_TOTAL_BYTES,
    NOT_SUPPORTED,
    PYNVML_HAS_PROCESSES_V2,
    UNKNOWN,
    FakeFailure,
    FakeNvml,
    FakeProcess,
    h100,
)
from gatekeeper.units import GIB

FUNCTION_NOT_FOUND = 13
ABSENT_PID = 4_194_000  # above any pid this machine has handed out


def test_several_gpus(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(i) for i in range(4)])
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    assert snapshot.ok and snapshot.error is None and snapshot.source == "nvml"
    assert (snapshot.driver_version, snapshot.nvml_version) == ("550.54.15", "12.550.54.15")
    assert [g.index for g in snapshot.gpus] == [0, 1, 2, 3]
    assert [g.uuid for g in snapshot.gpus] == [h100(i).uuid for i in range(4)]
    assert snapshot.gpus[1].pci_bus_id == "00000000:28:00.0"
    for gpu in snapshot.gpus:
        assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.placeable
        assert gpu.total_bytes == H100_TOTAL_BYTES
        assert gpu.driver_reserved_bytes == H100_RESERVED_BYTES
        assert gpu.visible_total_bytes == lookup_gpu(gpu.name).total_bytes
        assert gpu.free_bytes == gpu.visible_total_bytes and gpu.used_bytes == 0
    assert snapshot.duration_seconds > 0
    assert not snapshot.pid_namespace_mismatch and snapshot.notes == ()


def test_busy_gpu_with_a_foreign_process(fake_nvml: FakeNvml) -> None:
    foreign = os.getppid()  # a real process in this namespace, not a worker
    fake_nvml.set(
        gpus=[h100(0, used_bytes=30 * GIB), h100(1)],
        processes=[FakeProcess(0, foreign, 30 * GIB)],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    busy = snapshot.gpu(0)
    assert busy.processes == (GpuProcess(pid=foreign, used_bytes=30 * GIB),)
    assert busy.used_bytes == 30 * GIB
    assert busy.free_bytes == lookup_gpu("H100").total_bytes - 30 * GIB
    assert snapshot.gpu(1).processes == ()
    assert not snapshot.pid_namespace_mismatch
    assert tree_usage(snapshot, {os.getpid()}) == {}


@pytest.fixture
def worker_tree(tmp_path: Path) -> Iterator[list[int]]:
    """Three real processes, parent → child → grandchild, like vLLM's API server,
    engine core and worker; yields their pids and ends them on exit."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "depth = int(sys.argv[1])\n"
        "print(os.getpid(), flush=True)\n"
        "child = subprocess.Popen([sys.executable, __file__, str(depth - 1)]) if depth > 1 else None\n"
        "sys.stdin.read()\n"
        "if child is not None:\n"
        "    child.wait()\n"
    )
    root = subprocess.Popen(
        [sys.executable, str(script), "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert root.stdout is not None and root.stdin is not None
    try:
        yield [int(root.stdout.readline()) for _ in range(3)]
    finally:
        root.stdin.close()
        root.wait(timeout=30)
        root.stdout.close()


def test_worker_tree_of_three_processes(fake_nvml: FakeNvml, worker_tree: list[int]) -> None:
    api, engine, rank = worker_tree
    foreign = os.getpid()
    fake_nvml.set(
        gpus=[h100(0, used_bytes=31 * GIB), h100(1, used_bytes=40 * GIB), h100(2)],
        processes=[
            FakeProcess(0, api, 1 * GIB),
            FakeProcess(0, engine, 30 * GIB),
            FakeProcess(1, rank, 30 * GIB),
            FakeProcess(1, foreign, 10 * GIB),
        ],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    tree = process_tree(api)
    assert tree == set(worker_tree)
    assert not snapshot.pid_namespace_mismatch
    assert tree_usage(snapshot, tree) == {0: 31 * GIB, 1: 30 * GIB}
    usage = worker_usage(snapshot, tree)
    assert (usage.method, usage.total_bytes) == ("pid", 61 * GIB)


def test_pids_from_another_namespace_are_flagged(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0, used_bytes=30 * GIB)], processes=[FakeProcess(0, ABSENT_PID, 30 * GIB)]
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    assert snapshot.pid_namespace_mismatch
    assert any(f"({ABSENT_PID})" in n and "PID namespace" in n for n in snapshot.notes)
    usage = worker_usage(snapshot, {os.getpid()}, gpu_indices=[0], baseline_used_bytes={0: 0})
    assert (usage.method, usage.per_gpu_bytes) == ("delta", ((0, 30 * GIB),))


def test_gpu_lost_between_two_snapshots(fake_nvml: FakeNvml) -> None:
    gpus = [h100(i) for i in range(3)]
    fake_nvml.set(gpus=gpus)
    with NvmlInventory() as inventory:
        before = inventory.snapshot()
        fake_nvml.set(gpus=gpus, failures=[FakeFailure(GPU_IS_LOST, gpu=1)])
        during = inventory.snapshot()
        fake_nvml.set(gpus=gpus)
        after = inventory.snapshot()
    assert all(g.placeable for g in before.gpus)
    assert during.ok and len(during.gpus) == 3
    lost = during.gpu(1)
    assert not lost.healthy and not lost.placeable
    assert lost.error == ("NVML_ERROR_GPU_IS_LOST (GPU is lost) from nvmlDeviceGetHandleByIndex_v2")
    assert (lost.total_bytes, lost.free_bytes) == (0, 0)
    assert during.gpu(0).placeable and during.gpu(2).placeable
    assert all(g.placeable for g in after.gpus)


def test_error_midway_keeps_identity_and_names_the_call(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0), h100(1)],
        failures=[FakeFailure(10, symbol="nvmlDeviceGetMemoryInfo_v2", gpu=0)],
    )
    with NvmlInventory() as inventory:
        gpu = inventory.snapshot().gpu(0)
    assert not gpu.healthy and gpu.uuid == h100(0).uuid
    assert gpu.error == "NVML_ERROR_TIMEOUT (Timeout) from nvmlDeviceGetMemoryInfo_v2"


def test_gpu_removed_from_the_count(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(0), h100(1)])
    with NvmlInventory() as inventory:
        assert len(inventory.snapshot().gpus) == 2
        fake_nvml.set(gpus=[h100(0)])
        assert [g.uuid for g in inventory.snapshot().gpus] == [h100(0).uuid]


def test_node_wide_failure_gives_a_failed_snapshot(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(0)], failures=[FakeFailure(UNKNOWN, symbol="nvmlDeviceGetCount_v2")])
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
        assert not snapshot.ok and snapshot.gpus == ()
        assert "NVML_ERROR_UNKNOWN" in (snapshot.error or "")
        fake_nvml.set(gpus=[h100(0)])
        assert inventory.snapshot().ok


def test_driver_not_loaded_then_loaded(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0)], failures=[FakeFailure(DRIVER_NOT_LOADED, symbol="nvmlInitWithFlags")]
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
        assert not snapshot.ok
        assert "NVML_ERROR_DRIVER_NOT_LOADED" in (snapshot.error or "")
        assert "--node 2xH100-80GB" in (snapshot.error or "")
        with pytest.raises(NvmlUnavailable, match="kernel driver is not loaded") as info:
            inventory.open()
        assert (info.value.field, info.value.value) == ("nvmlInit", "NVML_ERROR_DRIVER_NOT_LOADED")
        fake_nvml.set(gpus=[h100(0)])
        assert inventory.snapshot().ok
        assert fake_nvml.init_count() == 1


def test_init_once_and_shutdown_on_close(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(0)])
    inventory = NvmlInventory()
    inventory.open()
    for _ in range(3):
        assert inventory.snapshot().ok
    assert fake_nvml.init_count() == 1
    inventory.close()
    inventory.close()
    assert fake_nvml.init_count() == 0


def test_memory_info_v2_to_v1_fallback(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0, used_bytes=10 * GIB)],
        failures=[FakeFailure(ARGUMENT_VERSION_MISMATCH, symbol="nvmlDeviceGetMemoryInfo_v2")],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    gpu = snapshot.gpu(0)
    assert gpu.healthy and gpu.driver_reserved_bytes is None
    assert gpu.used_bytes == 10 * GIB + H100_RESERVED_BYTES  # v1 used includes reserved
    assert gpu.free_bytes == lookup_gpu("H100").total_bytes - 10 * GIB
    assert any("NVML_ERROR_ARGUMENT_VERSION_MISMATCH" in n for n in snapshot.notes)


@pytest.mark.skipif(not PYNVML_HAS_PROCESSES_V2, reason="nvidia-ml-py 12.x has no _v2 binding")
def test_process_list_v3_to_v2_fallback(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0, used_bytes=GIB)],
        processes=[FakeProcess(0, os.getpid(), GIB)],
        failures=[
            FakeFailure(FUNCTION_NOT_FOUND, symbol="nvmlDeviceGetComputeRunningProcesses_v3")
        ],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    gpu = snapshot.gpu(0)
    assert gpu.healthy and gpu.processes == (GpuProcess(os.getpid(), GIB),)
    assert snapshot.notes == (
        "used nvmlDeviceGetComputeRunningProcesses_v2 "
        "(nvmlDeviceGetComputeRunningProcesses_v3: NVML_ERROR_FUNCTION_NOT_FOUND)",
    )


def test_process_list_not_supported(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0)],
        failures=[
            FakeFailure(NOT_SUPPORTED, symbol=f"nvmlDeviceGetComputeRunningProcesses_{v}")
            for v in ("v3", "v2")
        ],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    assert snapshot.gpu(0).healthy and snapshot.gpu(0).processes == ()
    assert any("does not list GPU processes" in n for n in snapshot.notes)


def test_unavailable_process_usage_is_none(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(0, used_bytes=GIB)], processes=[FakeProcess(0, os.getpid(), None)])
    with NvmlInventory() as inventory:
        assert inventory.snapshot().gpu(0).processes == (GpuProcess(os.getpid(), None),)


def test_mig_gpu_is_fenced(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(
        gpus=[h100(0), h100(1, mig=True), h100(2)],
        failures=[FakeFailure(NOT_SUPPORTED, symbol="nvmlDeviceGetMigMode", gpu=2)],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    mig = snapshot.gpu(1)
    assert mig.healthy and not mig.placeable
    assert "MIG mode is enabled" in (mig.fence_reason or "")
    assert snapshot.gpu(0).placeable and snapshot.gpu(2).placeable


def test_cuda_visible_devices_by_index(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(i) for i in range(4)])
    with NvmlInventory(visible_devices="3,1") as inventory:
        snapshot = inventory.snapshot()
    assert [(g.index, g.uuid) for g in snapshot.gpus] == [(1, h100(1).uuid), (3, h100(3).uuid)]
    assert any("CUDA_VISIBLE_DEVICES='3,1'" in n for n in snapshot.notes)


def test_cuda_visible_devices_by_uuid(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(i) for i in range(4)])
    value = f"{h100(2).uuid},{h100(0).uuid[:12]}"
    with NvmlInventory(visible_devices=value) as inventory:
        snapshot = inventory.snapshot()
    assert [g.index for g in snapshot.gpus] == [0, 2]


def test_cuda_visible_devices_empty_and_wrong(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(0), h100(1)])
    with NvmlInventory(visible_devices="") as inventory:
        snapshot = inventory.snapshot()
        assert snapshot.ok and snapshot.gpus == ()
    with NvmlInventory(visible_devices="5") as inventory:
        snapshot = inventory.snapshot()
    assert not snapshot.ok
    assert "CUDA_VISIBLE_DEVICES='5' names GPU 5, but NVML sees GPUs 0, 1" in (snapshot.error or "")


def test_snapshot_of_many_gpus_is_consistent(fake_nvml: FakeNvml) -> None:
    gpus = [replace(h100(i), used_bytes=i * GIB) for i in range(8)]
    processes = [FakeProcess(i % 8, os.getpid(), GIB // 8) for i in range(50)]
    fake_nvml.set(gpus=gpus, processes=processes)
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    assert [g.used_bytes for g in snapshot.gpus] == [i * GIB for i in range(8)]
    assert sum(len(g.processes) for g in snapshot.gpus) == 50


def test_cuda_visible_devices_by_uuid_keeps_a_lost_gpu(fake_nvml: FakeNvml) -> None:
    gpus = [h100(i) for i in range(4)]
    fake_nvml.set(gpus=gpus)
    value = f"{h100(2).uuid},{h100(0).uuid}"
    with NvmlInventory(visible_devices=value) as inventory:
        assert [g.index for g in inventory.snapshot().gpus] == [0, 2]
        fake_nvml.set(gpus=gpus, failures=[FakeFailure(GPU_IS_LOST, gpu=2)])
        snapshot = inventory.snapshot()
    assert snapshot.ok and [g.index for g in snapshot.gpus] == [0, 2]
    assert snapshot.gpu(0).placeable
    assert not snapshot.gpu(2).healthy and "GPU_IS_LOST" in (snapshot.gpu(2).error or "")
    with NvmlInventory(visible_devices=value) as fresh:  # never saw GPU 2's UUID
        failed = fresh.snapshot()
    assert not failed.ok
    assert "(GPU 2 did not report a UUID" in (failed.error or "")


def test_older_bindings_without_library_mismatch_error(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-ml-py 12.x (allowed by the pin) has no NVMLLibraryMismatchError and an
    undecorated unversioned process call; the versioned calls work with both."""
    import pynvml

    monkeypatch.delattr(pynvml, "NVMLLibraryMismatchError", raising=False)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2", raising=False)
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetComputeRunningProcesses",
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
    )
    v3 = "nvmlDeviceGetComputeRunningProcesses_v3"
    fake_nvml.set(
        gpus=[h100(0, used_bytes=GIB), h100(1)],
        processes=[FakeProcess(0, os.getpid(), GIB)],
        failures=[
            FakeFailure(FUNCTION_NOT_FOUND, symbol=v3, gpu=0),
            FakeFailure(GPU_IS_LOST, symbol=v3, gpu=1),
        ],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    assert snapshot.ok
    assert snapshot.gpu(0).healthy and snapshot.gpu(0).processes == ()
    assert snapshot.notes == (
        f"the driver does not list GPU processes ({v3}: NVML_ERROR_FUNCTION_NOT_FOUND; "
        "nvmlDeviceGetComputeRunningProcesses_v2: not in these pynvml bindings)",
    )
    assert snapshot.gpu(1).error == f"NVML_ERROR_GPU_IS_LOST (GPU is lost) from {v3}"


def test_missing_python_bindings_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
        with pytest.raises(NvmlUnavailable) as info:
            inventory.open()
    assert not snapshot.ok and snapshot.gpus == ()
    assert "`pip install nvidia-ml-py`" in (snapshot.error or "")
    assert "--node 2xH100-80GB" in (snapshot.error or "")
    assert (info.value.field, info.value.value) == ("pynvml", "pynvml")


# Every NVML entry point the inventory calls, by C symbol, and whether a failure there
# with NOT_SUPPORTED or FUNCTION_NOT_FOUND is a fallback (the GPU stays healthy) and
# whether the symbol is reached at all while the newer call works.
DEVICE_CALLS = {
    "nvmlDeviceGetHandleByIndex_v2": "fatal",
    "nvmlDeviceGetUUID": "fatal",
    "nvmlDeviceGetName": "fatal",
    "nvmlDeviceGetPciInfo_v3": "fallback",
    "nvmlDeviceGetMigMode": "fallback",
    "nvmlDeviceGetMemoryInfo_v2": "fallback",
    "nvmlDeviceGetMemoryInfo": "unused",
    "nvmlDeviceGetComputeRunningProcesses_v3": "fallback",
    "nvmlDeviceGetComputeRunningProcesses_v2": "unused",
}
SYSTEM_CALLS = ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlDeviceGetCount_v2")
LIFECYCLE_CALLS = ("nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString")
CODES = {GPU_IS_LOST: "GPU_IS_LOST", UNKNOWN: "UNKNOWN", 10: "TIMEOUT"}
CODES |= {NOT_SUPPORTED: "NOT_SUPPORTED", FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND"}


def test_the_stand_in_serves_every_entry_point_the_inventory_calls(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pynvml

    looked_up: set[str] = set()
    original = pynvml._nvmlGetFunctionPointer

    def recording(name: str) -> object:
        looked_up.add(name)
        return original(name)

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", recording)
    gpus = [h100(0, used_bytes=GIB), h100(1, mig=True)]
    older = [
        FakeFailure(FUNCTION_NOT_FOUND, symbol="nvmlDeviceGetMemoryInfo_v2"),
        FakeFailure(FUNCTION_NOT_FOUND, symbol="nvmlDeviceGetComputeRunningProcesses_v3"),
    ]
    with NvmlInventory() as inventory:
        fake_nvml.set(gpus=gpus, processes=[FakeProcess(0, os.getpid(), GIB)])
        assert inventory.snapshot().ok
        fake_nvml.set(gpus=gpus, failures=older)
        assert inventory.snapshot().ok
    expected = {*DEVICE_CALLS, *SYSTEM_CALLS, *LIFECYCLE_CALLS}
    if not PYNVML_HAS_PROCESSES_V2:
        expected.remove("nvmlDeviceGetComputeRunningProcesses_v2")
    assert looked_up - {"nvmlErrorString"} == expected - {"nvmlErrorString"}
    assert all(hasattr(fake_nvml.library, name) for name in expected)


@pytest.mark.parametrize("code", sorted(CODES), ids=lambda c: CODES[c])
@pytest.mark.parametrize("symbol", sorted(DEVICE_CALLS))
def test_a_failing_device_call_affects_only_that_gpu(
    fake_nvml: FakeNvml, symbol: str, code: int
) -> None:
    fake_nvml.set(
        gpus=[h100(i) for i in range(3)],
        processes=[FakeProcess(1, os.getpid(), 0)],
        failures=[FakeFailure(code, symbol=symbol, gpu=1)],
    )
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    assert snapshot.ok and [g.index for g in snapshot.gpus] == [0, 1, 2]
    assert snapshot.gpu(0).placeable and snapshot.gpu(2).placeable
    gpu = snapshot.gpu(1)
    kind = DEVICE_CALLS[symbol]
    if kind == "unused" or (kind == "fallback" and code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND)):
        assert gpu.healthy, gpu.error
    else:
        assert not gpu.healthy and not gpu.placeable
        assert (gpu.error or "").startswith(f"NVML_ERROR_{CODES[code]} (")
        assert (gpu.error or "").endswith(f") from {symbol}")


@pytest.mark.parametrize("code", sorted(CODES), ids=lambda c: CODES[c])
@pytest.mark.parametrize("symbol", SYSTEM_CALLS)
def test_a_failing_system_call_never_raises(fake_nvml: FakeNvml, symbol: str, code: int) -> None:
    fake_nvml.set(gpus=[h100(0)], failures=[FakeFailure(code, symbol=symbol)])
    with NvmlInventory() as inventory:
        snapshot = inventory.snapshot()
    name = f"NVML_ERROR_{CODES[code]}"
    if symbol == "nvmlDeviceGetCount_v2":
        assert not snapshot.ok and snapshot.gpus == ()
        assert name in (snapshot.error or "") and "nvidia-smi" in (snapshot.error or "")
    else:
        assert snapshot.ok and snapshot.gpu(0).placeable
        assert any(n.startswith(f"{symbol} failed: {name}") for n in snapshot.notes)


def test_a_failing_shutdown_does_not_raise(fake_nvml: FakeNvml) -> None:
    fake_nvml.set(gpus=[h100(0)], failures=[FakeFailure(UNKNOWN, symbol="nvmlShutdown")])
    inventory = NvmlInventory()
    assert inventory.snapshot().ok
    inventory.close()
    fake_nvml.set(gpus=[h100(0)])
    assert fake_nvml.library.nvmlShutdown() == 0  # undo the init the failed shutdown left
