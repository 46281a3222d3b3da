"""Whether a claim's allocation books what this node published (pure).

kube-scheduler allocates a device of consumable capacity only within what the node's
ResourceSlice publishes: ``consumedCapacity.memory`` at least the request policy's
``min``, at most its ``max`` and the device's ``capacity.memory.value``, on the policy's
``step`` (or one of its ``validValues``). A claim's ``status.allocation`` is not only the
scheduler's to write, though (anyone with ``update`` on ``resourceclaims/status`` can), so
the kubelet plugin checks every allocation against the slice before it prepares it:
``check_published`` refuses, with the numbers, a device the slice does not list, a
booking of zero or fewer bytes (or none at all: a device that allows several allocations
would otherwise be shared with nothing booked), one above the device's capacity, and one
its request policy does not allow.

Example: an H100 published with 82785435648 bytes (77.10 GiB) in 1 MiB steps from 1 MiB:
an allocation of ``79Gi`` (84825604096 bytes), ``0``, ``-5Gi`` or ``1073741825`` is
refused; ``12Gi`` passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.prepared import ClaimedDevice, ClaimRef, PrepareError
from gatekeeper.units import format_gib

__all__ = ["PublishedMemory", "check_published", "published_memory"]

_TODO = (
    "kube-scheduler never allocates that, so the claim's status.allocation was written by "
    "something else; delete the claim (or its pod, for a claim made from a template) so "
    "that the scheduler allocates it again"
)


@dataclass(frozen=True, slots=True)
class PublishedMemory:
    """A device's ``memory`` capacity as its slice publishes it."""

    capacity_bytes: int
    min_bytes: int | None = None
    max_bytes: int | None = None
    step_bytes: int | None = None
    valid_bytes: tuple[int, ...] = ()
    """``requestPolicy.validValues`` (empty: a range, or no policy)."""

    def refusal(self, booked: int) -> str | None:
        """Why ``booked`` bytes are not a booking the scheduler could make, or None."""
        if booked <= 0:
            return "a device shared by several claims is booked a positive number of bytes"
        if booked > self.capacity_bytes:
            return "that is above the device's published capacity"
        if self.valid_bytes and booked not in self.valid_bytes:
            listed = ", ".join(str(v) for v in self.valid_bytes[:8])
            return f"its request policy allows only {listed} bytes"
        low = self.min_bytes if self.min_bytes is not None else 0
        if booked < low or (self.max_bytes is not None and booked > self.max_bytes):
            top = self.max_bytes if self.max_bytes is not None else self.capacity_bytes
            return f"its request policy allows {low} to {top} bytes"
        if self.step_bytes and (booked - low) % self.step_bytes:
            return f"its request policy allows steps of {self.step_bytes} bytes from {low}"
        return None


def _bytes(n: int) -> str:
    return f"{n} bytes ({format_gib(n)})"


def _quantity(value: object, to_bytes: Callable[[str], int]) -> int | None:
    return to_bytes(str(value)) if isinstance(value, str | int) else None


def published_memory(
    slice_: Mapping[str, Any], to_bytes: Callable[[str], int]
) -> dict[str, PublishedMemory]:
    """The ``memory`` capacity of each device of ``slice_`` that publishes one, by name."""
    out: dict[str, PublishedMemory] = {}
    for device in (slice_.get("spec") or {}).get("devices") or []:
        memory = (device.get("capacity") or {}).get("memory")
        capacity = _quantity(memory.get("value"), to_bytes) if memory else None
        if memory is None or capacity is None:
            continue
        policy = memory.get("requestPolicy") or {}
        span = policy.get("validRange") or {}
        values = [_quantity(v, to_bytes) for v in policy.get("validValues") or []]
        out[str(device.get("name"))] = PublishedMemory(
            capacity,
            _quantity(span.get("min"), to_bytes),
            _quantity(span.get("max"), to_bytes),
            _quantity(span.get("step"), to_bytes),
            tuple(v for v in values if v is not None),
        )
    return out


def check_published(
    ref: ClaimRef,
    claimed: Iterable[ClaimedDevice],
    published: Mapping[str, Any] | None,
    to_bytes: Callable[[str], int],
    what: str,
) -> None:
    """Passes when each of ``claimed`` books what the node's slice ``published`` (None:
    none is published) lets the scheduler book on its device; ``PrepareError`` otherwise,
    with the device, the bytes booked and what was published. ``what`` names the slice."""
    if published is None:
        raise PrepareError(
            f"claim {ref}: {what} is not published, so its allocation cannot be checked "
            "against it; kubelet retries the prepare once the node agent has published it",
            field="resourceslice",
            value=what,
        )
    devices = published_memory(published, to_bytes)
    for device in claimed:
        memory = devices.get(device.device)
        if memory is None:
            raise PrepareError(
                f"claim {ref}: device {device.device} is not published with a memory "
                f"capacity in {what} (it lists {', '.join(sorted(devices)) or 'none'}); "
                f"{_TODO}",
                field="status.allocation.devices.results.device",
                value=device.device,
            )
        why = memory.refusal(device.memory_bytes)
        if why is not None:
            raise PrepareError(
                f"claim {ref}: request {device.request} books {_bytes(device.memory_bytes)} "
                f"(consumedCapacity.memory) on device {device.device}, but {why} ({what}: "
                f"capacity {_bytes(memory.capacity_bytes)}); {_TODO}",
                field="consumedCapacity.memory",
                value=device.memory_bytes,
            )
