"""The stand-in NVML driver: build ``fake_nvml.c`` and write its state file.

Shipped in the package, as httpx ships ``MockTransport``, so that the tests, the
benchmarks and demos drive the real ``pynvml`` against the same stand-in (the suite
builds it; gcc is needed). It is never loaded unless a caller preloads it.

``build_stub(directory)`` compiles ``libnvidia-ml.so.1`` with gcc; ``FakeNvml.set``
writes the GPUs, processes and injected failures it serves (re-read on every NVML
call). In-process, ``preload`` loads the library by full path before pynvml's first
``nvmlInit``, so that pynvml's ``CDLL("libnvidia-ml.so.1")`` finds it by soname; a
subprocess gets it through ``LD_LIBRARY_PATH`` (``subprocess_env``).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.gpus.products import lookup_gpu

__all__ = [
    "H100_RESERVED_BYTES",
    "H100_TOTAL_BYTES",
    "PYNVML_HAS_PROCESSES_V2",
    "SONAME",
    "STATE_ENV",
    "FakeFailure",
    "FakeGpu",
    "FakeNvml",
    "FakeProcess",
    "build_stub",
    "h100",
    "preload",
    "subprocess_env",
    "write_state",
]

SOURCE = Path(__file__).with_name("fake_nvml.c")
SONAME = "libnvidia-ml.so.1"
STATE_ENV = "FAKE_NVML_STATE"

H100_TOTAL_BYTES = 81559 * 1024 * 1024
"""nvidia-smi's total for an H100 80GB HBM3 (81559 MiB)."""
H100_RESERVED_BYTES = H100_TOTAL_BYTES - lookup_gpu("H100-80GB").total_bytes
"""Driver-reserved bytes that leave the GPU table's 79.19 GiB visible to CUDA."""

PYNVML_HAS_PROCESSES_V2 = importlib.util.find_spec("pynvml") is not None and hasattr(
    importlib.import_module("pynvml"), "nvmlDeviceGetComputeRunningProcesses_v2"
)
"""nvidia-ml-py 13 binds ``nvmlDeviceGetComputeRunningProcesses_v2``; 12.x binds only
``_v3``, so with it an older driver's process list cannot be read."""

# NVML return codes used by the tests.
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999


@dataclass(frozen=True, slots=True)
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    total_bytes: int = H100_TOTAL_BYTES
    reserved_bytes: int = H100_RESERVED_BYTES
    used_bytes: int = 0
    mig: bool = False


@dataclass(frozen=True, slots=True)
class FakeProcess:
    gpu: int
    """Position of the GPU in the state's GPU list (its NVML index)."""
    pid: int
    used_bytes: int | None
    """``None`` is NVML's "not available"."""


@dataclass(frozen=True, slots=True)
class FakeFailure:
    code: int
    symbol: str = "*"
    """The C symbol that fails (``nvmlDeviceGetMemoryInfo_v2``), or ``*`` for all."""
    gpu: int | None = None
    """The GPU position it fails for, ``None`` for every GPU and the system calls."""


def h100(index: int, *, used_bytes: int = 0, mig: bool = False) -> FakeGpu:
    """An H100 80GB with a recognisable UUID and PCI bus id."""
    return FakeGpu(
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}",
        pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        used_bytes=used_bytes,
        mig=mig,
    )


def build_stub(directory: Path, defines: Sequence[str] = ()) -> Path:
    """Compile the stand-in into ``directory/libnvidia-ml.so.1``; needs gcc."""
    compiler = shutil.which("gcc")
    if compiler is None:
        raise FileNotFoundError("gcc is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / SONAME
    command = [
        compiler,
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fPIC",
        "-shared",
        f"-Wl,-soname,{SONAME}",
        *(f"-D{d}" for d in defines),
        "-o",
        str(output),
        str(SOURCE),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building the NVML stand-in failed:\n{result.stderr}")
    return output


def write_state(
    path: Path,
    gpus: Iterable[FakeGpu],
    processes: Iterable[FakeProcess] = (),
    failures: Iterable[FakeFailure] = (),
    *,
    driver: str = "550.54.15",
    nvml: str = "12.550.54.15",
) -> None:
    """Write the stand-in's state file atomically (a reader never sees half of it)."""
    lines = [f"driver|{driver}", f"nvml|{nvml}"]
    for g in gpus:
        if g.reserved_bytes + g.used_bytes > g.total_bytes:
            raise ValueError(f"{g.uuid}: reserved + used exceeds total")
        lines.append(
            f"gpu|{g.uuid}|{g.name}|{g.pci_bus_id}|{g.total_bytes}|{g.reserved_bytes}"
            f"|{g.used_bytes}|{int(g.mig)}"
        )
    for p in processes:
        used = "na" if p.used_bytes is None else str(p.used_bytes)
        lines.append(f"proc|{p.gpu}|{p.pid}|{used}")
    for f in failures:
        lines.append(f"fail|{f.symbol}|{'*' if f.gpu is None else f.gpu}|{f.code}")
    temporary = path.with_suffix(".tmp")
    temporary.write_text("\n".join(lines) + "\n")
    os.replace(temporary, path)


class FakeNvml:
    """A test's handle on the stand-in: its state file and the loaded library."""

    def __init__(self, state_path: Path, library: ctypes.CDLL) -> None:
        self.state_path = state_path
        self.library = library

    def set(
        self,
        gpus: Iterable[FakeGpu],
        processes: Iterable[FakeProcess] = (),
        failures: Iterable[FakeFailure] = (),
    ) -> None:
        write_state(self.state_path, gpus, processes, failures)

    def init_count(self) -> int:
        """NVML initialisations not yet matched by a shutdown."""
        return int(self.library.fakeNvmlInitCount())


_preloaded: dict[Path, ctypes.CDLL] = {}


def preload(library_path: Path) -> ctypes.CDLL:
    """Load the stand-in in this process so pynvml's ``CDLL(SONAME)`` resolves to it.

    pynvml keeps its library for the life of the process, so this must happen before
    the first ``nvmlInit``; ``RuntimeError`` when another libnvidia-ml won the race.
    """
    import pynvml

    if library_path not in _preloaded:
        _preloaded[library_path] = ctypes.CDLL(str(library_path))
    by_soname = ctypes.CDLL(SONAME)
    loaded = getattr(pynvml, "nvmlLib", None)
    for library in (by_soname, loaded):
        if library is not None and not hasattr(library, "fakeNvmlInitCount"):
            raise RuntimeError("a real libnvidia-ml.so.1 was loaded in this process first")
    return _preloaded[library_path]


def subprocess_env(library_dir: Path | None, state_path: Path | None) -> dict[str, str]:
    """An environment in which a child process loads the stand-in from ``library_dir``
    (or no NVML at all when ``None``) and reads ``state_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["LD_LIBRARY_PATH"] = str(library_dir) if library_dir is not None else ""
    if state_path is not None:
        env[STATE_ENV] = str(state_path)
    else:
        env.pop(STATE_ENV, None)
    return env
