"""Host memory metrics, read at scrape time: the node's and each worker's, predicted
versus actual.

``HostCollector(reading, reserved, workers)`` yields, for the node (labels
``Hostname`` and ``node``, as on the GPU series): whether the host memory could be read
(``gatekeeper_host_read_success``, always emitted), the available bytes admission counts
(min of ``MemAvailable`` and the memory cgroup's headroom), ``MemTotal``, the cgroup's
limit when one binds, the predicted and actual bytes of all live workers together, and
the headroom a new deployment has (available less the margin and what is promised to
workers and not yet taken by them: what admission counts). Per live worker (labels
``model``, ``worker``, ``Hostname``, ``node``): the predicted host bytes (and by ``part``:
process, cpu_offload, kv_offload, swap_space, sleeping_weights), the actual bytes (PSS
summed over its process tree, ``gatekeeper.gpus.host_usage``) and its headroom
(predicted less actual; below 0 the worker uses more than it was admitted for, which
``GatekeeperWorkerHostOverPrediction`` alerts on).

**Cardinality.** One ``worker`` per live deployment, five ``part`` values; about 8
series per worker and 7 for the node.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gatekeeper.gpus.host_memory import HostMemory
from gatekeeper.gpus.host_usage import tree_host_bytes
from gatekeeper.gpus.proctree import descendants, read_parent_map

__all__ = ["HOST_PARTS", "HostCollector", "HostWorkerView"]

logger = logging.getLogger(__name__)

HOST_PARTS = ("process", "cpu_offload", "kv_offload", "swap_space", "sleeping_weights")
"""The ``part`` label: ``gatekeeper.estimator.host.HostEstimate``'s parts."""


@dataclass(frozen=True, slots=True)
class HostWorkerView:
    """What the host collector needs of one live deployment (filled by the sidecar)."""

    worker: str
    model: str
    pid: int | None = None
    parts: Mapping[str, int] = field(default_factory=dict)
    """Predicted host bytes by ``HOST_PARTS`` name (the estimate's ``host`` JSON, whose
    keys end in ``_bytes``, is read by ``from_json``)."""

    @property
    def predicted_bytes(self) -> int:
        return sum(self.parts.values())

    @classmethod
    def from_json(
        cls, worker: str, model: str, pid: int | None, host: Mapping[str, object]
    ) -> HostWorkerView:
        parts = {
            name: value
            for name in HOST_PARTS
            if isinstance(value := host.get(f"{name}_bytes"), int) and not isinstance(value, bool)
        }
        return cls(worker, model, pid, parts)


class HostCollector(Collector):
    """The node's and the workers' host memory, read at scrape time.

    ``reading`` reads the node (``ProcHostMemory.read``); ``reserved`` gives the bytes
    admission counts against the available memory (margin, promises not yet taken);
    ``workers`` lists the live deployments; ``parent_map`` maps every pid to its parent
    and ``tree_bytes`` reads a process tree's host bytes (``/proc``, once per scrape).
    """

    def __init__(
        self,
        reading: Callable[[], HostMemory],
        reserved: Callable[[], int],
        workers: Callable[[], Iterable[HostWorkerView]],
        *,
        parent_map: Callable[[], Mapping[int, int]] = read_parent_map,
        tree_bytes: Callable[[Iterable[int]], int] = tree_host_bytes,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._reading = reading
        self._reserved = reserved
        self._workers = workers
        self._parent_map = parent_map
        self._tree_bytes = tree_bytes
        self._node = node or socket.gethostname()
        if registry is not None:
            registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield from _families().values()

    def collect(self) -> Iterator[Metric]:
        f = _families()
        node = [self._node, self._node]
        reading = self._read()
        f["read"].add_metric(node, 1.0 if reading.ok else 0.0)
        views = self._views()
        actual = self._actual(views)
        for v in views:
            labels = [v.model, v.worker, *node]
            f["worker_predicted"].add_metric(labels, v.predicted_bytes)
            for part, value in v.parts.items():
                f["worker_part"].add_metric([*labels, part], value)
            if v.worker in actual:
                f["worker_actual"].add_metric(labels, actual[v.worker])
                f["worker_headroom"].add_metric(labels, v.predicted_bytes - actual[v.worker])
        f["predicted"].add_metric(node, sum(v.predicted_bytes for v in views))
        f["actual"].add_metric(node, sum(actual.values()))
        if reading.ok:
            f["available"].add_metric(node, reading.available_bytes)
            f["total"].add_metric(node, reading.total_bytes)
            if reading.cgroup is not None:
                f["limit"].add_metric(node, reading.cgroup.limit_bytes)
            headroom = self._headroom(reading)
            if headroom is not None:
                f["headroom"].add_metric(node, headroom)
        yield from f.values()

    def _read(self) -> HostMemory:
        try:
            return self._reading()
        except Exception as e:
            logger.exception("host metrics: reading host memory failed")
            return HostMemory(ok=False, error=str(e))

    def _views(self) -> list[HostWorkerView]:
        try:
            return list(self._workers())
        except Exception:
            logger.exception("host metrics: listing the deployments failed")
            return []

    def _headroom(self, reading: HostMemory) -> int | None:
        try:
            return reading.available_bytes - self._reserved()
        except Exception:
            logger.exception("host metrics: reading the ledger's host promises failed")
            return None

    def _actual(self, views: list[HostWorkerView]) -> dict[str, int]:
        with_pid = [v for v in views if v.pid is not None]
        if not with_pid:
            return {}
        try:
            parents = self._parent_map()
        except Exception:
            logger.exception("host metrics: reading /proc failed")
            return {}
        return {
            v.worker: self._tree_bytes(descendants(v.pid, parents))
            for v in with_pid
            if v.pid is not None and v.pid in parents
        }


def _families() -> dict[str, GaugeMetricFamily]:
    node = ["Hostname", "node"]
    worker = ["model", "worker", *node]
    g = GaugeMetricFamily
    return {
        "read": g(
            "gatekeeper_host_read_success",
            "1 when the node's host memory could be read (/proc/meminfo and the memory "
            "cgroup), else 0: admission then refuses every deployment.",
            labels=node,
        ),
        "available": g(
            "gatekeeper_host_available_bytes",
            "Host memory available: min(MemAvailable, the memory cgroup's limit less its "
            "working set).",
            labels=node,
        ),
        "total": g("gatekeeper_host_total_bytes", "MemTotal of the node.", labels=node),
        "limit": g(
            "gatekeeper_host_cgroup_limit_bytes",
            "The limit of the memory cgroup level that binds the sidecar most tightly.",
            labels=node,
        ),
        "predicted": g(
            "gatekeeper_host_predicted_bytes",
            "Predicted host bytes of all live workers together.",
            labels=node,
        ),
        "actual": g(
            "gatekeeper_host_actual_bytes",
            "Host bytes (PSS) of all live workers' process trees together.",
            labels=node,
        ),
        "headroom": g(
            "gatekeeper_host_headroom_bytes",
            "Host bytes a new deployment could be admitted with: available less the margin, "
            "the host promises of starting workers and what running workers have yet to take.",
            labels=node,
        ),
        "worker_predicted": g(
            "gatekeeper_host_worker_predicted_bytes",
            "Predicted host bytes of the worker (all its processes).",
            labels=worker,
        ),
        "worker_part": g(
            "gatekeeper_host_worker_predicted_part_bytes",
            "Predicted host bytes of the worker by part (process, cpu_offload, kv_offload, "
            "swap_space, sleeping_weights).",
            labels=[*worker, "part"],
        ),
        "worker_actual": g(
            "gatekeeper_host_worker_actual_bytes",
            "Host bytes (PSS) of the worker's process tree.",
            labels=worker,
        ),
        "worker_headroom": g(
            "gatekeeper_host_worker_headroom_bytes",
            "The worker's predicted host bytes less its actual ones; below 0 it uses more "
            "than it was admitted for.",
            labels=worker,
        ),
    }
