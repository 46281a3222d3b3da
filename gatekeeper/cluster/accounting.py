"""What the claims hold on a node's devices, and what the node agent makes of it (pure).

The node agent reads the ResourceClaims the scheduler allocated on its pool and compares
them with its GPUs (design: ``../shared/reference/cluster.md``):

- ``allocations`` lists each allocation result on the pool: the claim, the device, the
  bytes the scheduler booked (``consumedCapacity.memory``) and the pods it is reserved for;
- ``unaccounted_bytes`` is, per device, the memory NVML shows used less what the claims on
  it booked: ``used - sum(consumedCapacity)``. A worker that has not yet started uses less
  than its claim (negative, nothing to do); memory no claim books (a process started
  outside Kubernetes, a leaked context) is positive;
- ``with_taints`` puts the ``NoSchedule`` device taint ``TAINT_KEY`` on each device whose
  unaccounted memory exceeds the tolerance, so the scheduler stops adding claims to it
  until the memory is free again (kubernetes ``pkg/apis/resource/types.go``, DeviceTaint;
  DRADeviceTaints is GA and on by default in 1.37, beta and on from 1.36);
- ``shared_devices`` finds the devices whose GPU another DRA driver publishes on the same
  node (NVIDIA's ``gpu.nvidia.com``, a second gatekeeper driver), whole (``uuid``) or as
  MIG devices (``parentUUID``): its scheduler books that GPU's memory without seeing
  gatekeeper's claims, and the reverse; ``with_taints`` puts
  the ``NoSchedule`` taint ``SHARED_TAINT_KEY`` on them, so that only one driver's claims
  land there (claims already allocated keep running: ``NoSchedule`` evicts nothing);
- ``vanished`` lists the allocations on devices the new slice no longer has;
- ``orphans_text`` and ``parse_orphans`` write and read those allocations (with the
  vanished GPU's uuid) as the slice's ``VANISHED_ANNOTATION``, so that a restarted agent
  still reports them and does not report them twice.

Quantities arrive as integer bytes: the agent parses the API's strings at its edge.
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SHARED_TAINT_KEY",
    "TAINT_EFFECT",
    "TAINT_KEY",
    "VANISHED_ANNOTATION",
    "Allocation",
    "OrphanKey",
    "Orphans",
    "allocations",
    "booked_bytes",
    "orphan_key",
    "orphans_text",
    "parse_orphans",
    "shared_devices",
    "unaccounted_bytes",
    "vanished",
    "with_taints",
]

TAINT_KEY = "gpu.gatekeeper.dev/unaccounted-memory"
"""The device taint the agent sets while memory no claim books is in use."""
SHARED_TAINT_KEY = "gpu.gatekeeper.dev/published-by-another-driver"
"""The device taint the agent sets while another DRA driver publishes the same GPU; its
value is that driver's name."""
TAINT_EFFECT = "NoSchedule"
VANISHED_ANNOTATION = "gpu.gatekeeper.dev/vanished"
"""The slice's annotation listing the allocations on GPUs that vanished (JSON)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation result of a claim on this node's pool."""

    namespace: str
    claim: str
    device: str
    memory_bytes: int
    """``consumedCapacity.memory`` (0 when the result books no memory)."""
    pods: tuple[str, ...]
    """The pods in ``status.reservedFor``."""
    pod_uids: tuple[str, ...] = field(default=(), compare=False)
    """Their UIDs, in the same order (not part of the vanished record)."""


def _results(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    devices = allocation.get("devices") or {}
    return list(devices.get("results") or [])


def allocations(
    claims: Iterable[Mapping[str, Any]],
    driver: str,
    pool: str,
    to_bytes: Callable[[str], int],
) -> list[Allocation]:
    """Each allocation result of ``claims`` (API dicts) on ``driver``'s ``pool``;
    ``to_bytes`` parses a quantity string."""
    found: list[Allocation] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        refs = [ref for ref in reserved if ref.get("resource") == "pods"]
        pods = tuple(ref["name"] for ref in refs)
        uids = tuple(str(ref.get("uid", "")) for ref in refs)
        for result in _results(claim):
            if result.get("driver") != driver or result.get("pool") != pool:
                continue
            memory = (result.get("consumedCapacity") or {}).get("memory")
            found.append(
                Allocation(
                    namespace=meta.get("namespace", ""),
                    claim=meta.get("name", ""),
                    device=result["device"],
                    memory_bytes=to_bytes(memory) if memory is not None else 0,
                    pods=pods,
                    pod_uids=uids,
                )
            )
    return found


def booked_bytes(found: Iterable[Allocation]) -> dict[str, int]:
    """The bytes the claims booked, by device name."""
    booked: dict[str, int] = defaultdict(int)
    for allocation in found:
        booked[allocation.device] += allocation.memory_bytes
    return dict(booked)


def unaccounted_bytes(used: Mapping[str, int], booked: Mapping[str, int]) -> dict[str, int]:
    """Per device: memory used (NVML) less the claims' booked bytes; may be negative.

    e.g. 30 GiB used where the claims booked 24 GiB: 6 GiB no claim accounts for.
    """
    return {device: used_bytes - booked.get(device, 0) for device, used_bytes in used.items()}


def with_taints(
    slice_: Mapping[str, Any],
    unaccounted: Mapping[str, int],
    tolerance_bytes: int,
    shared: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A copy of ``slice_`` whose devices with over ``tolerance_bytes`` unaccounted carry
    the ``NoSchedule`` taint ``TAINT_KEY``, and those in ``shared`` (device name -> the
    other driver) ``SHARED_TAINT_KEY``; the others carry none of ours."""
    ours = (TAINT_KEY, SHARED_TAINT_KEY)
    shared = shared or {}
    tainted = copy.deepcopy(dict(slice_))
    for device in tainted["spec"]["devices"]:
        name = device["name"]
        taints = [t for t in device.get("taints", []) if t.get("key") not in ours]
        if unaccounted.get(name, 0) > tolerance_bytes:
            taints.append({"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT})
        if name in shared:
            taints.append({"key": SHARED_TAINT_KEY, "value": shared[name], "effect": TAINT_EFFECT})
        if taints:
            device["taints"] = taints
        else:
            device.pop("taints", None)
    return tainted


_GPU_UUID_ATTRIBUTES = frozenset({"uuid", "parentUUID"})
"""A device's attributes naming a whole GPU's uuid: its own, or (NVIDIA's MIG devices,
``k8s-dra-driver-gpu`` ``MigDeviceInfo.GetDevice``) the GPU it is a slice of."""


def _uuid_attributes(device: Mapping[str, Any]) -> set[str]:
    """The string values of a device's ``uuid`` and ``parentUUID`` attributes (in the
    driver's own domain, or qualified: ``gpu.nvidia.com/uuid``): a MIG device of NVIDIA's
    driver books memory of its parent GPU, so it shares that GPU too."""
    found = set()
    for name, value in (device.get("attributes") or {}).items():
        if str(name).rsplit("/", 1)[-1] in _GPU_UUID_ATTRIBUTES and isinstance(value, Mapping):
            text = value.get("string")
            if isinstance(text, str) and text:
                found.add(text)
    return found


def shared_devices(
    identities: Mapping[str, str], others: Iterable[Mapping[str, Any]], driver: str
) -> dict[str, str]:
    """Our devices (``identities``: name -> GPU uuid) whose GPU a slice of another driver
    in ``others`` (the node's ResourceSlices, API dicts) also publishes: name -> driver."""
    by_uuid = {uuid: name for name, uuid in identities.items() if uuid}
    shared: dict[str, str] = {}
    for slice_ in others:
        spec = slice_.get("spec") or {}
        other = str(spec.get("driver", ""))
        if other == driver:
            continue
        for device in spec.get("devices") or []:
            for uuid in _uuid_attributes(device) & by_uuid.keys():
                shared.setdefault(by_uuid[uuid], other)
    return shared


def vanished(found: Iterable[Allocation], devices: Iterable[str]) -> list[Allocation]:
    """The allocations on devices not in ``devices`` (the newly published ones)."""
    present = set(devices)
    return [allocation for allocation in found if allocation.device not in present]


OrphanKey = tuple[str, str, str]
"""An allocation on a vanished GPU: (namespace, claim, device)."""
Orphans = dict[OrphanKey, tuple[Allocation, str]]
"""Allocations on vanished GPUs, each with the vanished GPU's uuid, by ``orphan_key``."""


def orphan_key(allocation: Allocation) -> OrphanKey:
    return (allocation.namespace, allocation.claim, allocation.device)


def orphans_text(orphans: Orphans) -> str:
    """``orphans`` as the ``VANISHED_ANNOTATION`` value: a JSON list, sorted, compact.

    e.g. ``[{"claim":"first-gpu-x","device":"gpu-00000000aaaabbbbcccc000000000000",
    "memoryBytes":12884901888,"namespace":"agent","pods":["first"],
    "uuid":"GPU-00000000-aaaa-bbbb-cccc-000000000000"}]``
    """
    rows = [
        {
            "namespace": allocation.namespace,
            "claim": allocation.claim,
            "device": allocation.device,
            "uuid": uuid,
            "memoryBytes": allocation.memory_bytes,
            "pods": list(allocation.pods),
        }
        for _, (allocation, uuid) in sorted(orphans.items())
    ]
    return json.dumps(rows, separators=(",", ":"), sort_keys=True)


def parse_orphans(text: str) -> Orphans:
    """The ``VANISHED_ANNOTATION`` value read back; raises ValueError (naming what is
    wrong) when it is not what ``orphans_text`` writes."""
    try:
        rows = json.loads(text)
        found: Orphans = {}
        for row in rows:
            allocation = Allocation(
                namespace=str(row["namespace"]),
                claim=str(row["claim"]),
                device=str(row["device"]),
                memory_bytes=int(row["memoryBytes"]),
                pods=tuple(str(pod) for pod in row["pods"]),
            )
            found[orphan_key(allocation)] = (allocation, str(row["uuid"]))
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(
            f"annotation {VANISHED_ANNOTATION} is {text[:200]!r}, not a JSON list of "
            f"namespace, claim, device, uuid, memoryBytes and pods ({e!r}); it is written "
            "again at the next change"
        ) from e
    return found
