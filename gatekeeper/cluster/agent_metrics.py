"""The node agent's metrics (``gatekeeper agent --metrics-port``), read at scrape time.

- ``gatekeeper_agent_devices{state}``: devices in the last published slice
  (``published``) and those tainted for memory no claim books (``tainted``);
- ``gatekeeper_agent_pool_generation``: the pool's generation;
- ``gatekeeper_agent_passes_total{outcome}``: passes by outcome (created, updated,
  unchanged, kept, failed);
- ``gatekeeper_agent_orphaned_pod_info{namespace,pod,claim,device,uuid}``: 1 for each pod
  whose claim was allocated on a GPU that vanished, until the claim is deallocated (a
  restarted agent reads them back from the slice: ``accounting.VANISHED_ANNOTATION``);
- ``gatekeeper_agent_device_tainted{device}``: 1 for a published device tainted for memory
  no claim books, else 0;
- ``gatekeeper_agent_prepares_total{outcome}``: the kubelet plugin's prepares, ``prepared``
  or ``refused`` (``PrepareCounter``, counted by the plugin).

``PodCollector`` reads, at scrape time, the GPUs, the claims and each process's pod and
exports per pod and device (``attribution``): the claim's bytes
(``gatekeeper_worker_predicted_total_bytes``), NVML's usage of the pod's processes
(``gatekeeper_worker_actual_bytes``), their difference
(``gatekeeper_pod_memory_headroom_bytes``) and per device the memory of processes in no
pod's claim (``gatekeeper_agent_foreign_memory_bytes``); ``gatekeeper_agent_pod_figures_success`` is 0
when the GPUs or the claims could not be read (then no per-pod series).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal, Protocol, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatekeeper.cluster.accounting import Orphans
from gatekeeper.cluster.agent import Action, PassResult
from gatekeeper.cluster.attribution import Attribution, attribute, pod_claims
from gatekeeper.gpus.inventory import InventorySnapshot

__all__ = ["AgentCollector", "AgentState", "PodCollector", "PrepareCounter", "PrepareOutcome"]

log = logging.getLogger("gatekeeper.cluster.agent_metrics")
PrepareOutcome = Literal["prepared", "refused"]
POD_LABELS = ["namespace", "pod", "claim", "device"]

OUTCOMES: tuple[str, ...] = (*get_args(Action), "failed")
"""A pass's actions, and ``failed`` (``NodeAgent.passes``)."""


class AgentState(Protocol):
    """What the collector reads of a ``NodeAgent``."""

    @property
    def last(self) -> PassResult | None: ...
    @property
    def passes(self) -> Counter[str]: ...
    @property
    def orphans(self) -> Orphans: ...


class PrepareCounter:
    """The kubelet plugin's prepares by outcome; the plugin calls ``count``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def count(self, outcome: PrepareOutcome) -> None:
        with self._lock:
            self._counts[outcome] += 1

    def counts(self) -> dict[str, int]:
        """Every outcome, zeros included."""
        with self._lock:
            return {o: self._counts[o] for o in get_args(PrepareOutcome)}


class AgentCollector(Collector):
    """The agent's state as Prometheus metrics, built on each scrape."""

    def __init__(self, agent: AgentState, prepares: PrepareCounter | None = None) -> None:
        self._agent = agent
        self._prepares = prepares or PrepareCounter()

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        last = agent.last
        devices = GaugeMetricFamily(
            "gatekeeper_agent_devices", "Devices in the published slice", labels=["state"]
        )
        devices.add_metric(["published"], len(last.devices) if last else 0)
        devices.add_metric(["tainted"], len(last.tainted) if last else 0)
        yield devices
        generation = GaugeMetricFamily(
            "gatekeeper_agent_pool_generation", "The published pool's generation"
        )
        generation.add_metric([], last.generation if last else 0)
        yield generation
        passes = CounterMetricFamily(
            "gatekeeper_agent_passes", "Publishing passes by outcome", labels=["outcome"]
        )
        for outcome in OUTCOMES:
            passes.add_metric([outcome], agent.passes[outcome])
        yield passes
        orphans = GaugeMetricFamily(
            "gatekeeper_agent_orphaned_pod_info",
            "Pods whose claim was allocated on a GPU that is no longer published",
            labels=["namespace", "pod", "claim", "device", "uuid"],
        )
        for allocation, uuid in agent.orphans.values():
            for pod in allocation.pods:
                labels = [allocation.namespace, pod, allocation.claim, allocation.device, uuid]
                orphans.add_metric(labels, 1)
        yield orphans
        yield from self._devices_and_prepares(last)

    def _devices_and_prepares(self, last: PassResult | None) -> Iterator[Metric]:
        """Each published device's taint, and the kubelet plugin's prepares."""
        tainted = GaugeMetricFamily(
            "gatekeeper_agent_device_tainted",
            "1 while the device is tainted for memory no claim books, else 0",
            labels=["device"],
        )
        for device in last.devices if last else ():
            tainted.add_metric([device], int(last is not None and device in last.tainted))
        yield tainted
        prepares = CounterMetricFamily(
            "gatekeeper_agent_prepares",
            "The kubelet plugin's prepares by outcome (prepared, refused)",
            labels=["outcome"],
        )
        for outcome, value in self._prepares.counts().items():
            prepares.add_metric([outcome], value)
        yield prepares


class PodCollector(Collector):
    """Per pod and device, the claim against NVML's usage; per device, foreign memory.

    ``read_gpus`` reads the GPUs, ``list_claims`` the ResourceClaims (API dicts),
    ``pod_of`` a pid's pod UID (``dra_driver.pod_uid``); ``to_bytes`` parses a quantity.
    Nothing is exported for a reading that failed."""

    def __init__(
        self,
        node_name: str,
        driver: str,
        read_gpus: Callable[[], InventorySnapshot],
        list_claims: Callable[[], Iterable[Mapping[str, Any]]],
        pod_of: Callable[[int], str | None],
        to_bytes: Callable[[str], int],
    ) -> None:
        self._node_name = node_name
        self._driver = driver
        self._read_gpus = read_gpus
        self._list_claims = list_claims
        self._pod_of = pod_of
        self._to_bytes = to_bytes

    def attribution(self) -> Attribution | None:
        """This moment's attribution; None when the GPUs or the claims cannot be read (a
        scrape never fails for it: the agent's other series still answer)."""
        snapshot = self._read_gpus()
        if not snapshot.ok:
            log.warning("per-pod figures skipped: the GPUs cannot be read: %s", snapshot.error)
            return None
        try:
            claims = list(self._list_claims())
            found = pod_claims(claims, self._driver, self._node_name, self._to_bytes)
        except Exception as e:  # the apiserver, the network, a claim that does not parse
            log.warning("per-pod figures skipped: the claims cannot be read: %s", e)
            return None
        return attribute(snapshot.gpus, found, self._pod_of)

    def collect(self) -> Iterator[Metric]:
        figures = self.attribution()
        predicted = GaugeMetricFamily(
            "gatekeeper_worker_predicted_total_bytes",
            "Predicted NVML bytes on the GPU (the admission's promise; per pod: its claim)",
            labels=POD_LABELS,
        )
        actual = GaugeMetricFamily(
            "gatekeeper_worker_actual_bytes",
            "NVML's usage of the worker's processes (per pod: those in the pod's cgroup)",
            labels=POD_LABELS,
        )
        headroom = GaugeMetricFamily(
            "gatekeeper_pod_memory_headroom_bytes",
            "The pod's claim on the device less its processes' NVML usage there",
            labels=POD_LABELS,
        )
        foreign = GaugeMetricFamily(
            "gatekeeper_agent_foreign_memory_bytes",
            "NVML usage of processes on the device that no pod's claim there accounts for",
            labels=["device"],
        )
        for pod in figures.pods if figures else ():
            c = pod.claim
            labels = [c.namespace, c.pod, c.claim, c.device]
            predicted.add_metric(labels, c.claimed_bytes)
            actual.add_metric(labels, pod.used_bytes)
            headroom.add_metric(labels, pod.headroom_bytes)
        for device, value in (figures.foreign_bytes if figures else {}).items():
            foreign.add_metric([device], value)
        success = GaugeMetricFamily(
            "gatekeeper_agent_pod_figures_success",
            "1 when this scrape read the GPUs and the claims for the per-pod figures, else 0",
        )
        success.add_metric([], 1 if figures else 0)
        yield from (predicted, actual, headroom, foreign, success)
