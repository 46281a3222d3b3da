"""The node agent (``gatekeeper agent``, one per node from the DaemonSet): publish, taint,
republish (issue 29 item 1; ``../shared/reference/cluster.md``).

Each pass reads the node's GPUs and the ResourceClaims allocated on its pool, then:

1. builds the node's ResourceSlice (``slices.resource_slice``: pool = node name);
2. taints ``NoSchedule`` each device whose NVML-used memory exceeds what its claims booked
   by more than the tolerance (``accounting.with_taints``), and lifts the taint once the
   memory is free again; and each device whose GPU (by uuid) another DRA driver also
   publishes on this node (``accounting.shared_devices``: NVIDIA's driver beside ours
   would book the same memory twice), until that driver's slice no longer lists it;
3. creates the slice, or replaces it when its devices differ from the published ones, or
   leaves it alone. The pool's generation goes up by one when the device set changes (a
   GPU appeared or vanished); a taint or a capacity change is one update of the pool's one
   slice and keeps it, as kubernetes' own publisher does
   (``k8s.io/dynamic-resource-allocation/resourceslice/resourceslicecontroller.go``,
   ``syncPool``: "Kept generation because at most one update API call is necessary").

Each pass also lists the node's pods and reports every one that holds GPUs through
``nvidia.com/gpu`` in no gatekeeper claim (``unclaimed``: admitted while the mutating webhook
was down, in a namespace it leaves out, or skipped): once per pod, a WARNING log line and an
``UnclaimedGpus`` Warning Event on it, and their count in ``unclaimed`` (the metric
``gatekeeper_agent_unclaimed_gpu_pods``). A pod list that fails is logged and the pass goes on.
And it reports each Pending pod whose gatekeeper claim kube-scheduler "cannot allocate":
an ``Unallocatable`` Warning Event with the bytes the claim asks and what each node's
devices have free (``allocation_events``; one Event per pod per change between all agents).

A restarted agent finds its slice, sees the same devices and writes nothing: allocations
live in the claims and are never touched by the agent. When a device vanishes, each pod
whose claim was allocated on it is reported once: a WARNING log line and a
``GpuVanished`` Warning Event on the pod. Those allocations are recorded on the slice
(``accounting.VANISHED_ANNOTATION``) until their claims are gone, so that a restarted agent
still lists them (``orphans``, the metrics) and reports none of them again. A GPU reading that fails keeps the published slice (publishing
an empty pool would tell the scheduler the node has no GPUs).

The one module of the wing that talks to the apiserver (lightkube, the ``cluster`` extra).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.utils.quantity import parse_quantity

from gatekeeper.cluster.accounting import (
    SHARED_TAINT_KEY,
    TAINT_KEY,
    VANISHED_ANNOTATION,
    Allocation,
    Orphans,
    allocations,
    booked_bytes,
    orphan_key,
    orphans_text,
    parse_orphans,
    shared_devices,
    unaccounted_bytes,
    vanished,
    with_taints,
)
from gatekeeper.cluster.allocation_events import AllocationReporter
from gatekeeper.cluster.claims_watch import ClaimsWatch
from gatekeeper.cluster.kube_time import rfc3339
from gatekeeper.cluster.slices import (
    DRIVER_NAME,
    device_name,
    resource_slice,
    slice_name,
)
from gatekeeper.cluster.unallocatable import pod_event
from gatekeeper.cluster.unclaimed import UnclaimedPod, unclaimed_gpu_pods, unclaimed_text
from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.units import MIB

__all__ = ["Action", "AgentConfig", "NodeAgent", "PassResult", "quantity_bytes"]

log = logging.getLogger("gatekeeper.cluster.agent")
Action = Literal["created", "updated", "unchanged", "kept"]


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What the agent publishes, and how often."""

    node_name: str
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    driver: str = DRIVER_NAME
    interval_seconds: float = 10.0
    tolerance_bytes: int = 512 * MIB
    """Unaccounted memory up to this is not tainted (a context, a probe's few MiB)."""


@dataclass(frozen=True, slots=True)
class PassResult:
    """What one pass did."""

    action: Action
    """created, updated, unchanged, or kept (the GPU reading failed: slice left as is)."""
    generation: int
    devices: tuple[str, ...] = ()
    tainted: tuple[str, ...] = ()
    """Devices tainted for memory no claim books (``accounting.TAINT_KEY``)."""
    vanished: tuple[Allocation, ...] = ()
    shared: tuple[tuple[str, str], ...] = ()
    """Devices another driver also publishes, with that driver (``SHARED_TAINT_KEY``)."""
    unclaimed: tuple[UnclaimedPod, ...] = ()
    """The node's pods that hold ``nvidia.com/gpu`` in no gatekeeper claim."""


def quantity_bytes(text: str) -> int:
    """An API quantity (``12Gi``, ``12884901888``) as integer bytes, a fraction rounded up."""
    try:
        value = parse_quantity(text)
    except ValueError:
        value = None
    if value is None:
        raise GatekeeperError(
            f"quantity {text!r} is not a Kubernetes quantity; expected e.g. 12Gi or 12884901888",
            field="quantity",
            value=text,
        )
    return math.ceil(value)


def _canonical(devices: list[dict[str, Any]]) -> list[Any]:
    """Devices as comparable values: quantities as ints, taints without ``timeAdded``."""
    out: list[Any] = []
    for device in sorted(devices, key=lambda d: str(d["name"])):
        capacity = {}
        for name, cap in (device.get("capacity") or {}).items():
            rng = (cap.get("requestPolicy") or {}).get("validRange") or {}
            capacity[name] = (
                quantity_bytes(cap["value"]),
                sorted((k, quantity_bytes(v)) for k, v in rng.items()),
            )
        taints = sorted(
            (t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints") or []
        )
        attrs = device.get("attributes") or {}
        multiple = bool(device.get("allowMultipleAllocations"))
        out.append((device["name"], sorted(attrs.items(), key=str), capacity, taints, multiple))
    return out


def _identities(slice_: Mapping[str, Any]) -> dict[str, str]:
    """Each device's name and the GPU behind it (its uuid attribute).

    Names follow the uuid (``slices.uuid_device_name``), so a GPU keeps its name when
    another vanishes; a name whose uuid changed (a slice an older agent published with
    ``gpu-<index>`` names) is still a vanished device and a new one, never the same.
    """
    return {
        str(d["name"]): str((d.get("attributes") or {}).get("uuid", {}).get("string", ""))
        for d in slice_["spec"]["devices"]
    }


def _annotation(slice_: Mapping[str, Any] | None) -> str:
    """The slice's ``VANISHED_ANNOTATION`` ("" when it has none)."""
    annotations = ((slice_ or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(VANISHED_ANNOTATION, ""))


def _annotate(slice_: dict[str, Any], orphans: Orphans) -> None:
    """Records ``orphans`` on ``slice_`` (no annotation when there are none)."""
    if orphans:
        slice_["metadata"].setdefault("annotations", {})[VANISHED_ANNOTATION] = orphans_text(
            orphans
        )


def _same(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """The same devices (``_canonical``) and the same record of vanished GPUs."""
    return _canonical(current["spec"]["devices"]) == _canonical(
        desired["spec"]["devices"]
    ) and _annotation(current) == _annotation(desired)


class NodeAgent:
    """Publishes one node's GPUs as its ResourceSlice through ``client``."""

    def __init__(
        self,
        client: Client,
        config: AgentConfig,
        read_gpus: Callable[[], InventorySnapshot],
        list_claims: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
        list_pods: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
    ) -> None:
        self._client = client
        self._config = config
        self._read_gpus = read_gpus
        self._list_claims = list_claims or ClaimsWatch(client)
        self._list_pods = list_pods or self._node_pods
        self.slice_name = slice_name(config.node_name, config.driver)
        self.last: PassResult | None = None
        """The last pass that succeeded."""
        self.passes: Counter[str] = Counter()
        """Passes by outcome: created, updated, unchanged, kept, failed."""
        self.shared: dict[str, str] = {}
        """Our devices whose GPU another driver publishes on this node, and that driver."""
        self.orphans: Orphans = {}
        """Allocations on vanished devices, with the vanished GPU's uuid, by (namespace,
        claim, device); kept until the claim is deallocated (its pod deleted), and recorded on
        the slice (``VANISHED_ANNOTATION``) so that a restarted agent keeps them."""
        self.unclaimed: tuple[UnclaimedPod, ...] = ()
        """The node's pods that hold ``nvidia.com/gpu`` in no gatekeeper claim, as the
        last pod list found them."""
        self._reported: set[str] = set()
        """The uids of the unclaimed pods already reported (one Event per pod)."""
        self.unallocatable = AllocationReporter(
            client, config.driver, config.node_name, self._list_claims, quantity_bytes
        )
        """The Pending pods whose claims the scheduler cannot allocate: an Event each."""

    def _published(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """Our slice (None before it is created) and every driver's slices on this node
        (``shared_devices`` skips ours), from one list per pass."""
        node = self._config.node_name
        listed = self._client.list(ResourceSlice, fields={"spec.nodeName": node})
        slices = [s.to_dict() for s in listed]
        ours = [s for s in slices if s["metadata"]["name"] == self.slice_name]
        return (ours[0] if ours else None), slices

    def _allocations(self) -> list[Allocation]:
        """The allocations on our pool, from ``list_claims`` (the agent's ``ClaimsWatch``;
        where none is given, a watch never started, which lists every claim at each pass,
        as ``--once`` does)."""
        claims = self._list_claims()
        return allocations(claims, self._config.driver, self._config.node_name, quantity_bytes)

    def _desired(
        self,
        snapshot: InventorySnapshot,
        found: list[Allocation],
        generation: int,
        node_slices: list[dict[str, Any]],
    ) -> dict[str, Any]:
        cfg = self._config
        desired = resource_slice(
            cfg.node_name, snapshot, cfg.policy, generation=generation, driver=cfg.driver
        )
        used = {device_name(gpu): gpu.used_bytes for gpu in snapshot.gpus}
        unaccounted = unaccounted_bytes(used, booked_bytes(found))
        shared = shared_devices(_identities(desired), node_slices, cfg.driver)
        if shared != self.shared:
            self._say_shared(shared)
        self.shared = shared
        return with_taints(desired, unaccounted, cfg.tolerance_bytes, shared)

    def _say_shared(self, shared: Mapping[str, str]) -> None:
        """One log line when the devices another driver also publishes change."""
        if not shared:
            log.info("no other driver publishes this node's GPUs now; taints lifted")
            return
        listed = ", ".join(f"{device} (also {driver})" for device, driver in sorted(shared.items()))
        log.warning(
            "another DRA driver publishes the same GPUs on node %s: %s; tainted %s so that "
            "only that driver's claims are placed there. Run one driver per GPU: remove "
            "gatekeeper's agent from this node, or that driver's kubelet plugin",
            self._config.node_name,
            listed,
            SHARED_TAINT_KEY,
        )

    def publish(self) -> PassResult:
        """One pass: read, compare, write what changed, report vanished devices' pods.
        Counted in ``passes`` (an exception counts as failed and propagates)."""
        try:
            result = self._pass()
        except Exception:
            self.passes["failed"] += 1
            raise
        self.passes[result.action] += 1
        self.last = result
        return result

    def _pass(self) -> PassResult:
        snapshot = self._read_gpus()
        current, node_slices = self._published()
        generation = int(current["spec"]["pool"]["generation"]) if current else 1
        if not snapshot.ok:
            log.warning("GPU reading failed, slice %s kept: %s", self.slice_name, snapshot.error)
            return PassResult("kept", generation)
        found = self._allocations()
        desired = self._desired(snapshot, found, generation, node_slices)
        identities = _identities(desired)
        names = tuple(sorted(identities))
        tainted = tuple(
            d["name"]
            for d in desired["spec"]["devices"]
            if any(t["key"] == TAINT_KEY for t in d.get("taints") or [])
        )
        before = _identities(current) if current else identities
        orphans, gone = self._orphans(current, found, before, identities)
        _annotate(desired, orphans)
        if current is None:
            self._client.create(from_dict(desired))
            action: Action = "created"
        elif identities != before:
            generation += 1
            desired["spec"]["pool"]["generation"] = generation
            action = self._replace(current, desired)
        elif _same(current, desired):
            action = "unchanged"
        else:
            action = self._replace(current, desired)
        self.orphans = orphans
        for allocation, uuid in gone:
            self._report_vanished(allocation, uuid)
        gone_allocations = tuple(a for a, _ in gone)
        shared = tuple(sorted(self.shared.items()))
        self._report_unclaimed()
        self.unallocatable.report()
        return PassResult(
            action, generation, names, tainted, gone_allocations, shared, self.unclaimed
        )

    def _node_pods(self) -> list[dict[str, Any]]:
        """The pods bound to this node (one list, by ``spec.nodeName``)."""
        found = self._client.list(
            Pod, namespace="*", fields={"spec.nodeName": self._config.node_name}
        )
        return [p.to_dict() for p in found]

    def _report_unclaimed(self) -> None:
        """The node's pods holding ``nvidia.com/gpu`` in no gatekeeper claim: each new one
        logged and given an Event once; ``unclaimed`` kept for the metrics."""
        try:
            pods = list(self._list_pods())
        except (ApiError, httpx2.HTTPError, OSError) as e:
            log.warning("the pods of node %s not listed: %s", self._config.node_name, e)
            return
        self.unclaimed = tuple(unclaimed_gpu_pods(pods))
        node = self._config.node_name
        for pod in self.unclaimed:
            if pod.uid in self._reported:
                continue
            message = unclaimed_text(pod, node)
            log.warning("%s", message)
            self._post_event(pod.namespace, pod.name, message, "UnclaimedGpus")
        self._reported = {pod.uid for pod in self.unclaimed}

    def _replace(self, current: Mapping[str, Any], desired: dict[str, Any]) -> Action:
        desired["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        self._client.replace(from_dict(desired))
        return "updated"

    def _orphans(
        self,
        current: Mapping[str, Any] | None,
        found: list[Allocation],
        before: Mapping[str, str],
        identities: Mapping[str, str],
    ) -> tuple[Orphans, list[tuple[Allocation, str]]]:
        """The allocations on vanished GPUs whose claims still exist: those recorded on
        the published slice (a restarted agent's memory) or known to this agent, and
        those on GPUs that vanish in this pass (``gone``, reported once)."""
        live = {(a.namespace, a.claim) for a in found}
        known = {**self._recorded(current), **self.orphans}
        orphans = {key: value for key, value in known.items() if key[:2] in live}
        kept = [name for name, uuid in before.items() if identities.get(name) == uuid]
        gone = [
            (allocation, before.get(allocation.device, ""))
            for allocation in vanished(found, kept)
            if orphan_key(allocation) not in orphans
        ]
        orphans |= {orphan_key(allocation): (allocation, uuid) for allocation, uuid in gone}
        return orphans, gone

    def _recorded(self, current: Mapping[str, Any] | None) -> Orphans:
        text = _annotation(current)
        if not text:
            return {}
        try:
            return parse_orphans(text)
        except ValueError as e:
            log.warning("slice %s: %s", self.slice_name, e)
            return {}

    def _report_vanished(self, allocation: Allocation, uuid: str) -> None:
        node = self._config.node_name
        for pod in allocation.pods:
            message = (
                f"GPU {allocation.device} ({uuid}) of node {node} is no longer published; claim "
                f"{allocation.claim} booked {allocation.memory_bytes} bytes on it. Delete "
                "the pod so that its workload is placed again"
            )
            log.warning("pod %s/%s: %s", allocation.namespace, pod, message)
            self._post_event(allocation.namespace, pod, message, "GpuVanished")

    def _post_event(self, namespace: str, pod: str, message: str, reason: str) -> None:
        now = rfc3339(time.time())
        event = pod_event((namespace, pod, ""), message, reason, self._config.node_name, now)
        try:
            self._client.create(from_dict(event))
        except ApiError as e:
            log.warning("event for pod %s/%s not recorded: %s", namespace, pod, e)

    def run(self, stop: threading.Event) -> None:
        """Passes every ``interval_seconds`` until ``stop`` is set; a failed pass is
        logged and retried at the next one."""
        while not stop.is_set():
            try:
                result = self.publish()
            except (ApiError, GatekeeperError, httpx2.HTTPError, OSError) as e:
                log.warning("publishing %s failed, retrying: %s", self.slice_name, e)
            else:
                if result.action in ("created", "updated"):
                    log.info(
                        "slice %s %s: generation %d, devices %s, tainted %s",
                        self.slice_name,
                        result.action,
                        result.generation,
                        ",".join(result.devices) or "none",
                        ",".join(result.tainted) or "none",
                    )
            stop.wait(self._config.interval_seconds)
