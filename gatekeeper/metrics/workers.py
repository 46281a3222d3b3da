"""Per-worker memory metrics, read at scrape time: predicted versus actual.

``WorkerCollector(workers, inventory)`` yields, for each live deployment (labels
``model``, ``worker``, ``gpu``, and DCGM exporter's ``UUID`` and ``Hostname`` with
kube-state-metrics' ``node``, as on the GPU series): the predicted bytes per component
(``component`` = weights, kv_cache, activation, non_torch, cuda_graph) and in total, the
actual bytes NVML reports over the worker's process tree (vLLM's engine core and TP
ranks are child processes), the actual components from the start-up log, the bytes of
its promise a worker still starting has yet to take (``pending``), the current
prediction error per component, the restarts; and ``gatekeeper_workers{state}`` for
every state.

The sidecar describes each deployment with a ``WorkerView`` so that this module does
not depend on the deployment manager. Per-rank figures (predicted and log components)
are repeated on each of the worker's GPUs.

**Cardinality.** ``model``: served names, i.e. the configured models. ``worker``: the
deployment id, only while the deployment is live (admitted … stopping); a stopped or
failed worker's series go (a failed one keeps its restarts counter). ``gpu``: the
worker's GPUs. ``component``: five (plus ``total`` for the error). ``state``: seven.
About 20 series per single-GPU worker.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gatekeeper.estimator.components import COMPONENTS, ComponentName, by_field, by_log_key
from gatekeeper.gpus.attribution import worker_usage
from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot
from gatekeeper.gpus.proctree import descendants, read_parent_map
from gatekeeper.metrics.worker_states import PENDING_STATES as _PENDING_STATES
from gatekeeper.metrics.worker_states import RESERVING_STATES, WORKER_STATES

__all__ = [
    "COMPONENTS",
    "WORKER_STATES",
    "Component",
    "WorkerCollector",
    "WorkerView",
    "actual_components",
    "predicted_components",
]

logger = logging.getLogger(__name__)

Component = ComponentName
"""A ``component`` label's value: ``gatekeeper.estimator.components``' names, which
dashboards and alert rules select on."""

_LIVE_STATES = RESERVING_STATES | {"stopping"}
"""States whose worker may still hold GPU memory (``WORKER_STATES`` is the ``state``
label of ``gatekeeper_workers``)."""


def predicted_components(predicted: Mapping[str, Any]) -> dict[Component, int]:
    """A decision's ``placement.predicted`` (``weights_bytes`` …) keyed by component."""
    return by_field(predicted)


def actual_components(actual: Mapping[str, int]) -> dict[Component, int]:
    """``MemoryFigures.components()`` (``activation_peak`` …) keyed by component."""
    return by_log_key(actual)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the collectors need to know about one deployment (filled by the sidecar)."""

    worker: str
    """The deployment id (label ``worker``)."""
    model: str
    """The served model name (label ``model``): one of the configured models."""
    state: str
    """One of ``WORKER_STATES``."""
    gpu_indices: tuple[int, ...] = ()
    predicted: Mapping[Component, int] = field(default_factory=dict)
    """Predicted bytes per component on each of the worker's GPUs (per rank)."""
    predicted_total_bytes: tuple[int, ...] = ()
    """Predicted NVML bytes per GPU, in ``gpu_indices`` order (the placement's promise);
    empty means the sum of ``predicted``."""
    actual: Mapping[Component, int] = field(default_factory=dict)
    """Per-rank bytes the worker's start-up log reported (empty until it says)."""
    pid: int | None = None
    """The root of the worker's process tree."""
    restarts: int = 0
    family: str = ""
    """The model family (``ModelSpec.model_type``), for calibration."""
    applied_factors: Mapping[str, float] = field(default_factory=dict)
    """Calibration factors the prediction already includes (1.0 where absent)."""
    baseline_used_bytes: Mapping[int, int] | None = None
    """Used bytes per GPU index before launch, for attribution without host pids."""

    def predicted_total(self, position: int) -> int:
        if position < len(self.predicted_total_bytes):
            return self.predicted_total_bytes[position]
        return sum(self.predicted.values())


_WORKER_LABELS = ("model", "worker", "gpu", "UUID", "Hostname", "node")


class WorkerCollector(Collector):
    """Per-worker predicted and actual memory, read at scrape time.

    ``workers`` lists the deployments; ``inventory`` gives NVML's per-process usage
    (share a ``CachedInventory`` with ``GpuCollector``); ``parent_map`` maps every pid
    to its parent (``/proc`` once per scrape); ``node`` is the node name of the
    ``Hostname`` and ``node`` labels (the host name when not given).
    """

    def __init__(
        self,
        workers: Callable[[], Iterable[WorkerView]],
        inventory: GpuInventory,
        *,
        parent_map: Callable[[], Mapping[int, int]] = read_parent_map,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._workers = workers
        self._inventory = inventory
        self._parent_map = parent_map
        self._node = node or socket.gethostname()
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterator[Metric]:
        """The families, without listing workers (so registering reads nothing)."""
        yield from _worker_families().all()

    def collect(self) -> Iterator[Metric]:
        try:
            views = list(self._workers())
        except Exception:
            logger.exception("worker metrics: listing the deployments failed")
            views = []
        live = [v for v in views if v.state in _LIVE_STATES]
        snap = self._snapshot() if live else None
        usage = self._usage(live, snap)
        uuids = {g.index: g.uuid for g in snap.gpus} if snap is not None else {}
        f = _worker_families()
        for v in live:
            labels = [[v.model, v.worker, str(i), uuids.get(i, ""), self._node, self._node]
                      for i in v.gpu_indices]  # fmt: skip
            _fill_worker(f, v, labels, usage.get(v.worker), v.worker in usage or v.pid is None)
        for v in views:
            if v.state != "stopped":
                f.restarts.add_metric([v.model, v.worker], v.restarts)
        counts: dict[str, int] = dict.fromkeys(WORKER_STATES, 0)
        for v in views:
            counts[v.state] = counts.get(v.state, 0) + 1
        for state in WORKER_STATES:
            f.workers.add_metric([state], counts[state])
        yield from f.all()

    def _snapshot(self) -> InventorySnapshot | None:
        """NVML's reading, or None when it fails."""
        try:
            snap = self._inventory.snapshot()
        except Exception:
            logger.exception("worker metrics: reading NVML failed")
            return None
        return snap if snap.ok else None

    def _usage(
        self, views: Collection[WorkerView], snap: InventorySnapshot | None
    ) -> dict[str, dict[int, int]]:
        """NVML bytes per GPU index for each worker with a pid; {} when NVML fails."""
        with_pid = [v for v in views if v.pid is not None]
        if not with_pid or snap is None:
            return {}
        try:
            parents = self._parent_map()
        except Exception:
            logger.exception("worker metrics: reading /proc failed")
            return {}
        out: dict[str, dict[int, int]] = {}
        for v in with_pid:
            assert v.pid is not None
            u = worker_usage(
                snap,
                descendants(v.pid, parents),
                gpu_indices=v.gpu_indices,
                baseline_used_bytes=v.baseline_used_bytes,
            )
            if u.method != "none":
                out[v.worker] = dict(u.per_gpu_bytes)
        return out


@dataclass(slots=True)
class _WorkerFamilies:
    predicted: GaugeMetricFamily
    predicted_total: GaugeMetricFamily
    actual: GaugeMetricFamily
    actual_component: GaugeMetricFamily
    pending: GaugeMetricFamily
    error: GaugeMetricFamily
    restarts: CounterMetricFamily
    workers: GaugeMetricFamily

    def all(self) -> tuple[Metric, ...]:
        return (
            self.predicted,
            self.predicted_total,
            self.actual,
            self.actual_component,
            self.pending,
            self.error,
            self.restarts,
            self.workers,
        )


def _worker_families() -> _WorkerFamilies:
    comp = [*_WORKER_LABELS, "component"]
    labels = list(_WORKER_LABELS)
    return _WorkerFamilies(
        predicted=GaugeMetricFamily(
            "gatekeeper_worker_predicted_bytes",
            "Predicted bytes per component on each of the worker's GPUs (per rank).",
            labels=comp,
        ),
        predicted_total=GaugeMetricFamily(
            "gatekeeper_worker_predicted_total_bytes",
            "Predicted NVML bytes of the worker on the GPU (the admission's promise).",
            labels=labels,
        ),
        actual=GaugeMetricFamily(
            "gatekeeper_worker_actual_bytes",
            "Bytes NVML reports for the worker's process tree on the GPU.",
            labels=labels,
        ),
        actual_component=GaugeMetricFamily(
            "gatekeeper_worker_actual_component_bytes",
            "Bytes per component the worker's start-up log reported (per rank).",
            labels=comp,
        ),
        pending=GaugeMetricFamily(
            "gatekeeper_worker_pending_bytes",
            "Bytes of its promise a worker still starting has yet to take on the GPU: the "
            "promise less what NVML already reports for it, at least 0.",
            labels=labels,
        ),
        error=GaugeMetricFamily(
            "gatekeeper_worker_prediction_error_ratio",
            "Current (actual - predicted) / predicted per component; total is NVML's "
            "figure over all the worker's GPUs against the predicted total.",
            labels=["model", "worker", "component"],
        ),
        restarts=CounterMetricFamily(
            "gatekeeper_worker_restarts",
            "Times the worker was restarted after it failed or exited.",
            labels=["model", "worker"],
        ),
        workers=GaugeMetricFamily(
            "gatekeeper_workers", "Deployments in each state.", labels=["state"]
        ),
    )


def _fill_worker(
    f: _WorkerFamilies,
    v: WorkerView,
    per_gpu_labels: list[list[str]],
    nvml: Mapping[int, int] | None,
    usage_known: bool,
) -> None:
    """One worker's series; ``per_gpu_labels`` in ``gpu_indices`` order. A pending
    worker's ``pending`` is exported only where its usage is known (a worker without a
    process yet uses nothing)."""
    for position, (index, labels) in enumerate(zip(v.gpu_indices, per_gpu_labels, strict=True)):
        for component in COMPONENTS:
            if component in v.predicted:
                f.predicted.add_metric([*labels, component], v.predicted[component])
            if component in v.actual:
                f.actual_component.add_metric([*labels, component], v.actual[component])
        f.predicted_total.add_metric(labels, v.predicted_total(position))
        if nvml is not None:
            f.actual.add_metric(labels, nvml.get(index, 0))
        if v.state in _PENDING_STATES and usage_known:
            used = (nvml or {}).get(index, 0)
            f.pending.add_metric(labels, max(0, v.predicted_total(position) - used))
    for component in COMPONENTS:
        predicted = v.predicted.get(component)
        actual = v.actual.get(component)
        if predicted and actual is not None:
            f.error.add_metric([v.model, v.worker, component], (actual - predicted) / predicted)
    predicted_total = sum(v.predicted_total(p) for p in range(len(v.gpu_indices)))
    if nvml and predicted_total > 0:
        error = (sum(nvml.values()) - predicted_total) / predicted_total
        f.error.add_metric([v.model, v.worker, "total"], error)
