"""What the kubelet plugin prepares, and whether a claim's bytes are free now (pure).

``NodePrepareResources`` names a claim (namespace, name, uid); the plugin reads it from the
apiserver and hands it here:

- ``claimed_devices`` reads the claim's allocation results of this driver: each must be on
  this node's pool (pool = node name, as the agent publishes), and each books
  ``consumedCapacity.memory`` bytes on one device (named by ``slices.device_name``);
- ``outstanding_bytes`` is what the other prepared claims on a GPU have been promised and
  not yet taken: per claim, its bytes less what its pods' processes already hold there
  (``taken``, NVML's per-process usage attributed to pods at the edge); never negative;
- ``waiting_ahead`` is what the prepares waiting in line before a claim ask for on a
  device (first come, first served: a later prepare never takes the bytes an earlier
  waiter waits for);
- ``check_free`` passes when ``need <= free - outstanding - ahead``, NVML's free memory of
  that GPU now less the outstanding promises and the waiters' asks, and otherwise raises
  ``BytesNotFree`` (a ``PrepareError``) with the claim, the device, every number and what
  holds the rest. The plugin waits, bounded, for such bytes (``dra_driver``); kubelet
  retries a failed prepare, so the pod waits instead of taking down a neighbour.

Example: an H100 with 50 GiB free; claim ``a`` (30 GiB) prepared, its worker not started
(0 taken): a 24 GiB claim ``b`` is refused (50 - 30 = 20 < 24). Once ``a``'s worker holds
its 30 GiB, NVML shows 20 GiB free, nothing is outstanding, and ``b`` is still refused; a
16 GiB claim passes either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import GpuInfo
from gatekeeper.units import gib

__all__ = [
    "BytesNotFree",
    "ClaimRef",
    "ClaimedDevice",
    "PrepareError",
    "PreparedClaim",
    "PreparedDevice",
    "Waiter",
    "check_free",
    "claimed_devices",
    "outstanding_bytes",
    "spread_taken",
    "waiting_ahead",
]


class PrepareError(GatekeeperError):
    """A claim cannot be prepared on this node now; kubelet retries the prepare."""


class BytesNotFree(PrepareError):
    """A claim's bytes are not free on its GPU now: the one refusal worth waiting out."""

    def noting(self, note: str) -> BytesNotFree:
        """The same refusal with ``note`` (how long it waited, or why it did not) added."""
        return BytesNotFree(f"{self.message}. {note}", field=self.field, value=self.value)


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """The claim kubelet names in a prepare or unprepare."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"

    @property
    def named(self) -> str:
        """``namespace/name``: how a refusal lists what holds a GPU's bytes (two claims of
        one name, deleted and made again, add up under it)."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClaimedDevice:
    """One allocation result of the claim on this node's pool."""

    request: str
    pool: str
    device: str
    memory_bytes: int
    """``consumedCapacity.memory``; 0 when the result books none."""
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """A claimed device as prepared: the GPU behind it and its CDI device ID."""

    claimed: ClaimedDevice
    gpu_index: int
    gpu_uuid: str
    cdi_device_id: str


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim prepared on this node (what the checkpoint keeps)."""

    ref: ClaimRef
    pod_uids: tuple[str, ...]
    """The pods the claim is reserved for when it was prepared."""
    devices: tuple[PreparedDevice, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.ref.namespace,
            "name": self.ref.name,
            "uid": self.ref.uid,
            "podUIDs": list(self.pod_uids),
            "devices": [
                {
                    "request": d.claimed.request,
                    "pool": d.claimed.pool,
                    "device": d.claimed.device,
                    "memoryBytes": d.claimed.memory_bytes,
                    "shareID": d.claimed.share_id,
                    "gpuIndex": d.gpu_index,
                    "gpuUUID": d.gpu_uuid,
                    "cdiDeviceID": d.cdi_device_id,
                }
                for d in self.devices
            ],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PreparedClaim:
        devices = tuple(
            PreparedDevice(
                ClaimedDevice(
                    d["request"], d["pool"], d["device"], int(d["memoryBytes"]), d["shareID"]
                ),
                int(d["gpuIndex"]),
                d["gpuUUID"],
                d["cdiDeviceID"],
            )
            for d in raw["devices"]
        )
        ref = ClaimRef(raw["namespace"], raw["name"], raw["uid"])
        return cls(ref, tuple(raw["podUIDs"]), devices)


def _refuse(ref: ClaimRef, what: str, field: str, value: object, todo: str) -> PrepareError:
    return PrepareError(f"claim {ref}: {what}; {todo}", field=field, value=value)


def _allocation_results(claim: Mapping[str, Any], ref: ClaimRef) -> list[dict[str, Any]]:
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise _refuse(
            ref,
            f"the apiserver's claim of that name has uid {uid}",
            "claim.uid",
            ref.uid,
            "the claim was deleted and made again; kubelet prepares the new one",
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise _refuse(
            ref,
            "it is not allocated (no status.allocation)",
            "status.allocation",
            None,
            "the scheduler allocates it before kubelet prepares it; retry once it has",
        )
    return list((allocation.get("devices") or {}).get("results") or [])


def claimed_devices(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    driver: str,
    node_name: str,
    to_bytes: Callable[[str], int],
) -> tuple[ClaimedDevice, ...]:
    """The claim's devices of ``driver``, all on ``node_name``'s pool; ``to_bytes``
    parses a quantity. Raises ``PrepareError`` for a claim of another uid, one not
    allocated, one with no device of ``driver``, or one allocated on another pool."""
    ours = [r for r in _allocation_results(claim, ref) if r.get("driver") == driver]
    if not ours:
        raise _refuse(
            ref,
            f"no device of driver {driver} is allocated to it",
            "status.allocation.devices.results",
            [],
            f"ask {driver}'s DeviceClass for a device, or leave the claim to its own driver",
        )
    elsewhere = sorted({str(r.get("pool")) for r in ours if r.get("pool") != node_name})
    if elsewhere:
        raise _refuse(
            ref,
            f"it is allocated to pool {', '.join(elsewhere)}, not to this node {node_name}",
            "status.allocation.devices.results.pool",
            elsewhere,
            "kubelet of the node the scheduler chose prepares it; check the pod's nodeName",
        )
    devices = []
    for result in ours:
        memory = (result.get("consumedCapacity") or {}).get("memory")
        devices.append(
            ClaimedDevice(
                request=str(result.get("request", "")),
                pool=node_name,
                device=str(result["device"]),
                memory_bytes=to_bytes(memory) if memory is not None else 0,
                share_id=result.get("shareID"),
            )
        )
    return tuple(devices)


def outstanding_bytes(
    prepared: Iterable[PreparedClaim], gpu_uuid: str, taken: Mapping[tuple[str, str], int]
) -> dict[str, int]:
    """Bytes promised on ``gpu_uuid`` to each prepared claim and not yet taken, by the
    claim's ``namespace/name``: its bytes there less ``taken[(claim uid, gpu uuid)]``
    (what its pods' processes hold there now), at least 0; claims with none left out.
    Two prepared claims of one name (deleted and made again, the old one not yet
    unprepared) add up under it."""
    out: dict[str, int] = {}
    for claim in prepared:
        promised = sum(d.claimed.memory_bytes for d in claim.devices if d.gpu_uuid == gpu_uuid)
        left = promised - taken.get((claim.ref.uid, gpu_uuid), 0)
        if left > 0:
            out[claim.ref.named] = out.get(claim.ref.named, 0) + left
    return out


def spread_taken(
    claims: Sequence[PreparedClaim], gpu_uuid: str, used_bytes: int
) -> dict[tuple[str, str], int]:
    """What one pod's processes hold on ``gpu_uuid`` (``used_bytes``), spread over its
    prepared ``claims`` there, by (claim uid, GPU uuid): a process is the pod's, not one
    claim's, so each claim in turn is filled to its bytes on that GPU and the last takes
    the rest. Their outstanding bytes then add up to the pod's promise there less its
    usage, never one claim's whole promise beside usage counted against the other.

    e.g. claims of 16 and 8 GiB, the pod holding 20 GiB: 16 and 4 GiB taken (0 and 4 GiB
    outstanding), where giving all 20 to one of them left the other's 8 or 16 outstanding.
    """
    here = [c for c in claims if any(d.gpu_uuid == gpu_uuid for d in c.devices)]
    taken: dict[tuple[str, str], int] = {}
    left = used_bytes
    for i, claim in enumerate(here):
        promised = sum(d.claimed.memory_bytes for d in claim.devices if d.gpu_uuid == gpu_uuid)
        share = left if i == len(here) - 1 else min(left, promised)
        taken[(claim.ref.uid, gpu_uuid)] = share
        left -= share
    return taken


@dataclass(frozen=True, slots=True, eq=False)
class Waiter:
    """A prepare waiting in line for its bytes (compared by identity: one per call)."""

    ref: ClaimRef
    claimed: tuple[ClaimedDevice, ...]
    alive: Callable[[], bool] | None = None
    """False once the call that asked ended (kubelet cancelled it): it leaves the line."""


def waiting_ahead(line: Sequence[Waiter], waiter: Waiter, device: str) -> dict[str, int]:
    """What the waiters before ``waiter`` in ``line`` (all of them while it is not in line
    yet) ask for on ``device``, by the claim's ``namespace/name``."""
    before = line[: line.index(waiter)] if waiter in line else line
    out: dict[str, int] = {}
    for w in before:
        asked = sum(d.memory_bytes for d in w.claimed if d.device == device)
        if asked > 0:
            out[w.ref.named] = out.get(w.ref.named, 0) + asked
    return out


def _bytes(n: int) -> str:
    return f"{n} bytes ({gib(n):.2f} GiB)"


def check_free(
    ref: ClaimRef,
    claimed: ClaimedDevice,
    gpu: GpuInfo,
    outstanding: Mapping[str, int],
    ahead: Mapping[str, int] | None = None,
) -> None:
    """Passes when ``claimed`` fits in ``gpu``'s free memory less ``outstanding`` and what
    the prepares waiting ``ahead`` of it ask for; otherwise ``BytesNotFree`` with the
    numbers and what holds the rest."""
    promised, asked = sum(outstanding.values()), sum((ahead or {}).values())
    available = gpu.free_bytes - promised - asked
    if claimed.memory_bytes <= available:
        return
    held = [f"{who}: {_bytes(n)} promised, not yet taken" for who, n in sorted(outstanding.items())]
    held += [f"{who}: {_bytes(n)} asked, waiting ahead" for who, n in sorted((ahead or {}).items())]
    held += [f"pid {p.pid}: {_bytes(p.used_bytes or 0)}" for p in gpu.processes]
    waiters = f" and {_bytes(asked)} are asked by prepares waiting ahead of it" if asked else ""
    raise BytesNotFree(
        f"claim {ref}: device {claimed.device} (GPU {gpu.index}, {gpu.uuid}) needs "
        f"{_bytes(claimed.memory_bytes)} but {_bytes(max(0, available))} are free for it: NVML "
        f"shows {_bytes(gpu.free_bytes)} free of {_bytes(gpu.total_bytes)} and "
        f"{_bytes(promised)} are promised to prepared claims{waiters}. Held: "
        f"{'; '.join(held) or 'nothing NVML reports per process'}. kubelet retries the "
        "prepare and the pod starts once the memory is free; stop what holds it, or delete "
        "the pod to have it placed again",
        field="consumedCapacity.memory",
        value=claimed.memory_bytes,
    )
