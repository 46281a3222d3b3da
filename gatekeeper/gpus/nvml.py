"""``NvmlInventory``: the GPU inventory read from the NVIDIA driver through ``pynvml``.

This is the only module that imports ``pynvml`` (NVIDIA's ``nvidia-ml-py``), and the
place where NVML's structs become ``GpuInfo`` bytes. NVML is initialised once (on the
first ``snapshot`` or ``open``) and shut down by ``close`` or the ``with`` block.

- Memory: ``nvmlDeviceGetMemoryInfo_v2`` (total, reserved, free, used); when the
  driver lacks it (``FUNCTION_NOT_FOUND``, ``ARGUMENT_VERSION_MISMATCH``,
  ``NOT_SUPPORTED``) the v1 call, whose ``used`` includes the reserved memory.
- Processes: ``nvmlDeviceGetComputeRunningProcesses_v3``, then ``_v2``; a driver that
  lists none (``NOT_SUPPORTED``) leaves the list empty with a note.
- MIG: a GPU whose current MIG mode is enabled is fenced (``fence_reason``); its
  instances are not offered for placement.
- Errors: a GPU that answers with an NVML error is reported unhealthy with the error
  name, its text and the call; a failure of the node-wide calls gives a failed
  snapshot. ``snapshot`` never raises.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import Any

from gatekeeper.errors import NvmlUnavailable
from gatekeeper.gpus.attribution import pid_namespace_note
from gatekeeper.gpus.inventory import GpuInfo, GpuProcess, InventorySnapshot, failed_snapshot
from gatekeeper.gpus.proctree import pid_exists as process_exists
from gatekeeper.gpus.visible_devices import (
    VisibleDevicesError,
    parse_visible_devices,
    select_devices,
)

__all__ = ["NO_GPU_HINT", "NvmlInventory"]

NO_GPU_HINT = (
    "To plan without a GPU, declare the node: `gatekeeper gpus --node 2xH100-80GB`, or set "
    "GATEKEEPER_GPUS to a declared node (2xH100-80GB, 1xA100-40GB,1xL4) or a JSON file of GPUs"
)
_FALLBACK_CODES = ("NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED")
_VERSION_CODES = (*_FALLBACK_CODES, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)


class NvmlInventory:
    """A ``GpuInventory`` over the NVIDIA driver.

    ``visible_devices`` is the sidecar's ``CUDA_VISIBLE_DEVICES`` as given (``None``
    when unset); ``pid_exists`` checks a pid in this PID namespace; ``clock`` times
    the snapshot. Construct it, then use it as a context manager::

        with NvmlInventory(visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES")) as nvml:
            snapshot = nvml.snapshot()
    """

    def __init__(
        self,
        *,
        visible_devices: str | None = None,
        pid_exists: Callable[[int], bool] = process_exists,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._visible_value = visible_devices
        self._tokens = parse_visible_devices(visible_devices)
        self._pid_exists = pid_exists
        self._clock = clock
        self._nv: Any = None
        self._names: dict[int, str] = {}
        self._uuids: dict[int, str] = {}
        self._initialized = False
        self._lock = threading.Lock()

    def __enter__(self) -> NvmlInventory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        """Initialise NVML now; ``NvmlUnavailable`` says why it cannot and what to do."""
        with self._lock:
            self._ensure_open()

    def close(self) -> None:
        """Shut NVML down if this inventory initialised it. Safe to call twice."""
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()

    def snapshot(self) -> InventorySnapshot:
        start = self._clock()
        with self._lock:
            try:
                self._ensure_open()
                snapshot = self._read()
            except (NvmlUnavailable, VisibleDevicesError) as e:
                snapshot = failed_snapshot(str(e), source="nvml")
            except Exception as e:  # the sidecar must never crash on an NVML error
                snapshot = failed_snapshot(self._describe_failure(e), source="nvml")
        return replace(snapshot, duration_seconds=self._clock() - start)

    def _ensure_open(self) -> None:
        if self._initialized:
            return
        if self._nv is None:
            self._nv = _load_bindings()
            self._names = {
                getattr(self._nv, n): n for n in dir(self._nv) if n.startswith("NVML_ERROR_")
            }
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as e:
            code = self._name(e)
            raise NvmlUnavailable(
                _unavailable_message(code, str(e)), field="nvmlInit", value=code
            ) from e
        self._initialized = True

    def _name(self, error: BaseException) -> str:
        return _error_name(self._names, error)

    def _describe_failure(self, error: Exception) -> str:
        if self._nv is not None and isinstance(error, self._nv.NVMLError):
            return (
                f"NVML failed to list the GPUs: {self._name(error)} ({error}); the driver may "
                "be restarting or broken: check `nvidia-smi`, and the next snapshot retries"
            )
        return (
            f"reading the GPUs failed unexpectedly: {type(error).__name__}: {error}; "
            "check `nvidia-smi` and report this with the driver version"
        )

    def _read(self) -> InventorySnapshot:
        nv = self._nv
        notes: list[str] = []
        count = int(nv.nvmlDeviceGetCount())
        indices: tuple[int, ...] = tuple(range(count))
        if self._tokens is not None:
            indices = self._select(count)
            notes.append(
                f"managing GPUs {', '.join(map(str, indices)) or 'none'} of {count} "
                f"(CUDA_VISIBLE_DEVICES={self._visible_value!r})"
            )
        gpus = tuple(_GpuReader(nv, self._names, i, notes).read() for i in indices)
        mismatch, note = pid_namespace_note(
            (p.pid for g in gpus for p in g.processes), self._pid_exists
        )
        if note:
            notes.append(note)
        return InventorySnapshot(
            gpus=gpus,
            ok=True,
            source="nvml",
            driver_version=self._optional_text("nvmlSystemGetDriverVersion", notes),
            nvml_version=self._optional_text("nvmlSystemGetNVMLVersion", notes),
            pid_namespace_mismatch=mismatch,
            notes=tuple(dict.fromkeys(notes)),
        )

    def _select(self, count: int) -> tuple[int, ...]:
        assert self._tokens is not None
        by_uuid = any(not t.isdigit() for t in self._tokens)
        identities = [(i, self._uuid(i) if by_uuid else None) for i in range(count)]
        return select_devices(self._tokens, identities, value=self._visible_value or "")

    def _uuid(self, index: int) -> str | None:
        """The GPU's UUID, or the one it last reported when it does not answer now (a
        lost GPU named by UUID stays managed, and is reported unhealthy)."""
        try:
            uuid = _text(self._nv.nvmlDeviceGetUUID(self._nv.nvmlDeviceGetHandleByIndex(index)))
        except self._nv.NVMLError:
            return self._uuids.get(index)
        self._uuids[index] = uuid
        return uuid

    def _optional_text(self, call: str, notes: list[str]) -> str | None:
        try:
            return _text(getattr(self._nv, call)())
        except self._nv.NVMLError as e:
            notes.append(f"{call} failed: {self._name(e)} ({e})")
            return None


class _GpuReader:
    """Reads one GPU, remembering the call in progress for the error message."""

    def __init__(self, nv: Any, names: dict[int, str], index: int, notes: list[str]) -> None:
        self.nv = nv
        self.names = names
        self.index = index
        self.notes = notes
        self.step = ""
        self.uuid = ""
        self.name = ""
        self.pci_bus_id = ""

    def call(self, step: str, function: str, *args: Any, **kwargs: Any) -> Any:
        self.step = step
        return getattr(self.nv, function)(*args, **kwargs)

    def code(self, error: BaseException) -> str:
        return _error_name(self.names, error)

    def read(self) -> GpuInfo:
        try:
            return self._read()
        except self.nv.NVMLError as e:
            return GpuInfo(
                index=self.index,
                uuid=self.uuid,
                name=self.name,
                pci_bus_id=self.pci_bus_id,
                total_bytes=0,
                free_bytes=0,
                used_bytes=0,
                healthy=False,
                error=f"{self.code(e)} ({e}) from {self.step}",
            )

    def _read(self) -> GpuInfo:
        handle = self.call(
            "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex", self.index
        )
        self.uuid = _text(self.call("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", handle))
        self.name = _text(self.call("nvmlDeviceGetName", "nvmlDeviceGetName", handle))
        self.pci_bus_id = self._pci_bus_id(handle)
        fence = self._fence_reason(handle)
        total, free, used, reserved = self._memory(handle)
        return GpuInfo(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            pci_bus_id=self.pci_bus_id,
            total_bytes=total,
            free_bytes=free,
            used_bytes=used,
            driver_reserved_bytes=reserved,
            processes=self._processes(handle),
            fence_reason=fence,
        )

    def _pci_bus_id(self, handle: Any) -> str:
        try:
            return _text(self.call("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo", handle).busId)
        except self.nv.NVMLError as e:
            if self.code(e) not in _FALLBACK_CODES:
                raise
            return ""

    def _fence_reason(self, handle: Any) -> str | None:
        try:
            current, _pending = self.call("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode", handle)
        except self.nv.NVMLError as e:
            if self.code(e) not in _FALLBACK_CODES:
                raise
            return None
        if current != self.nv.NVML_DEVICE_MIG_ENABLE:
            return None
        return (
            "MIG mode is enabled: gatekeeper does not place on MIG instances; disable MIG "
            f"(`nvidia-smi -i {self.index} -mig 0`) to use this GPU, or leave it to other tenants"
        )

    def _memory(self, handle: Any) -> tuple[int, int, int, int | None]:
        try:
            m = self.call(
                "nvmlDeviceGetMemoryInfo_v2",
                "nvmlDeviceGetMemoryInfo",
                handle,
                version=self.nv.nvmlMemory_v2,
            )
            return int(m.total), int(m.free), int(m.used), int(m.reserved)
        except self.nv.NVMLError as e:
            if self.code(e) not in _VERSION_CODES:
                raise
            self.notes.append(
                f"memory info v2 unavailable ({self.code(e)}): used v1, whose used bytes "
                "include the driver-reserved memory"
            )
        m = self.call("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", handle)
        return int(m.total), int(m.free), int(m.used), None

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        raw = self._process_list(handle)
        return tuple(
            GpuProcess(
                pid=int(p.pid),
                used_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            )
            for p in raw
        )

    def _process_list(self, handle: Any) -> list[Any]:
        """The compute processes by the newest call the driver has (``_v3``, then
        ``_v2``); empty, with a note, when it lists none.

        The versioned bindings, not pynvml's unversioned wrapper: nvidia-ml-py 13 turns a
        missing ``_v3`` there into ``NVMLLibraryMismatchError``, which 12.x lacks.
        """
        missing: list[str] = []
        for function in _PROCESS_CALLS:
            if not hasattr(self.nv, function):  # nvidia-ml-py 12.x has no _v2 binding
                missing.append(f"{function}: not in these pynvml bindings")
                continue
            try:
                raw: list[Any] = self.call(function, function, handle)
            except self.nv.NVMLError as e:
                if self.code(e) not in _FALLBACK_CODES:
                    raise
                missing.append(f"{function}: {self.code(e)}")
                continue
            if missing:
                self.notes.append(f"used {function} ({'; '.join(missing)})")
            return raw
        self.notes.append(f"the driver does not list GPU processes ({'; '.join(missing)})")
        return []


def _load_bindings() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(
            "NVML is unavailable: the Python bindings (module pynvml from the nvidia-ml-py "
            f"package) are not installed; `pip install nvidia-ml-py`. {NO_GPU_HINT}.",
            field="pynvml",
            value=e.name,
        ) from e
    return pynvml


def _unavailable_message(code: str, text: str) -> str:
    if code == "NVML_ERROR_LIBRARY_NOT_FOUND":
        what = (
            "the NVIDIA driver's library libnvidia-ml.so.1 was not found: this machine has no "
            "NVIDIA driver that gatekeeper can see (in a container, run it with the NVIDIA "
            "container runtime)"
        )
    elif code == "NVML_ERROR_DRIVER_NOT_LOADED":
        what = "the NVIDIA kernel driver is not loaded (check `nvidia-smi` and `dmesg`)"
    elif code == "NVML_ERROR_NO_PERMISSION":
        what = "gatekeeper may not open the GPU devices (check /dev/nvidia* permissions)"
    else:
        what = "the driver refused to start NVML (check `nvidia-smi`)"
    return f"NVML is unavailable: {what} [{code}: {text}]. {NO_GPU_HINT}."


def _error_name(names: dict[int, str], error: BaseException) -> str:
    """``NVML_ERROR_GPU_IS_LOST`` for pynvml's error with value 15."""
    value = getattr(error, "value", None)
    return names.get(value, f"NVML error {value}") if isinstance(value, int) else ""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
