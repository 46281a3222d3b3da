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
- ``vanished`` lists the allocations on devices the new slice no longer has.

Quantities arrive as integer bytes: the agent parses the API's strings at its edge.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TAINT_EFFECT",
    "TAINT_KEY",
    "Allocation",
    "allocations",
    "booked_bytes",
    "unaccounted_bytes",
    "vanished",
    "with_taints",
]

TAINT_KEY = "gpu.gatekeeper.dev/unaccounted-memory"
"""The device taint the agent sets while memory no claim books is in use."""
TAINT_EFFECT = "NoSchedule"


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
        pods = tuple(ref["name"] for ref in reserved if ref.get("resource") == "pods")
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
    slice_: Mapping[str, Any], unaccounted: Mapping[str, int], tolerance_bytes: int
) -> dict[str, Any]:
    """A copy of ``slice_`` whose devices with over ``tolerance_bytes`` unaccounted carry
    the ``NoSchedule`` taint ``TAINT_KEY``; the others carry none of ours."""
    tainted = copy.deepcopy(dict(slice_))
    for device in tainted["spec"]["devices"]:
        others = [t for t in device.get("taints", []) if t.get("key") != TAINT_KEY]
        if unaccounted.get(device["name"], 0) > tolerance_bytes:
            others.append({"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT})
        if others:
            device["taints"] = others
        else:
            device.pop("taints", None)
    return tainted


def vanished(found: Iterable[Allocation], devices: Iterable[str]) -> list[Allocation]:
    """The allocations on devices not in ``devices`` (the newly published ones)."""
    present = set(devices)
    return [allocation for allocation in found if allocation.device not in present]
