"""A sidecar's whole ``/metrics`` over a fixture node, for the metrics, dashboard and
real-Prometheus tests: every collector and instrumentation object on one private
registry, with a few workers in different states."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, generate_latest

from gatekeeper.gpus.host_memory import CgroupLimit, HostMemory
from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot
from gatekeeper.metrics import (
    MetricSources,
    SidecarCollectors,
    SidecarMetrics,
    WorkerView,
    register_collectors,
)
from gatekeeper.metrics.host import HostWorkerView
from gatekeeper.units import GIB, MIB

GPU2_UUID = "GPU-00000002-aaaa-bbbb-cccc-000000000002"
NODE = "node-a"
"""The node name of the ``Hostname`` and ``node`` labels."""

# The TP=2 worker of tests/fixtures/gpus/h100_80g_x8.json: root 210, ranks 211 and 212.
PARENTS: Mapping[int, int] = {210: 1, 211: 210, 212: 210, 3456: 1}

LLAMA = WorkerView(
    worker="llama-70b-1a2b3c4d",
    model="llama-70b",
    state="ready",
    gpu_indices=(0, 1),
    predicted={
        "weights": 65 * GIB,
        "kv_cache": 3 * GIB,
        "activation": 2 * GIB,
        "non_torch": 256 * MIB,
        "cuda_graph": 512 * MIB,
    },
    predicted_total_bytes=(70 * GIB, 70 * GIB),
    actual={
        "weights": 65 * GIB,
        "kv_cache": 3 * GIB,
        "activation": round(2.5 * GIB),
        "non_torch": 256 * MIB,
        "cuda_graph": 640 * MIB,
    },
    pid=210,
    restarts=1,
    family="llama",
)
QWEN = WorkerView(
    worker="qwen-7b-5e6f7a8b",
    model="qwen-7b",
    state="loading",
    gpu_indices=(2,),
    predicted={"weights": 15 * GIB, "kv_cache": 4 * GIB, "activation": GIB},
    predicted_total_bytes=(20 * GIB,),
    pid=300,
    family="qwen2",
)
FAILED = WorkerView(worker="mistral-9c0d1e2f", model="mistral", state="failed", restarts=3)
STOPPED = WorkerView(worker="phi-3a4b5c6d", model="phi", state="stopped")
VIEWS = (LLAMA, QWEN, FAILED, STOPPED)
MODELS = frozenset(v.model for v in VIEWS)

HOST = HostMemory(
    ok=True,
    available_bytes=180 * GIB,
    total_bytes=256 * GIB,
    meminfo_available_bytes=200 * GIB,
    cgroup=CgroupLimit("/gatekeeper.slice", 2, 240 * GIB, 60 * GIB),
)
"""The fixture node's host memory: its cgroup binds (180 GiB of headroom)."""
HOST_WORKERS = (
    HostWorkerView(LLAMA.worker, LLAMA.model, 210, {"process": 2 * GIB, "kv_offload": 16 * GIB}),
    HostWorkerView(QWEN.worker, QWEN.model, 300, {"process": GIB}),
)
PSS: Mapping[int, int] = {210: GIB, 211: 8 * GIB, 212: 8 * GIB}
"""Host bytes (PSS) of the fixture's processes: the TP=2 worker's tree holds 17 GiB of the
18 GiB predicted (a healthy node: ``GatekeeperWorkerHostOverPrediction`` stays quiet)."""


def fixture_tree_bytes(pids: Iterable[int]) -> int:
    """The fixture processes' host bytes, as ``tree_host_bytes`` reads them from /proc."""
    return sum(PSS.get(pid, 0) for pid in pids)


class FailingInventory:
    """An inventory whose reading raises (a bug, not an NVML error)."""

    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self) -> InventorySnapshot:
        self.calls += 1
        raise RuntimeError("boom")


def sidecar_registry(
    inventory: GpuInventory,
    views: Iterable[WorkerView] = VIEWS,
    *,
    reserved: Mapping[str, int] | None = None,
    parents: Mapping[int, int] = PARENTS,
) -> SidecarCollectors:
    """Every collector on a private registry, wired by the sidecar's own wiring."""
    held = {GPU2_UUID: 20 * GIB} if reserved is None else dict(reserved)
    view_list = list(views)
    sources = MetricSources(
        inventory,
        promised=lambda: held,
        workers=lambda: view_list,
        outstanding=lambda: sum(1 for v in view_list if v.state == "loading"),
        known_models=lambda: MODELS,
        calibration=lambda: {("llama", "activation"): (1.2, 1), ("llama", "cuda_graph"): (1.25, 2)},
        node=NODE,
        parent_map=lambda: parents,
        version="test",
        host_memory=lambda: HOST,
        host_reserved=lambda: GIB + 20 * GIB,
        host_workers=lambda: HOST_WORKERS,
        host_tree_bytes=fixture_tree_bytes,
    )
    return register_collectors(CollectorRegistry(), sources)


def record_events(metrics: SidecarMetrics) -> None:
    """A few events, so that every event series has data."""
    metrics.admission("fits")
    metrics.admission("fits")
    metrics.admission("does_not_fit")
    metrics.observe("llama-70b", 200, 0.3)
    metrics.observe("llama-70b", 200, 1.7)
    metrics.observe("no-such-model", 404, 0.002)
    metrics.worker_ready(LLAMA, 42.0)
    metrics.sleep.slept("llama-70b")
    metrics.sleep.woke("llama-70b", 3.2)
    metrics.sleep.failed("wake", "llama-70b")


_DURATION = re.compile(r"^(gatekeeper_gpu_collect_duration_seconds) \S+$", re.MULTILINE)


def exposition(registry: CollectorRegistry) -> str:
    """The registry's text exposition without what changes from run to run (the
    ``_created`` timestamps and the collection duration)."""
    text = generate_latest(registry).decode()
    text = "".join(line for line in text.splitlines(keepends=True) if "_created" not in line)
    return _DURATION.sub(r"\1 DURATION", text)
