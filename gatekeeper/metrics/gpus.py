"""The collectors read at scrape time: GPU memory and health (``GpuCollector``) and the
learned calibration factors (``CalibrationCollector``); ``gatekeeper.metrics``
documents the names and their cardinality.

Per-GPU series carry DCGM exporter's label names, so that they join its series without
``label_replace``: ``gpu`` (the NVML index), ``UUID``, ``modelName``, ``device``
(``nvidia<index>``) and ``Hostname``; and ``node``, kube-state-metrics' name for the same
node. ``Hostname`` and ``node`` are the sidecar's node name (setting ``node_name``, the
host name by default).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gatekeeper.gpus.inventory import GpuInfo, GpuInventory
from gatekeeper.placement.policy import PlacementPolicy

__all__ = [
    "GPU_LABELS",
    "CalibrationCollector",
    "GpuCollector",
    "gpu_label_values",
    "policy_margin",
]

logger = logging.getLogger(__name__)


def policy_margin(policy: PlacementPolicy) -> Callable[[GpuInfo], int]:
    """The safety margin placement keeps on a GPU (``PlacementPolicy.margin_for``)."""

    def margin(gpu: GpuInfo) -> int:
        return policy.margin_for(gpu.visible_total_bytes)

    return margin


GPU_LABELS = ("gpu", "UUID", "modelName", "device", "Hostname", "node")
"""The labels of every per-GPU series: DCGM exporter's names, and kube-state-metrics'
``node``."""


def gpu_label_values(index: int, uuid: str, model_name: str, node: str) -> list[str]:
    """The values of ``GPU_LABELS`` for one GPU on node ``node``."""
    return [str(index), uuid, model_name, f"nvidia{index}", node, node]


class GpuCollector(Collector):
    """GPU memory and health, read from the inventory at scrape time.

    ``promised`` gives the bytes promised per GPU UUID to workers still starting (the
    ledger's outstanding reservations); ``node`` is the node name of the ``Hostname``
    and ``node`` labels (the host name when not given).
    """

    def __init__(
        self,
        inventory: GpuInventory,
        promised: Callable[[], Mapping[str, int]],
        margin: Callable[[GpuInfo], int],
        *,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._inventory = inventory
        self._promised = promised
        self._margin = margin
        self._node = node or socket.gethostname()
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
        promised = self._promised() if snap.gpus else {}
        for gpu in snap.gpus:
            labels = gpu_label_values(gpu.index, gpu.uuid, gpu.name, self._node)
            data["healthy"].add_metric(labels, 1.0 if gpu.healthy else 0.0)
            if not gpu.healthy:
                continue
            data["total"].add_metric(labels, gpu.total_bytes)
            data["used"].add_metric(labels, gpu.used_bytes)
            data["free"].add_metric(labels, gpu.free_bytes)
            held = promised.get(gpu.uuid, 0)
            data["promised"].add_metric(labels, held)
            data["reserved"].add_metric(labels, held)
            if gpu.placeable:
                headroom = gpu.free_bytes - held - self._margin(gpu)
                data["headroom"].add_metric(labels, headroom)
        return True


def _gpu_families() -> dict[str, GaugeMetricFamily]:
    def g(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=GPU_LABELS)

    return {
        "total": g(
            "gatekeeper_gpu_memory_total_bytes",
            "Total GPU memory, NVML's total (DCGM's FB_TOTAL, in bytes).",
        ),
        "used": g(
            "gatekeeper_gpu_memory_used_bytes",
            "GPU memory in use, NVML's used (with NVML's v2 memory info the driver's "
            "reserved memory is not in it, as in DCGM's FB_USED).",
        ),
        "free": g(
            "gatekeeper_gpu_memory_free_bytes",
            "GPU memory free, NVML's free (DCGM's FB_FREE, in bytes).",
        ),
        "promised": g(
            "gatekeeper_gpu_memory_promised_bytes",
            "Bytes gatekeeper promised to workers still starting (pending admissions); "
            "not the driver's reserved memory.",
        ),
        "reserved": g(
            "gatekeeper_gpu_memory_reserved_bytes",
            "DEPRECATED: use gatekeeper_gpu_memory_promised_bytes (same value; NVML and "
            "DCGM call the driver's own memory reserved).",
        ),
        "headroom": g(
            "gatekeeper_gpu_headroom_bytes",
            "Bytes placement could still promise: free - promised - safety margin.",
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
