"""The GPU inventory seam: what a node's GPUs hold, read in one call.

``GpuInventory`` has one method, ``snapshot() -> InventorySnapshot``. Implementations:

- ``gatekeeper.gpus.nvml.NvmlInventory`` reads the NVIDIA driver through ``pynvml``;
- ``gatekeeper.gpus.static.StaticInventory`` serves a fixed snapshot: a recorded one
  (``StaticInventory.from_json(path)``, the JSON ``gatekeeper gpus --json`` prints) or a
  declared node (``gatekeeper.gpus.declared.parse_declared_node("2xH100-80GB")``).

A snapshot carries data and health separately, as an exporter does: ``gpus`` (empty
when the reading failed as a whole), ``ok``, ``error`` and ``duration_seconds``. A GPU
that answered with an error is in the list with ``healthy=False`` and the NVML error
name; a GPU gatekeeper will not place on for another reason (MIG mode) has a
``fence_reason``. Only ``GpuInfo.placeable`` GPUs may receive work.

All sizes are integer bytes. ``total_bytes`` is the driver's total (nvidia-smi's
"Total"); ``driver_reserved_bytes`` is what the driver keeps for itself (NVML's v2
memory info; ``None`` when only v1 is available, in which case ``used_bytes`` includes
it). ``visible_total_bytes`` is total less reserved: what ``cudaMemGetInfo`` and so
vLLM report as total, e.g. 79.19 GiB on an H100 80GB whose driver total is 79.65 GiB.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gatekeeper.errors import GatekeeperError

__all__ = [
    "SNAPSHOT_SCHEMA",
    "GpuInfo",
    "GpuInventory",
    "GpuProcess",
    "InventorySnapshot",
    "SnapshotFormatError",
    "failed_snapshot",
    "read_json_object",
]

SNAPSHOT_SCHEMA = "gatekeeper.inventory/v1"
"""The ``schema`` key of a snapshot's JSON form."""


class SnapshotFormatError(GatekeeperError):
    """A snapshot's JSON form is missing a key or has a value of the wrong type."""


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process holding memory on a GPU, as the driver reports it."""

    pid: int
    """The pid in the driver's PID namespace (the host's, for a containerised sidecar)."""
    used_bytes: int | None
    """Device memory the process holds; ``None`` when the driver does not say
    (NVML's "not available", common in containers without host PIDs)."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU in a snapshot."""

    index: int
    """NVML's index (nvidia-smi's, PCI bus order): the number a worker gets in
    ``CUDA_VISIBLE_DEVICES`` together with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    uuid: str
    name: str
    pci_bus_id: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    driver_reserved_bytes: int | None = None
    """Memory the driver reserves (NVML v2); ``None`` when unknown (v1 fallback)."""
    processes: tuple[GpuProcess, ...] = ()
    healthy: bool = True
    error: str | None = None
    """Why the GPU is unhealthy: the NVML error name, its text and the call."""
    fence_reason: str | None = None
    """Why gatekeeper will not place on a healthy GPU (for example MIG mode)."""

    @property
    def placeable(self) -> bool:
        """Healthy and not fenced: the only GPUs placement may use."""
        return self.healthy and self.fence_reason is None

    @property
    def visible_total_bytes(self) -> int:
        """Total less driver-reserved memory: the total CUDA (and vLLM) reports."""
        return self.total_bytes - (self.driver_reserved_bytes or 0)


@dataclass(frozen=True, slots=True)
class InventorySnapshot:
    """A reading of the node's GPUs, with its own health."""

    gpus: tuple[GpuInfo, ...]
    """The GPUs, healthy or not, in index order; empty when ``ok`` is false."""
    ok: bool
    error: str | None = None
    """Why the reading failed as a whole, and what to do."""
    duration_seconds: float = 0.0
    source: str = "static"
    """Where the reading came from: ``nvml``, ``declared`` or ``static``."""
    driver_version: str | None = None
    nvml_version: str | None = None
    pid_namespace_mismatch: bool = False
    """True when the driver's pids are not this process's (a container without host
    PIDs): attribution by pid is impossible, use per-GPU used-memory deltas."""
    notes: tuple[str, ...] = field(default=())
    """Things worth knowing that are not errors (fallbacks taken, GPUs hidden)."""

    def gpu(self, index: int) -> GpuInfo:
        """The GPU with NVML index ``index``; ``KeyError`` when absent."""
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(index)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (bytes as integers); ``from_dict`` reads it back."""
        return {
            "schema": SNAPSHOT_SCHEMA,
            "source": self.source,
            "ok": self.ok,
            "error": self.error,
            "duration_seconds": self.duration_seconds,
            "driver_version": self.driver_version,
            "nvml_version": self.nvml_version,
            "pid_namespace_mismatch": self.pid_namespace_mismatch,
            "notes": list(self.notes),
            "gpus": [_gpu_to_dict(g) for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "snapshot") -> InventorySnapshot:
        """Read ``to_dict``'s form; ``SnapshotFormatError`` names the bad key."""
        r = _Reader(data, where)
        schema = r.opt(str, "schema")
        if schema is not None and schema != SNAPSHOT_SCHEMA:
            raise SnapshotFormatError(
                f"{where}: schema {schema!r} is not {SNAPSHOT_SCHEMA!r}; "
                "record the snapshot again with `gatekeeper gpus --json`",
                field="schema",
                value=schema,
            )
        gpus = r.req(list, "gpus")
        return cls(
            gpus=tuple(_gpu_from_dict(g, f"{where}: gpus[{i}]") for i, g in enumerate(gpus)),
            ok=r.req(bool, "ok"),
            error=r.opt(str, "error"),
            duration_seconds=float(r.opt((int, float), "duration_seconds") or 0.0),
            source=r.opt(str, "source") or "static",
            driver_version=r.opt(str, "driver_version"),
            nvml_version=r.opt(str, "nvml_version"),
            pid_namespace_mismatch=bool(r.opt(bool, "pid_namespace_mismatch")),
            notes=tuple(str(n) for n in r.opt(list, "notes") or ()),
        )


def failed_snapshot(error: str, *, source: str, duration_seconds: float = 0.0) -> InventorySnapshot:
    """A snapshot for a reading that failed as a whole: no GPUs, ``ok=False``."""
    return InventorySnapshot(
        gpus=(), ok=False, error=error, duration_seconds=duration_seconds, source=source
    )


class GpuInventory(Protocol):
    """Anything that can read the node's GPUs. ``snapshot`` never raises for GPU or
    driver errors: they come back in the snapshot (``ok``/``error``, ``healthy``)."""

    def snapshot(self) -> InventorySnapshot: ...


def read_json_object(path: Path) -> dict[str, Any]:
    """Read a JSON object from ``path``; ``SnapshotFormatError`` says what is wrong."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SnapshotFormatError(
            f"{path}: cannot be read ({e.strerror or e}); give the path of a JSON file of GPUs",
            field="path",
            value=str(path),
        ) from e
    except json.JSONDecodeError as e:
        raise SnapshotFormatError(
            f"{path}: is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "fix the file or record it again with `gatekeeper gpus --json`",
            field="path",
            value=str(path),
        ) from e
    if not isinstance(data, dict):
        raise SnapshotFormatError(
            f"{path}: holds a JSON {type(data).__name__}, not an object with a 'gpus' list",
            field="path",
            value=str(path),
        )
    return data


def _gpu_to_dict(gpu: GpuInfo) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "total_bytes": gpu.total_bytes,
        "free_bytes": gpu.free_bytes,
        "used_bytes": gpu.used_bytes,
        "driver_reserved_bytes": gpu.driver_reserved_bytes,
        "healthy": gpu.healthy,
        "error": gpu.error,
        "fence_reason": gpu.fence_reason,
        "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in gpu.processes],
    }


def _gpu_from_dict(data: object, where: str) -> GpuInfo:
    r = _Reader(data, where)
    processes = []
    for i, raw in enumerate(r.opt(list, "processes") or ()):
        p = _Reader(raw, f"{where}: processes[{i}]")
        processes.append(GpuProcess(pid=p.req(int, "pid"), used_bytes=p.opt(int, "used_bytes")))
    return GpuInfo(
        index=r.req(int, "index"),
        uuid=r.req(str, "uuid"),
        name=r.req(str, "name"),
        pci_bus_id=r.opt(str, "pci_bus_id") or "",
        total_bytes=r.req(int, "total_bytes"),
        free_bytes=r.req(int, "free_bytes"),
        used_bytes=r.req(int, "used_bytes"),
        driver_reserved_bytes=r.opt(int, "driver_reserved_bytes"),
        processes=tuple(processes),
        healthy=r.opt(bool, "healthy") is not False,
        error=r.opt(str, "error"),
        fence_reason=r.opt(str, "fence_reason"),
    )


class _Reader:
    """Typed access to a JSON object, with errors that name the place and the key."""

    __slots__ = ("data", "where")

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise SnapshotFormatError(
                f"{where}: expected a JSON object, got {type(data).__name__}",
                field=where,
                value=data,
            )
        self.data: Mapping[str, Any] = data
        self.where = where

    def req(self, kind: type[Any] | tuple[type[Any], ...], key: str) -> Any:
        if key not in self.data:
            raise SnapshotFormatError(
                f"{self.where}: key {key!r} is missing; add it (see docs/gpus.md for the format)",
                field=key,
            )
        return self.opt(kind, key)

    def opt(self, kind: type[Any] | tuple[type[Any], ...], key: str) -> Any:
        value = self.data.get(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        wrong_bool = isinstance(value, bool) and bool not in kinds
        if value is not None and (wrong_bool or not isinstance(value, kinds)):
            names = " or ".join(k.__name__ for k in kinds)
            raise SnapshotFormatError(
                f"{self.where}: {key} = {value!r} should be {names}; fix the value",
                field=key,
                value=value,
            )
        return value
