"""The node agent's metrics (``gatekeeper agent --metrics-port``), read at scrape time.

- ``gatekeeper_agent_devices{state}``: devices in the last published slice
  (``published``), those tainted for memory no claim books (``tainted``) and those whose
  GPU another DRA driver also publishes on the node (``shared``);
- ``gatekeeper_agent_pool_generation``: the pool's generation;
- ``gatekeeper_agent_passes_total{outcome}``: passes by outcome (created, updated,
  unchanged, kept, failed);
- ``gatekeeper_agent_orphaned_pod_info{namespace,pod,claim,device,uuid}``: 1 for each pod
  whose claim was allocated on a GPU that vanished, until the claim is deallocated (a
  restarted agent reads them back from the slice: ``accounting.VANISHED_ANNOTATION``);
- ``gatekeeper_agent_unclaimed_gpu_pods``: the node's pods that hold GPUs through
  ``nvidia.com/gpu`` in no gatekeeper claim (``unclaimed``), as the last pass listed them;
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
when the GPUs or the claims could not be read (then no per-pod series). With ``read_pod``,
it also exports per pod, device and component the bytes the mutating webhook sized the rank
by (``gatekeeper_worker_predicted_bytes{component}``: the pod's ``vllm-gatekeeper.io/claim``
record, ``claim_annotation``), for pods whose record has them; each pod is read once per UID
(``PodComponents``: a running pod's annotations do not change). The agent passes its
``ClaimsWatch`` as ``list_claims``: a scrape reads the watched claims and lists nothing.
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
from gatekeeper.cluster.attribution import Attribution, PodClaim, attribute, pod_claims
from gatekeeper.cluster.claim_annotation import claim_components
from gatekeeper.cluster.unclaimed import UnclaimedPod
from gatekeeper.estimator.components import ComponentName
from gatekeeper.gpus.inventory import InventorySnapshot

__all__ = [
    "AgentCollector",
    "AgentState",
    "PodCollector",
    "PodComponents",
    "PrepareCounter",
    "PrepareOutcome",
]

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
    @property
    def unclaimed(self) -> tuple[UnclaimedPod, ...]: ...


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
        devices.add_metric(["shared"], len(last.shared) if last else 0)
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
        unclaimed = GaugeMetricFamily(
            "gatekeeper_agent_unclaimed_gpu_pods",
            "Pods on the node that hold GPUs through nvidia.com/gpu in no gatekeeper claim",
        )
        unclaimed.add_metric([], len(agent.unclaimed))
        yield unclaimed
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


class PodComponents:
    """Per (pod, claim), the components recorded on the pod (``claim_components``), each
    pod read once per UID through ``read_pod(namespace, name)``. The reads run outside the
    lock (a slow apiserver holds up no other scrape) and stop at the first that fails:
    the others are left to the next scrape, so an unreachable apiserver costs a scrape one
    timeout, not one per pod. A pod read under another UID (made again under that name)
    has none; pods no longer in a claim are forgotten."""

    def __init__(self, read_pod: Callable[[str, str], Mapping[str, Any]]) -> None:
        self._read_pod = read_pod
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str], dict[ComponentName, int]] = {}

    def of(self, claims: Iterable[PodClaim]) -> dict[tuple[str, str], dict[ComponentName, int]]:
        """(pod UID, claim) -> components, for ``claims`` (empty where none is recorded)."""
        wanted = {(c.pod_uid, c.claim): c for c in claims}
        with self._lock:
            self._found = {k: v for k, v in self._found.items() if k in wanted}
            unread = {c.pod_uid: c for k, c in wanted.items() if k not in self._found}
        pods = self._read_all(unread.values())
        with self._lock:
            for key, c in wanted.items():
                pod = pods.get(c.pod_uid)
                if key not in self._found and pod is not None:
                    self._found[key] = claim_components(pod, c.claim) if pod else {}
            return {k: v for k, v in self._found.items() if k in wanted}

    def _read_all(self, claims: Iterable[PodClaim]) -> dict[str, Mapping[str, Any]]:
        """Each claim's pod by UID, until a read fails (the rest wait for the next scrape)."""
        pods: dict[str, Mapping[str, Any]] = {}
        for c in claims:
            pod = self._read(c)
            if pod is None:
                break
            pods[c.pod_uid] = pod
        return pods

    def _read(self, c: PodClaim) -> Mapping[str, Any] | None:
        """The pod of ``c``; {} when that name now holds another pod; None when unread."""
        try:
            pod = self._read_pod(c.namespace, c.pod)
        except Exception as e:  # the apiserver, the network: no components this scrape
            log.warning(
                "pod %s/%s not read for its components (pods not yet read wait for the next "
                "scrape): %s",
                c.namespace,
                c.pod,
                e,
            )
            return None
        metadata = pod.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
        return pod if uid == c.pod_uid else {}


class PodCollector(Collector):
    """Per pod and device, the claim against NVML's usage; per device, foreign memory.

    ``read_gpus`` reads the GPUs, ``list_claims`` the ResourceClaims (API dicts),
    ``pod_of`` a pid's pod UID (``pod_cgroup.pod_uid``); ``to_bytes`` parses a quantity;
    ``read_pod`` (optional) a Pod by namespace and name, for its recorded components.
    Nothing is exported for a reading that failed."""

    def __init__(
        self,
        node_name: str,
        driver: str,
        read_gpus: Callable[[], InventorySnapshot],
        list_claims: Callable[[], Iterable[Mapping[str, Any]]],
        pod_of: Callable[[int], str | None],
        to_bytes: Callable[[str], int],
        read_pod: Callable[[str, str], Mapping[str, Any]] | None = None,
    ) -> None:
        self._node_name = node_name
        self._driver = driver
        self._read_gpus = read_gpus
        self._list_claims = list_claims
        self._pod_of = pod_of
        self._to_bytes = to_bytes
        self._components = PodComponents(read_pod) if read_pod is not None else None

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
        pods = figures.pods if figures else ()
        recorded = self._components.of(p.claim for p in pods) if self._components else {}
        f = _pod_families()
        for pod in pods:
            c = pod.claim
            labels = [c.namespace, c.pod, c.claim, c.device]
            f["predicted_total"].add_metric(labels, c.claimed_bytes)
            f["actual"].add_metric(labels, pod.used_bytes)
            f["headroom"].add_metric(labels, pod.headroom_bytes)
            for component, value in recorded.get((c.pod_uid, c.claim), {}).items():
                f["predicted"].add_metric([*labels, component], value)
        for device, value in (figures.foreign_bytes if figures else {}).items():
            f["foreign"].add_metric([device], value)
        f["success"].add_metric([], 1 if figures else 0)
        yield from f.values()


def _pod_families() -> dict[str, GaugeMetricFamily]:
    """The per-pod families, empty, in the order they are exported."""
    return {
        "predicted": GaugeMetricFamily(
            "gatekeeper_worker_predicted_bytes",
            "Predicted bytes per component on each of the worker's GPUs (per rank; per pod: "
            "the rank its claim was sized by, from the pod's vllm-gatekeeper.io/claim record)",
            labels=[*POD_LABELS, "component"],
        ),
        "predicted_total": GaugeMetricFamily(
            "gatekeeper_worker_predicted_total_bytes",
            "Predicted NVML bytes on the GPU (the admission's promise; per pod: its claim)",
            labels=POD_LABELS,
        ),
        "actual": GaugeMetricFamily(
            "gatekeeper_worker_actual_bytes",
            "NVML's usage of the worker's processes (per pod: those in the pod's cgroup)",
            labels=POD_LABELS,
        ),
        "headroom": GaugeMetricFamily(
            "gatekeeper_pod_memory_headroom_bytes",
            "The pod's claim on the device less its processes' NVML usage there",
            labels=POD_LABELS,
        ),
        "foreign": GaugeMetricFamily(
            "gatekeeper_agent_foreign_memory_bytes",
            "NVML usage of processes on the device that no pod's claim there accounts for",
            labels=["device"],
        ),
        "success": GaugeMetricFamily(
            "gatekeeper_agent_pod_figures_success",
            "1 when this scrape read the GPUs and the claims for the per-pod figures, else 0",
        ),
    }
