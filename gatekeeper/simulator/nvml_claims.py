"""The simulator's memory claims in the stand-in NVML driver's state file.

Part of the gatekeeper simulator (``gatekeeper.simulator``), which stands in for
``vllm serve`` in rehearsals and tests; none of this touches a real GPU. The stand-in
driver (``gatekeeper/gpus/stand_in/fake_nvml.c``) serves GPUs and processes from a text file
that it re-reads on every NVML call::

    gpu|<uuid>|<name>|<pci bus id>|<total>|<reserved>|<used>|<mig 0/1>
    proc|<gpu position>|<pid>|<used bytes or "na">

A simulator *claims* memory by adding ``proc`` lines for its pids and raising the
``used`` field of those ``gpu`` lines, and *releases* it by undoing both. Several
simulators share one file: every read-modify-write holds an exclusive ``fcntl.flock``
on ``<state>.lock`` and replaces the file atomically (temporary file + ``os.replace``),
so the driver never reads half a file. Each claim is also recorded as a comment line
``# gatekeeper-simulator|<pid>|<pid>`` (the driver skips ``#`` lines); the claims of
simulators whose processes are all gone (killed together, so nothing could release
them) are pruned by the next simulator that writes, as a driver frees a dead process's
memory.

Run as ``python -m gatekeeper.simulator.nvml_claims PARENT_PID [STATE]``, this module is the
simulator's child process (its "engine core"): it holds part of the claim under its
own pid, waits for its standard input to close (the parent exited, even by SIGKILL),
then releases both pids' claims and exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MARKER",
    "Claim",
    "DeviceMemory",
    "claim",
    "gpu_uuids",
    "lock_path",
    "release",
    "visible_positions",
]

MARKER = "# gatekeeper-simulator"
"""Prefix of the comment line that records which pids a simulator claimed for."""


@dataclass(frozen=True, slots=True)
class Claim:
    """``used_bytes`` held by ``pid`` on the GPU at ``position`` (its NVML index)."""

    position: int
    pid: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One GPU as CUDA would report it at start-up (``cudaMemGetInfo``)."""

    position: int
    total_bytes: int
    """Total minus the driver's reserved memory."""
    free_bytes: int


def lock_path(state: Path) -> Path:
    """The lock file next to the state file."""
    return state.with_name(state.name + ".lock")


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[list[str]]:
    """Hold the lock, yield the state's lines for editing, write them back if changed."""
    with open(lock_path(state), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lines = state.read_text().splitlines()
        before = list(lines)
        yield lines
        if lines != before:
            temporary = state.with_name(f".{state.name}.{os.getpid()}.tmp")
            temporary.write_text("\n".join(lines) + "\n")
            os.replace(temporary, state)


def _gpu_line_indices(lines: Sequence[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith("gpu|")]


def _devices(lines: Sequence[str]) -> list[DeviceMemory]:
    devices = []
    for position, i in enumerate(_gpu_line_indices(lines)):
        fields = lines[i].split("|")
        total, reserved, used = int(fields[4]), int(fields[5]), int(fields[6])
        devices.append(DeviceMemory(position, total - reserved, total - reserved - used))
    return devices


def _add_used(lines: list[str], position: int, delta: int) -> None:
    gpus = _gpu_line_indices(lines)
    if position >= len(gpus):
        return
    fields = lines[gpus[position]].split("|")
    fields[6] = str(max(0, int(fields[6]) + delta))
    lines[gpus[position]] = "|".join(fields)


def _release_lines(lines: list[str], pids: set[int]) -> None:
    kept: list[str] = []
    freed: dict[int, int] = {}
    for line in lines:
        fields = line.split("|")
        if fields[0] == "proc" and len(fields) >= 4 and int(fields[2]) in pids:
            if fields[3] != "na":
                freed[int(fields[1])] = freed.get(int(fields[1]), 0) + int(fields[3])
        elif not (fields[0] == MARKER and any(int(p) in pids for p in fields[1:])):
            kept.append(line)
    for position, freed_bytes in freed.items():
        _add_used(kept, position, -freed_bytes)
    lines[:] = kept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prune_dead(lines: list[str]) -> None:
    dead: set[int] = set()
    for line in lines:
        fields = line.split("|")
        if fields[0] == MARKER:
            pids = {int(p) for p in fields[1:]}
            if not any(_alive(p) for p in pids):
                dead |= pids
    if dead:
        _release_lines(lines, dead)


def claim(
    state: Path,
    claims: Sequence[Claim] | Callable[[list[DeviceMemory]], Sequence[Claim]],
    check: Callable[[list[DeviceMemory]], None] = lambda devices: None,
) -> list[DeviceMemory]:
    """Add ``claims`` to the state file; returns the GPUs as they were before.

    ``check`` sees the GPUs before the claim, under the lock, and may raise to abort
    it (the simulator's free-memory check), leaving the file unchanged. ``claims`` may be
    a function of the GPUs, called after ``check`` (a vLLM 0.34 worker takes what is free).
    """
    with _locked(state) as lines:
        _prune_dead(lines)
        devices = _devices(lines)
        check(devices)
        if callable(claims):
            claims = claims(devices)
        for c in claims:
            lines.append(f"proc|{c.position}|{c.pid}|{c.used_bytes}")
            _add_used(lines, c.position, c.used_bytes)
        pids = sorted({c.pid for c in claims})
        lines.append("|".join([MARKER, *(str(p) for p in pids)]))
    return devices


def release(state: Path, pids: Iterable[int]) -> None:
    """Remove every claim of ``pids`` (idempotent; a missing file is left alone)."""
    if not state.exists():
        return
    with _locked(state) as lines:
        _release_lines(lines, set(pids))


def visible_positions(value: str | None, count: int, uuids: Sequence[str]) -> list[int]:
    """The GPU positions a process sees through ``CUDA_VISIBLE_DEVICES``, first ``count``.

    Entries are NVML indices (the launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) or
    UUID prefixes; unset means every GPU. Raises ``ValueError`` when fewer are visible.
    """
    if value is None:
        positions = list(range(len(uuids)))
    else:
        positions = []
        for token in (t.strip() for t in value.split(",") if t.strip()):
            if token.isdigit():
                positions.append(int(token))
            else:
                matches = [i for i, u in enumerate(uuids) if u.startswith(token)]
                positions.extend(matches[:1])
    if len(positions) < count or any(p >= len(uuids) for p in positions[:count]):
        raise ValueError(
            f"please set tensor_parallel_size * pipeline_parallel_size ({count}) to at most "
            f"the number of visible GPUs ({len(positions)}; CUDA_VISIBLE_DEVICES={value!r})"
        )
    return positions[:count]


def gpu_uuids(state: Path) -> list[str]:
    """The UUIDs of the state file's GPUs, in position order."""
    return [
        line.split("|")[1] for line in state.read_text().splitlines() if line.startswith("gpu|")
    ]


def _watch(argv: Sequence[str]) -> None:
    """The child: wait for the parent to go, then release both pids' claims."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C: go quietly, the parent cleans up
    parent = int(argv[0])
    sys.stdin.buffer.read()
    if len(argv) > 1:
        release(Path(argv[1]), {parent, os.getpid()})


if __name__ == "__main__":
    _watch(sys.argv[1:])
