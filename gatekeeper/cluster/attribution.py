"""Each GPU process to its pod and claim, per pod predicted against actual (pure; issue 30
item 3, ``docs/cluster.md`` "Per-pod figures and routing").

The node agent reads NVML's running processes per GPU (``InventorySnapshot``), the pod
UID of each process (``/proc/PID/cgroup``, ``pod_cgroup.pod_uid``) and the
ResourceClaims allocated on its pool. Here, with no I/O:

- ``pod_claims`` lists, per allocation result on the pool, each pod the claim is reserved
  for (``status.reservedFor``: name and UID) with the device and the bytes the scheduler
  booked (``consumedCapacity.memory``);
- ``attribute`` adds each process's usage to the (pod, device) whose claim books that
  device (several claims of the pod there count as one, their bytes added). A process
  whose cgroup names no pod, a pod no claim here is reserved for, or a pod on a device
  its claims do not book is **foreign** memory of that device: it is never attributed to
  a pod.

e.g. a claim of 24 GiB on ``gpu-a`` reserved for pod ``qwen-0`` (uid ``u1``); on
``gpu-a`` pid 10 (cgroup of ``u1``) holds 20 GiB and pid 11 (no pod) 2 GiB: ``qwen-0``
has 24 GiB predicted, 20 GiB actual, 4 GiB headroom; ``gpu-a`` has 2 GiB foreign.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.accounting import allocations
from gatekeeper.cluster.slices import device_name
from gatekeeper.gpus.inventory import GpuInfo

__all__ = ["Attribution", "PodClaim", "PodFigures", "attribute", "pod_claims"]


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One device of a claim on this node's pool, and one pod it is reserved for."""

    namespace: str
    pod: str
    pod_uid: str
    claim: str
    device: str
    claimed_bytes: int
    """``consumedCapacity.memory`` (0 when the result books no memory)."""


@dataclass(frozen=True, slots=True)
class PodFigures:
    """A pod's claim on one device against what its processes hold there (NVML)."""

    claim: PodClaim
    used_bytes: int

    @property
    def headroom_bytes(self) -> int:
        """Claimed less used: negative when the pod holds more than it claimed."""
        return self.claim.claimed_bytes - self.used_bytes


@dataclass(frozen=True, slots=True)
class Attribution:
    """Per (pod, device) figures, and the foreign bytes of each device."""

    pods: tuple[PodFigures, ...]
    foreign_bytes: Mapping[str, int]
    """By device name: every GPU read, 0 when all its memory is in pods' claims."""


def pod_claims(
    claims: Iterable[Mapping[str, Any]],
    driver: str,
    pool: str,
    to_bytes: Callable[[str], int],
) -> list[PodClaim]:
    """Each (pod, device) of ``claims`` (API dicts) on ``driver``'s ``pool``
    (``accounting.allocations``, one per pod the claim is reserved for)."""
    return [
        PodClaim(
            namespace=str(a.namespace),
            pod=str(pod),
            pod_uid=uid,
            claim=str(a.claim),
            device=str(a.device),
            claimed_bytes=a.memory_bytes,
        )
        for a in allocations(claims, driver, pool, to_bytes)
        for pod, uid in zip(a.pods, a.pod_uids, strict=True)
    ]


def attribute(
    gpus: Iterable[GpuInfo],
    claims: Iterable[PodClaim],
    pod_of: Callable[[int], str | None],
) -> Attribution:
    """Each process of ``gpus`` to the claim of its pod (``pod_of(pid)``: the pod UID, or
    None) on its device; the rest is foreign. A process whose usage NVML does not report
    counts 0. Several claims of one pod on one device (a container each, or a claim's two
    requests) are one figure there: a process is the pod's, not a claim's, so their bytes
    add up against its usage, under their names joined (``draft,main``)."""
    by_key = _per_pod_device(claims)
    used = dict.fromkeys(by_key, 0)
    foreign: dict[str, int] = {}
    for gpu in gpus:
        device = device_name(gpu)
        foreign[device] = 0
        for process in gpu.processes:
            uid = pod_of(process.pid)
            key = (uid or "", device)
            if uid is not None and key in used:
                used[key] += process.used_bytes or 0
            else:
                foreign[device] += process.used_bytes or 0
    pods = tuple(PodFigures(claim, used[key]) for key, claim in by_key.items())
    return Attribution(pods, foreign)


def _per_pod_device(claims: Iterable[PodClaim]) -> dict[tuple[str, str], PodClaim]:
    """``claims`` by (pod UID, device), those sharing one added up into one."""
    grouped: dict[tuple[str, str], list[PodClaim]] = {}
    for c in claims:
        grouped.setdefault((c.pod_uid, c.device), []).append(c)
    return {
        key: dataclasses.replace(
            same[0],
            claim=",".join(sorted({c.claim for c in same})),
            claimed_bytes=sum(c.claimed_bytes for c in same),
        )
        for key, same in grouped.items()
    }
