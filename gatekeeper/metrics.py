"""gatekeeper's Prometheus metrics: the GPU collector and the sidecar's event metrics.

Names follow Prometheus' conventions: the ``gatekeeper_`` prefix, base units (bytes,
seconds), ``_total`` on counters, ``_ratio`` on ratios, and ``gatekeeper_build_info``.

- ``GpuCollector(inventory, reserved, margin)`` reads the GPUs **at scrape time**, as
  ``prometheus_client``'s ``ProcessCollector`` reads ``/proc``: per GPU (labels ``gpu``,
  ``uuid``, ``name``) total, used, free, reserved-by-gatekeeper and headroom bytes, and
  ``gatekeeper_gpu_healthy``. It always yields its own health series first
  (``gatekeeper_gpu_collect_success``, ``…_duration_seconds``, ``…_errors_total``): a
  failed snapshot, or an exception from the inventory or the reservations, never
  breaks the scrape. Headroom is ``free - reserved - margin`` (what placement could
  still promise; it can be negative), for placeable GPUs only; an unhealthy GPU has
  only ``gatekeeper_gpu_healthy 0``.
- ``WorkerCollector`` and ``WorkerView`` (``gatekeeper.worker_metrics``, re-exported
  here): predicted versus actual memory per worker.
- ``CalibrationCollector(factors)``: ``gatekeeper_calibration_factor_ratio``.
- ``SidecarMetrics(registry)`` (``gatekeeper.event_metrics``, re-exported here):
  instrumentation objects for events: admissions by outcome and reason, reservations
  outstanding, launch durations, proxied requests and their latency (it is the
  proxy's ``ProxyMetrics``), and the prediction error histogram observed once per
  worker when it becomes ready.

**Cardinality** is bounded by construction: ``gpu``/``uuid``/``name`` by the node's
GPUs; ``reason``/``outcome``/``component``/``state`` are closed sets; ``model`` on the
proxy's series is a configured model or ``other`` (a client can send any name);
``code`` is an HTTP status; ``family`` is a configured model's ``model_type``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gatekeeper.event_metrics import (
    ADMISSION_REASONS,
    OTHER_MODEL,
    AdmissionReason,
    SidecarMetrics,
    decision_reason,
    status_reason,
)
from gatekeeper.gpus import GpuInfo, GpuInventory, InventorySnapshot
from gatekeeper.placement import PlacementPolicy
from gatekeeper.worker_metrics import (
    COMPONENTS,
    WORKER_STATES,
    Component,
    WorkerCollector,
    WorkerView,
    actual_components,
    predicted_components,
)

__all__ = [
    "ADMISSION_REASONS",
    "COMPONENTS",
    "OTHER_MODEL",
    "WORKER_STATES",
    "AdmissionReason",
    "CachedInventory",
    "CalibrationCollector",
    "Component",
    "GpuCollector",
    "SidecarMetrics",
    "WorkerCollector",
    "WorkerView",
    "actual_components",
    "decision_reason",
    "policy_margin",
    "predicted_components",
    "status_reason",
]

logger = logging.getLogger(__name__)


def policy_margin(policy: PlacementPolicy) -> Callable[[GpuInfo], int]:
    """The safety margin placement keeps on a GPU (``placement.gpu_lines``' formula)."""

    def margin(gpu: GpuInfo) -> int:
        return policy.margin_bytes + int(policy.margin_fraction * gpu.visible_total_bytes)

    return margin


class CachedInventory:
    """A ``GpuInventory`` that reuses a snapshot younger than ``max_age_seconds``, so
    that the collectors of one scrape read NVML once. Exceptions pass through."""

    def __init__(
        self,
        inventory: GpuInventory,
        max_age_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inventory = inventory
        self._max_age_seconds = max_age_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, InventorySnapshot] | None = None

    def snapshot(self) -> InventorySnapshot:
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < self._max_age_seconds:
                return self._cached[1]
            snap = self._inventory.snapshot()
            self._cached = (now, snap)
            return snap


_GPU_LABELS = ["gpu", "uuid", "name"]


class GpuCollector(Collector):
    """GPU memory and health, read from the inventory at scrape time."""

    def __init__(
        self,
        inventory: GpuInventory,
        reserved: Callable[[], Mapping[str, int]],
        margin: Callable[[GpuInfo], int],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._inventory = inventory
        self._reserved = reserved
        self._margin = margin
        self._errors = 0
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterator[Metric]:
        """The families, without reading the GPUs (so registering reads nothing)."""
        yield _gauge("gatekeeper_gpu_collect_success", "", 0)
        yield _gauge("gatekeeper_gpu_collect_duration_seconds", "", 0)
        yield CounterMetricFamily("gatekeeper_gpu_collect_errors", "", value=0)
        yield from _gpu_families().values()

    def collect(self) -> Iterator[Metric]:
        start = time.perf_counter()
        data = _gpu_families()
        try:
            ok = self._fill(data)
        except Exception:
            logger.exception("GPU metrics: reading the GPUs or the reservations failed")
            data, ok = _gpu_families(), False
        with self._lock:
            self._errors += 0 if ok else 1
            errors = self._errors
        yield _gauge("gatekeeper_gpu_collect_success", "1 if the last GPU reading worked.", ok)
        yield _gauge(
            "gatekeeper_gpu_collect_duration_seconds",
            "Seconds the last GPU reading took.",
            time.perf_counter() - start,
        )
        yield CounterMetricFamily(
            "gatekeeper_gpu_collect_errors",
            "GPU readings that failed (NVML or the reservations ledger).",
            value=errors,
        )
        yield from data.values()

    def _fill(self, data: Mapping[str, GaugeMetricFamily]) -> bool:
        snap = self._inventory.snapshot()
        if not snap.ok:
            logger.warning("GPU metrics: %s", snap.error)
            return False
        reserved = self._reserved() if snap.gpus else {}
        for gpu in snap.gpus:
            labels = [str(gpu.index), gpu.uuid, gpu.name]
            data["healthy"].add_metric(labels, 1.0 if gpu.healthy else 0.0)
            if not gpu.healthy:
                continue
            data["total"].add_metric(labels, gpu.total_bytes)
            data["used"].add_metric(labels, gpu.used_bytes)
            data["free"].add_metric(labels, gpu.free_bytes)
            held = reserved.get(gpu.uuid, 0)
            data["reserved"].add_metric(labels, held)
            if gpu.placeable:
                headroom = gpu.free_bytes - held - self._margin(gpu)
                data["headroom"].add_metric(labels, headroom)
        return True


def _gpu_families() -> dict[str, GaugeMetricFamily]:
    def g(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=_GPU_LABELS)

    return {
        "total": g("gatekeeper_gpu_memory_total_bytes", "Total GPU memory (the driver's)."),
        "used": g("gatekeeper_gpu_memory_used_bytes", "GPU memory in use, NVML's figure."),
        "free": g("gatekeeper_gpu_memory_free_bytes", "GPU memory free, NVML's figure."),
        "reserved": g(
            "gatekeeper_gpu_memory_reserved_bytes",
            "Bytes gatekeeper promised to workers still starting (outstanding reservations).",
        ),
        "headroom": g(
            "gatekeeper_gpu_headroom_bytes",
            "Bytes placement could still promise: free - reserved - safety margin.",
        ),
        "healthy": g("gatekeeper_gpu_healthy", "1 if NVML answers for the GPU, 0 if not."),
    }


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=float(value))


class CalibrationCollector(Collector):
    """``gatekeeper_calibration_factor_ratio{family,component}``: the correction the
    estimator applies on the next admission (1.0 = none), and its sample count."""

    def __init__(
        self,
        factors: Callable[[], Mapping[tuple[str, str], tuple[float, int]]],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._factors = factors
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return self._families()

    def collect(self) -> Iterator[Metric]:
        try:
            current = dict(self._factors())
        except Exception:
            logger.exception("calibration metrics: reading the factors failed")
            current = {}
        return self._families(current)

    def _families(
        self, current: Mapping[tuple[str, str], tuple[float, int]] | None = None
    ) -> Iterator[Metric]:
        labels = ["family", "component"]
        factor = GaugeMetricFamily(
            "gatekeeper_calibration_factor_ratio",
            "Correction applied to predicted bytes per model family and component.",
            labels=labels,
        )
        samples = GaugeMetricFamily(
            "gatekeeper_calibration_samples",
            "Ready workers whose predicted-versus-actual pairs made the correction.",
            labels=labels,
        )
        for (family, component), (value, count) in sorted((current or {}).items()):
            factor.add_metric([family, component], value)
            samples.add_metric([family, component], count)
        yield factor
        yield samples
