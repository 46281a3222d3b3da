"""The pods kube-scheduler cannot place because their GPU claim fits no published device, in
bytes (pure; issue 39 item 2).

When no node has devices with the memory a claim asks free, the scheduler's
DynamicResources plugin leaves the pod Pending with the condition ``PodScheduled=False``,
reason ``Unschedulable``, and a message that says only "cannot allocate all claims". The
node agent turns that into numbers: ``waiting_pods`` finds such pods among the Pending
ones whose claims ask gatekeeper's devices (a request of the driver's DeviceClass);
``claim_asks`` reads what each claim asks (devices and the ``memory`` each one books);
``free_devices`` what each node's published devices have free (the newest generation of
each pool's slices: ``capacity.memory`` less the ``consumedCapacity`` of the claims
allocated there; tainted devices said so); ``unallocatable_text`` says it, e.g.::

    claim serving/qwen-gpus-x7k2p asks 2 devices with 90.00 GiB (96636764160 bytes) free
    each on one node, and no node the pod may land on has them: node-a: 77.10, 65.10 GiB
    free of 77.10 GiB; node-b: 77.10 GiB free of 77.10 GiB (1 device). Lower what a rank
    needs (a shorter --max-model-len, --kv-cache-dtype fp8, a larger
    --tensor-parallel-size), free memory on a node, or add GPUs

The pods the scheduler may consider are those of every node publishing the driver's
slices, or of the node a ``kubernetes.io/hostname`` node selector names. ``event_name`` is
the Event's name: the pod's, and a hash of what changed (the pod's uid, the scheduler's
message, the claims' asks), so that however many agents see the pod, the apiserver keeps
one Event per pod per change (a second create is refused as already existing).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.accounting import allocations, booked_bytes
from gatekeeper.cluster.unclaimed import _list, _map  # an API dict's fields, loosely typed
from gatekeeper.units import format_gib

__all__ = [
    "SCHEDULER_TEXT",
    "ClaimAsk",
    "DeviceFree",
    "WaitingPod",
    "claim_asks",
    "event_name",
    "free_devices",
    "pod_event",
    "unallocatable_text",
    "waiting_pods",
]

SCHEDULER_TEXT = "cannot allocate all claims"
"""What kube-scheduler's DynamicResources plugin says of a node where a claim fits no
device (its ``Filter``; the string is in the 1.37 binary)."""
HOSTNAME_LABEL = "kubernetes.io/hostname"
MAX_NODES = 8
"""The most nodes one Event lists (the most free first), and how many more."""
MAX_MESSAGE_CHARS = 1000
"""Below the 1024 characters an Event's note may hold (events.k8s.io)."""


@dataclass(frozen=True, slots=True)
class WaitingPod:
    """A Pending pod the scheduler said "cannot allocate all claims" of."""

    namespace: str
    name: str
    uid: str
    claims: tuple[str, ...]
    """Its ResourceClaims' names (``status.resourceClaimStatuses``, or the claims it names)."""
    condition: str
    """The scheduler's message (``PodScheduled``)."""
    node: str | None
    """The node a ``kubernetes.io/hostname`` node selector pins it to."""


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """What one claim asks of the driver's devices."""

    claim: str
    devices: int
    memory_bytes: int
    """The most ``capacity.requests.memory`` one of its requests asks per device."""


@dataclass(frozen=True, slots=True)
class DeviceFree:
    """One published device and what is free on it."""

    name: str
    capacity_bytes: int
    free_bytes: int
    tainted: bool


def _unschedulable(pod: Mapping[str, Any]) -> str | None:
    for condition in _list(_map(pod.get("status")).get("conditions")):
        c = _map(condition)
        text = str(c.get("message", ""))
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
            and SCHEDULER_TEXT in text
        ):
            return text
    return None


def _claim_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    made = {
        str(_map(s).get("name")): _map(s).get("resourceClaimName")
        for s in _list(status.get("resourceClaimStatuses"))
    }
    names = []
    for entry in map(_map, _list(spec.get("resourceClaims"))):
        name = entry.get("resourceClaimName") or made.get(str(entry.get("name")))
        if name:
            names.append(str(name))
    return tuple(names)


def waiting_pods(pods: Iterable[Mapping[str, Any]]) -> list[WaitingPod]:
    """The Pending pods of ``pods`` (API dicts) the scheduler cannot allocate claims for."""
    out = []
    for pod in pods:
        if _map(pod.get("status")).get("phase") != "Pending":
            continue
        text = _unschedulable(pod)
        claims = _claim_names(pod)
        if text is None or not claims:
            continue
        meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
        node = _map(spec.get("nodeSelector")).get(HOSTNAME_LABEL)
        out.append(
            WaitingPod(
                str(meta.get("namespace", "")), str(meta.get("name", "")),
                str(meta.get("uid", "")), claims, text, str(node) if node else None,
            )
        )  # fmt: skip
    return out


def claim_asks(
    claim: Mapping[str, Any], device_class: str, to_bytes: Callable[[str], int]
) -> ClaimAsk | None:
    """What ``claim`` (an API dict) asks of ``device_class``'s devices; None when none of
    its requests names that class."""
    requests = _list(_map(_map(claim.get("spec")).get("devices")).get("requests"))
    devices, most = 0, 0
    for request in map(_map, requests):
        exactly = _map(request.get("exactly"))
        if exactly.get("deviceClassName") != device_class:
            continue
        count = exactly.get("count")
        devices += int(count) if isinstance(count, int) and count > 0 else 1
        memory = _map(_map(exactly.get("capacity")).get("requests")).get("memory")
        most = max(most, to_bytes(str(memory)) if memory is not None else 0)
    if not devices:
        return None
    return ClaimAsk(str(_map(claim.get("metadata")).get("name", "")), devices, most)


def free_devices(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    driver: str,
    to_bytes: Callable[[str], int],
) -> dict[str, list[DeviceFree]]:
    """Each node's devices of ``driver`` (the newest generation of each pool) with the
    memory free on them: capacity less what the allocated claims booked."""
    newest: dict[str, int] = {}
    mine = [s for s in slices if _map(s.get("spec")).get("driver") == driver]
    for s in mine:
        pool = _map(_map(s.get("spec")).get("pool"))
        name, generation = str(pool.get("name")), int(pool.get("generation") or 0)
        newest[name] = max(newest.get(name, generation), generation)
    listed = list(claims)
    out: dict[str, list[DeviceFree]] = defaultdict(list)
    for s in mine:
        spec = _map(s.get("spec"))
        pool = _map(spec.get("pool"))
        name = str(pool.get("name"))
        if int(pool.get("generation") or 0) != newest[name] or not spec.get("nodeName"):
            continue
        booked = booked_bytes(allocations(listed, driver, name, to_bytes))
        for device in map(_map, _list(spec.get("devices"))):
            memory = _map(_map(device.get("capacity")).get("memory")).get("value")
            if memory is None:
                continue
            capacity = to_bytes(str(memory))
            device_name = str(device.get("name"))
            free = max(0, capacity - booked.get(device_name, 0))
            tainted = any(
                _map(t).get("effect") in ("NoSchedule", "NoExecute")
                for t in _list(device.get("taints"))
            )
            out[str(spec["nodeName"])].append(DeviceFree(device_name, capacity, free, tainted))
    return dict(out)


def _node_text(node: str, devices: list[DeviceFree]) -> str:
    ordered = sorted(devices, key=lambda d: -d.free_bytes)
    frees = ", ".join(
        f"{d.free_bytes / 2**30:.2f}{' (tainted)' if d.tainted else ''}" for d in ordered
    )
    totals = {d.capacity_bytes for d in ordered}
    of = f"of {format_gib(max(totals))}" + (" each" if len(totals) == 1 else " at most")
    count = f" ({len(ordered)} device{'s' if len(ordered) != 1 else ''})"
    return f"{node}: {frees} GiB free {of}{count}"


def unallocatable_text(
    asks: list[ClaimAsk], free: Mapping[str, list[DeviceFree]], node: str | None = None
) -> str:
    """What the Event says: what each claim asks and what each candidate node has free
    (the most free first, at most ``MAX_NODES``); ``node``: the node the pod is pinned to."""
    parts = []
    for ask in asks:
        each = " each" if ask.devices > 1 else ""
        where = " on one node" if ask.devices > 1 else ""
        plural = "s" if ask.devices > 1 else ""
        parts.append(
            f"claim {ask.claim} asks {ask.devices} device{plural} with "
            f"{format_gib(ask.memory_bytes)} ({ask.memory_bytes} bytes) free{each}{where}"
        )
    nodes = {n: d for n, d in free.items() if node is None or n == node}
    ranked = sorted(nodes.items(), key=lambda item: (-max(d.free_bytes for d in item[1]), item[0]))
    shown = [_node_text(n, d) for n, d in ranked[:MAX_NODES]]
    more = len(ranked) - len(shown)
    listed = "; ".join(shown) + (f"; and {more} more nodes" if more else "")
    pinned = f" (its node selector names {node})" if node else ""
    have = (
        f"no node the pod may land on{pinned} has them: {listed}"
        if shown
        else f"no node the pod may land on{pinned} publishes gatekeeper's GPUs"
    )
    text = (
        f"{'; '.join(parts)}, and {have}. Lower what a rank needs (a shorter "
        "--max-model-len, --kv-cache-dtype fp8, a larger --tensor-parallel-size), free "
        "memory on a node, or add GPUs"
    )
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def event_name(pod: WaitingPod, asks: list[ClaimAsk]) -> str:
    """The Event's name: the pod's and a hash of the pod, the scheduler's message and the
    claims' asks (the same for every agent that sees the same change)."""
    key = "\n".join(
        [pod.uid, pod.condition, *(f"{a.claim}:{a.devices}:{a.memory_bytes}" for a in asks)]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{pod.name[:200]}.unallocatable-{digest}"


def pod_event(
    pod: tuple[str, str, str], message: str, reason: str, host: str, now: str, name: str = ""
) -> dict[str, Any]:
    """A Warning Event on ``pod`` (namespace, name, uid; uid may be "") from the agent on
    ``host`` at ``now`` (RFC 3339), named ``name`` (else generated from the pod's)."""
    namespace, pod_name, uid = pod
    metadata: dict[str, Any] = {"namespace": namespace}
    metadata |= {"name": name} if name else {"generateName": f"{pod_name}."}
    involved = {"kind": "Pod", "name": pod_name, "namespace": namespace}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": metadata,
        "involvedObject": involved | ({"uid": uid} if uid else {}),
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": "gatekeeper-agent", "host": host},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
