"""The node agent's metrics (``gatekeeper agent --metrics-port``), read at scrape time.

- ``gatekeeper_agent_devices{state}``: devices in the last published slice
  (``published``) and those tainted for memory no claim books (``tainted``);
- ``gatekeeper_agent_pool_generation``: the pool's generation;
- ``gatekeeper_agent_passes_total{outcome}``: passes by outcome (created, updated,
  unchanged, kept, failed);
- ``gatekeeper_agent_orphaned_pod_info{namespace,pod,claim,device,uuid}``: 1 for each pod
  whose claim was allocated on a GPU that vanished, until the claim is deallocated (a
  restarted agent reads them back from the slice: ``accounting.VANISHED_ANNOTATION``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Protocol, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gatekeeper.cluster.accounting import Orphans
from gatekeeper.cluster.agent import Action, PassResult

__all__ = ["AgentCollector", "AgentState"]

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


class AgentCollector(Collector):
    """The agent's state as Prometheus metrics, built on each scrape."""

    def __init__(self, agent: AgentState) -> None:
        self._agent = agent

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
