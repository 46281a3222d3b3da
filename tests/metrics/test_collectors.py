"""The /metrics collectors and instrumentation: private registries, get_sample_value,
and golden expositions per fixture GPU set (``pytest --update-golden`` rewrites them)."""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
import subprocess
import time
import typing
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.cached import CachedInventory
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.inventory import GpuInfo, GpuProcess, InventorySnapshot
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.metrics.events import (
    ADMISSION_REASONS,
    SidecarMetrics,
    decision_reason,
    status_reason,
)
from gatekeeper.metrics.gpus import GpuCollector, policy_margin
from gatekeeper.metrics.workers import (
    COMPONENTS,
    WORKER_STATES,
    WorkerCollector,
    WorkerView,
    actual_components,
    predicted_components,
)
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.proxy.resolver import ProxyMetrics
from gatekeeper.sidecar.deployment import State
from gatekeeper.units import GIB, MIB
from gatekeeper.vllm.log import MemoryFigures
from tests.support.golden_option import check_golden
from tests.support.metrics_fixtures import (
    GPU2_UUID,
    LLAMA,
    NODE,
    PARENTS,
    QWEN,
    FailingInventory,
    exposition,
    record_events,
    sidecar_registry,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"
H100X8 = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json")
MIG_LOST = StaticInventory.from_json(FIXTURES / "h100_mig_lost_x4.json")
MARGIN = policy_margin(PlacementPolicy())


def gpu_labels(snapshot: InventorySnapshot, index: int) -> dict[str, str]:
    """DCGM exporter's label names (and kube-state-metrics' node)."""
    g = snapshot.gpu(index)
    return {
        "gpu": str(index),
        "UUID": g.uuid,
        "modelName": g.name,
        "device": f"nvidia{index}",
        "Hostname": NODE,
        "node": NODE,
    }


def worker_labels(model: str, worker: str, gpu: int, uuid: str | None = None) -> dict[str, str]:
    uuid = H100X8.snapshot().gpu(gpu).uuid if uuid is None else uuid
    return {"model": model, "worker": worker, "gpu": str(gpu), "UUID": uuid} | {
        "Hostname": NODE,
        "node": NODE,
    }


def test_gpu_collector_reports_memory_promises_and_headroom():
    registry = CollectorRegistry()
    GpuCollector(H100X8, lambda: {GPU2_UUID: 20 * GIB}, MARGIN, node=NODE, registry=registry)
    snap = H100X8.snapshot()
    value = registry.get_sample_value
    gpu2 = snap.gpu(2)
    labels = gpu_labels(snap, 2)
    assert value("gatekeeper_gpu_memory_total_bytes", labels) == gpu2.total_bytes
    assert value("gatekeeper_gpu_memory_free_bytes", labels) == gpu2.free_bytes
    assert value("gatekeeper_gpu_memory_used_bytes", labels) == gpu2.used_bytes
    assert value("gatekeeper_gpu_memory_promised_bytes", labels) == 20 * GIB
    assert value("gatekeeper_gpu_memory_reserved_bytes", labels) == 20 * GIB  # deprecated
    margin = 512 * MIB + int(0.02 * gpu2.visible_total_bytes)
    headroom = gpu2.free_bytes - 20 * GIB - margin
    assert value("gatekeeper_gpu_headroom_bytes", labels) == headroom
    assert value("gatekeeper_gpu_memory_promised_bytes", gpu_labels(snap, 3)) == 0
    assert value("gatekeeper_gpu_healthy", labels) == 1
    assert value("gatekeeper_gpu_collect_success") == 1
    assert value("gatekeeper_gpu_collect_errors_total") == 0
    duration = value("gatekeeper_gpu_collect_duration_seconds")
    assert duration is not None and 0 <= duration < 1


def test_unhealthy_gpus_only_report_health_and_fenced_ones_have_no_headroom():
    registry = CollectorRegistry()
    GpuCollector(MIG_LOST, dict, MARGIN, node=NODE, registry=registry)
    snap = MIG_LOST.snapshot()
    value = registry.get_sample_value
    lost = gpu_labels(snap, 2)
    assert value("gatekeeper_gpu_healthy", lost) == 0
    assert value("gatekeeper_gpu_memory_total_bytes", lost) is None
    assert value("gatekeeper_gpu_headroom_bytes", lost) is None
    fenced = gpu_labels(snap, 1)
    assert value("gatekeeper_gpu_healthy", fenced) == 1
    assert value("gatekeeper_gpu_memory_free_bytes", fenced) == snap.gpu(1).free_bytes
    assert value("gatekeeper_gpu_headroom_bytes", fenced) is None
    assert value("gatekeeper_gpu_headroom_bytes", gpu_labels(snap, 3)) is not None
    assert value("gatekeeper_gpu_collect_success") == 1


@pytest.mark.parametrize(
    "inventory",
    [
        StaticInventory(
            InventorySnapshot(
                gpus=(), ok=False, error="NVML_ERROR_LIBRARY_NOT_FOUND", source="nvml"
            )
        ),
        FailingInventory(),
    ],
    ids=["failed-snapshot", "exception"],
)
def test_a_failing_inventory_still_yields_the_health_series(inventory):
    registry = CollectorRegistry()
    GpuCollector(inventory, dict, MARGIN, registry=registry)
    for scrape in (1, 2):
        values = scrape_once(registry)
        assert values[("gatekeeper_gpu_collect_success", ())] == 0
        assert values[("gatekeeper_gpu_collect_errors_total", ())] == scrape
        assert ("gatekeeper_gpu_collect_duration_seconds", ()) in values
        assert not any(name.startswith("gatekeeper_gpu_memory") for name, _ in values)
    assert "# TYPE gatekeeper_gpu_headroom_bytes gauge" in generate_latest(registry).decode()


def scrape_once(
    registry: CollectorRegistry,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape (``get_sample_value`` scrapes again at each call)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_failing_reservations_count_as_a_failed_reading_without_partial_data():
    def reserved() -> dict[str, int]:
        raise OSError("ledger is gone")

    registry = CollectorRegistry()
    GpuCollector(H100X8, reserved, MARGIN, registry=registry)
    values = scrape_once(registry)
    assert values[("gatekeeper_gpu_collect_success", ())] == 0
    assert values[("gatekeeper_gpu_collect_errors_total", ())] == 1
    assert not any(name == "gatekeeper_gpu_healthy" for name, _ in values)


def test_registering_the_collectors_reads_nothing():
    inventory = FailingInventory()
    listed = []

    def workers():
        listed.append(1)
        return [LLAMA]

    registry = CollectorRegistry()
    GpuCollector(inventory, dict, MARGIN, registry=registry)
    WorkerCollector(workers, inventory, registry=registry)
    assert inventory.calls == 0 and listed == []


def test_cached_inventory_reads_once_per_scrape():
    class Counting:
        calls = 0

        def snapshot(self):
            Counting.calls += 1
            return H100X8.snapshot()

    now = [0.0]
    cached = CachedInventory(Counting(), max_age_seconds=0.5, clock=lambda: now[0])
    cached.snapshot()
    cached.snapshot()
    assert Counting.calls == 1
    now[0] = 0.6
    cached.snapshot()
    assert Counting.calls == 2


def worker_registry(views, inventory=H100X8, parents=PARENTS) -> CollectorRegistry:
    registry = CollectorRegistry()
    WorkerCollector(
        lambda: views, inventory, parent_map=lambda: parents, node=NODE, registry=registry
    )
    return registry


def test_worker_collector_reports_predicted_and_actual_per_gpu():
    registry = worker_registry([LLAMA, QWEN])
    value = registry.get_sample_value
    base = {"model": "llama-70b", "worker": "llama-70b-1a2b3c4d"}
    for gpu in (0, 1):
        labels = worker_labels(**base, gpu=gpu)
        # NVML's usage of ranks 211 and 212, children of the worker's root pid 210.
        assert value("gatekeeper_worker_actual_bytes", labels) == 74448896000
        assert value("gatekeeper_worker_predicted_total_bytes", labels) == 70 * GIB
        for component in COMPONENTS:
            c = {**labels, "component": component}
            assert value("gatekeeper_worker_predicted_bytes", c) == LLAMA.predicted[component]
            assert value("gatekeeper_worker_actual_component_bytes", c) == LLAMA.actual[component]
    error = value("gatekeeper_worker_prediction_error_ratio", {**base, "component": "activation"})
    assert error == pytest.approx(0.25)
    total = value("gatekeeper_worker_prediction_error_ratio", {**base, "component": "total"})
    assert total == pytest.approx((2 * 74448896000 - 140 * GIB) / (140 * GIB))
    assert value("gatekeeper_worker_restarts_total", base) == 1


def test_a_loading_worker_has_predictions_but_no_actuals_yet():
    registry = worker_registry([QWEN])
    labels = worker_labels("qwen-7b", "qwen-7b-5e6f7a8b", 2)
    value = registry.get_sample_value
    assert value("gatekeeper_worker_predicted_total_bytes", labels) == 20 * GIB
    assert value("gatekeeper_worker_actual_bytes", labels) is None
    assert (
        value("gatekeeper_worker_actual_component_bytes", {**labels, "component": "weights"})
        is None
    )
    q = {"model": "qwen-7b", "worker": "qwen-7b-5e6f7a8b"}
    assert value("gatekeeper_worker_prediction_error_ratio", {**q, "component": "weights"}) is None


def test_predicted_total_defaults_to_the_sum_of_components():
    view = dataclasses.replace(QWEN, predicted_total_bytes=())
    registry = worker_registry([view])
    labels = worker_labels("qwen-7b", "qwen-7b-5e6f7a8b", 2)
    assert registry.get_sample_value("gatekeeper_worker_predicted_total_bytes", labels) == 20 * GIB


def test_workers_by_state_counts_every_state_and_drops_finished_workers():
    views = [
        LLAMA,
        QWEN,
        WorkerView(worker="a", model="m", state="failed", restarts=2),
        WorkerView(worker="b", model="m", state="stopped", restarts=1),
    ]
    registry = worker_registry(views)
    value = registry.get_sample_value
    expected = {s: 0 for s in WORKER_STATES} | {"ready": 1, "loading": 1, "failed": 1, "stopped": 1}
    for state, count in expected.items():
        assert value("gatekeeper_workers", {"state": state}) == count
    assert value("gatekeeper_worker_restarts_total", {"model": "m", "worker": "a"}) == 2
    assert value("gatekeeper_worker_restarts_total", {"model": "m", "worker": "b"}) is None
    assert 'worker="a",gpu' not in generate_latest(registry).decode()


def test_worker_states_are_the_deployment_states():
    assert typing.get_args(State) == WORKER_STATES


def test_nvml_or_listing_failures_do_not_break_the_worker_scrape():
    registry = worker_registry([LLAMA], inventory=FailingInventory())
    labels = worker_labels("llama-70b", "llama-70b-1a2b3c4d", 0, uuid="")
    assert registry.get_sample_value("gatekeeper_worker_predicted_total_bytes", labels) == 70 * GIB
    assert registry.get_sample_value("gatekeeper_worker_actual_bytes", labels) is None

    def broken():
        raise RuntimeError("deployments changed during iteration")

    registry = CollectorRegistry()
    WorkerCollector(broken, H100X8, registry=registry)
    assert registry.get_sample_value("gatekeeper_workers", {"state": "ready"}) == 0


def test_worker_memory_falls_back_to_used_deltas_without_host_pids():
    gpu = GpuInfo(
        index=0, uuid="GPU-0", name="H100", pci_bus_id="", total_bytes=80 * GIB,
        free_bytes=50 * GIB, used_bytes=30 * GIB, processes=(GpuProcess(99999, 30 * GIB),),
    )  # fmt: skip
    snap = InventorySnapshot(gpus=(gpu,), ok=True, pid_namespace_mismatch=True)
    view = dataclasses.replace(LLAMA, gpu_indices=(0,), baseline_used_bytes={0: 2 * GIB})
    registry = worker_registry([view], inventory=StaticInventory(snap))
    labels = worker_labels("llama-70b", "llama-70b-1a2b3c4d", 0, uuid="GPU-0")
    assert registry.get_sample_value("gatekeeper_worker_actual_bytes", labels) == 28 * GIB


def test_pending_bytes_are_the_promise_a_starting_worker_has_yet_to_take():
    gpu = GpuInfo(
        index=0, uuid="GPU-0", name="H100", pci_bus_id="", total_bytes=80 * GIB,
        free_bytes=50 * GIB, used_bytes=30 * GIB, processes=(GpuProcess(99999, 30 * GIB),),
    )  # fmt: skip
    snap = StaticInventory(InventorySnapshot(gpus=(gpu,), ok=True, pid_namespace_mismatch=True))
    loading = dataclasses.replace(
        LLAMA, state="loading", gpu_indices=(0,), baseline_used_bytes={0: 2 * GIB}
    )
    admitted = dataclasses.replace(QWEN, state="admitted", gpu_indices=(0,), pid=None)
    registry = worker_registry([loading, admitted], inventory=snap)
    value = registry.get_sample_value
    # 70 GiB promised, 28 GiB already taken (30 GiB used less the 2 GiB before launch).
    labels = worker_labels("llama-70b", "llama-70b-1a2b3c4d", 0, uuid="GPU-0")
    assert value("gatekeeper_worker_pending_bytes", labels) == 42 * GIB
    # No process yet: the whole promise is to come.
    labels = worker_labels("qwen-7b", "qwen-7b-5e6f7a8b", 0, uuid="GPU-0")
    assert value("gatekeeper_worker_pending_bytes", labels) == 20 * GIB
    # Ready, or over its promise: nothing pending.
    ready = worker_registry([dataclasses.replace(loading, state="ready")], inventory=snap)
    text = generate_latest(ready).decode()
    assert "gatekeeper_worker_pending_bytes{" not in text
    over = dataclasses.replace(loading, predicted_total_bytes=(20 * GIB,))
    labels = worker_labels("llama-70b", "llama-70b-1a2b3c4d", 0, uuid="GPU-0")
    assert (
        worker_registry([over], inventory=snap).get_sample_value(
            "gatekeeper_worker_pending_bytes", labels
        )
        == 0
    )


def test_pending_bytes_are_left_out_when_the_worker_s_usage_is_unknown():
    registry = worker_registry([dataclasses.replace(LLAMA, state="loading")], FailingInventory())
    assert "gatekeeper_worker_pending_bytes{" not in generate_latest(registry).decode()


LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
LLAMA70 = resolve_model("meta-llama/Llama-3.3-70B-Instruct")


def test_components_from_a_decision_and_a_log():
    d = decide(
        PlacementRequest(LLAMA8, ServeOptions(max_model_len=8192)),
        parse_declared_node("1xH100-80GB"),
    )
    predicted = predicted_components(d.to_json()["placement"]["predicted"])
    assert set(predicted) == set(COMPONENTS)
    assert predicted["activation"] == d.to_json()["placement"]["predicted"]["activation_peak_bytes"]
    figures = MemoryFigures(weights=15 * GIB, activation_peak=2 * GIB, kv_cache_tokens=1000)
    assert actual_components(figures.components()) == {"weights": 15 * GIB, "activation": 2 * GIB}


def test_admission_reasons_from_decisions_and_statuses():
    options = ServeOptions(max_model_len=8192)
    fits = decide(PlacementRequest(LLAMA8, options), parse_declared_node("1xH100-80GB"))
    too_big = decide(PlacementRequest(LLAMA70, options), parse_declared_node("1xL4"))
    lost = MIG_LOST.snapshot()
    unusable = dataclasses.replace(lost, gpus=lost.gpus[1:3])
    nothing = decide(PlacementRequest(LLAMA8, options), unusable)
    assert [decision_reason(d) for d in (fits, too_big, nothing)] == [
        "fits",
        "does_not_fit",
        "no_gpu",
    ]
    assert [status_reason(s) for s in (409, 404, 400, 507, 500)] == [
        "conflict", "not_allowed", "bad_request", "does_not_fit", "error",
    ]  # fmt: skip

    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    for outcome_reason in ADMISSION_REASONS.items():
        labels = {"outcome": outcome_reason[1], "reason": outcome_reason[0]}
        assert registry.get_sample_value("gatekeeper_admissions_total", labels) == 0
    metrics.decision(fits)
    metrics.decision(too_big)
    metrics.admission(status_reason(409))
    value = registry.get_sample_value
    assert value("gatekeeper_admissions_total", {"outcome": "admitted", "reason": "fits"}) == 1
    assert (
        value("gatekeeper_admissions_total", {"outcome": "rejected", "reason": "does_not_fit"}) == 1
    )
    assert value("gatekeeper_admissions_total", {"outcome": "rejected", "reason": "conflict"}) == 1


def test_proxy_metrics_bound_the_model_label():
    registry = CollectorRegistry()
    metrics: ProxyMetrics = SidecarMetrics(registry, known_models=lambda: {"llama"})
    metrics.observe("llama", 200, 0.5)
    metrics.observe("made-up", 404, 0.01)
    metrics.observe("also-made-up", 404, 0.01)
    value = registry.get_sample_value
    assert value("gatekeeper_proxy_requests_total", {"model": "llama", "code": "200"}) == 1
    assert value("gatekeeper_proxy_requests_total", {"model": "other", "code": "404"}) == 2
    assert value("gatekeeper_proxy_request_duration_seconds_count", {"model": "llama"}) == 1
    assert (
        value("gatekeeper_proxy_request_duration_seconds_bucket", {"model": "llama", "le": "0.5"})
        == 1
    )
    assert (
        value("gatekeeper_proxy_request_duration_seconds_bucket", {"model": "llama", "le": "0.25"})
        == 0
    )

    registry = CollectorRegistry()
    unbounded = SidecarMetrics(registry, max_models=2)
    for model in ("a", "b", "c", "a"):
        unbounded.observe(model, 200, 0.1)
    value = registry.get_sample_value
    assert value("gatekeeper_proxy_requests_total", {"model": "a", "code": "200"}) == 2
    assert value("gatekeeper_proxy_requests_total", {"model": "other", "code": "200"}) == 1


def test_a_ready_worker_observes_launch_time_and_prediction_error_once():
    registry = CollectorRegistry()
    metrics = SidecarMetrics(registry)
    metrics.worker_ready(LLAMA, 42.0)
    value = registry.get_sample_value
    assert value("gatekeeper_worker_launch_duration_seconds_count", {"model": "llama-70b"}) == 1
    assert value("gatekeeper_worker_launch_duration_seconds_sum", {"model": "llama-70b"}) == 42.0
    activation = {"component": "activation"}
    assert value("gatekeeper_prediction_error_ratio_count", activation) == 1
    # Negative buckets: no _sum (OpenMetrics), so dashboards use quantiles.
    assert value("gatekeeper_prediction_error_ratio_sum", activation) is None
    assert value("gatekeeper_prediction_error_ratio_bucket", {**activation, "le": "0.1"}) == 0
    assert value("gatekeeper_prediction_error_ratio_bucket", {**activation, "le": "0.25"}) == 1
    weights = {"component": "weights", "le": "0.0"}
    assert value("gatekeeper_prediction_error_ratio_bucket", weights) == 1
    metrics.worker_ready(QWEN)  # no log figures yet: nothing to observe
    assert value("gatekeeper_prediction_error_ratio_count", {"component": "weights"}) == 1


def test_reservations_gauge_reads_the_ledger_at_scrape_time_and_survives_errors():
    count = [3]
    registry = CollectorRegistry()
    SidecarMetrics(registry, outstanding=lambda: count[0], version="9.9")
    assert registry.get_sample_value("gatekeeper_reservations_outstanding") == 3
    count[0] = 1
    assert registry.get_sample_value("gatekeeper_reservations_outstanding") == 1
    assert registry.get_sample_value("gatekeeper_build_info", {"version": "9.9"}) == 1

    def broken() -> int:
        raise OSError("ledger closed")

    registry = CollectorRegistry()
    SidecarMetrics(registry, outstanding=broken)
    value = registry.get_sample_value("gatekeeper_reservations_outstanding")
    assert value is not None and math.isnan(value)


GOLDEN = {
    "h100_80g_x8": lambda: H100X8,
    "h100_mig_lost_x4": lambda: MIG_LOST,
    "declared_busy_node": lambda: StaticInventory(
        parse_declared_node(str(FIXTURES / "declared_busy_node.json"))
    ),
    "nvml_failed": lambda: StaticInventory(
        InventorySnapshot(gpus=(), ok=False, error="NVML_ERROR_LIBRARY_NOT_FOUND", source="nvml")
    ),
}


@pytest.mark.parametrize("fixture", sorted(GOLDEN))
def test_golden_metrics(fixture, request):
    sidecar = sidecar_registry(GOLDEN[fixture]())
    record_events(sidecar.metrics)
    check_golden(request.config, f"{fixture}.metrics", exposition(sidecar.registry))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_lints_the_exposition():
    sidecar = sidecar_registry(H100X8)
    record_events(sidecar.metrics)
    text = generate_latest(sidecar.registry)

    def lint(exposition: bytes) -> tuple[int, str]:
        result = subprocess.run(
            ["promtool", "check", "metrics"], input=exposition, capture_output=True, timeout=30
        )
        return result.returncode, (result.stdout + result.stderr).decode()

    # DCGM exporter's camelCase modelName is the one finding (kept so the series join);
    # with it renamed the exposition is clean.
    code, out = lint(text)
    findings = {line.split(" ", 1)[1] for line in out.splitlines() if line.strip()}
    assert findings == {"label names should be written in 'snake_case' not 'camelCase'"}, out
    code, out = lint(text.replace(b'modelName="', b'model_name="'))
    assert code == 0 and out.strip() == "", out


def test_scrape_cost_with_8_gpus_and_50_workers():
    """The issue's figure: median seconds to render /metrics for 8 GPUs and 50 workers."""
    views = [
        dataclasses.replace(LLAMA, worker=f"w{i}", model=f"model-{i % 10}", gpu_indices=(i % 8,), pid=210)
        for i in range(50)
    ]  # fmt: skip
    sidecar = sidecar_registry(H100X8, views)
    record_events(sidecar.metrics)
    times = []
    for _ in range(30):
        start = time.perf_counter()
        generate_latest(sidecar.registry)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"scrape of 8 GPUs and 50 workers: median {median * 1000:.2f} ms")
    assert median < 0.25
