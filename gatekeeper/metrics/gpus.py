"""The collectors read at scrape time: GPU memory and health (``GpuCollector``) and the
learned calibration factors (``CalibrationCollector``); ``gatekeeper.metrics``
documents the names and their cardinality."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gatekeeper.gpus.inventory import GpuInfo, GpuInventory
from gatekeeper.placement.types import PlacementPolicy

__all__ = [
    "CalibrationCollector",
    "GpuCollector",
    "policy_margin",
]

logger = logging.getLogger(__name__)


def policy_margin(policy: PlacementPolicy) -> Callable[[GpuInfo], int]:
    """The safety margin placement keeps on a GPU (``PlacementPolicy.margin_for``)."""

    def margin(gpu: GpuInfo) -> int:
        return policy.margin_for(gpu.visible_total_bytes)

    return margin


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
