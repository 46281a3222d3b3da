"""Which GPU memory belongs to a worker (pure).

A worker is a process tree (``gatekeeper.gpus.proctree.process_tree``): vLLM's API server,
its engine core and one process per tensor-parallel rank. Its memory on each GPU is
the sum of NVML's per-process usage over the tree's pids (``tree_usage``).

When the sidecar does not share the workers' PID namespace (a container without
``hostPID``), NVML's pids are the host's and match nothing here. The snapshot says so
(``InventorySnapshot.pid_namespace_mismatch``, from ``pid_namespace_note``), and
``worker_usage`` falls back to the per-GPU used-memory delta since the worker was
launched on the GPUs gatekeeper gave it. The delta also counts any other process that
started on those GPUs meanwhile; with one worker per GPU it is exact.

Example: a TP=2 worker whose ranks (pids 11, 12) hold 30 GiB on GPUs 0 and 1 gives
``tree_usage(snapshot, {10, 11, 12}) == {0: 30 GiB, 1: 30 GiB}``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gatekeeper.gpus.inventory import InventorySnapshot

__all__ = ["WorkerUsage", "pid_namespace_note", "tree_usage", "worker_usage"]


def tree_usage(snapshot: InventorySnapshot, pids: Collection[int]) -> dict[int, int]:
    """Bytes held by ``pids`` on each GPU (NVML index → bytes); GPUs they do not use
    are absent. Processes whose usage the driver does not report count as 0."""
    usage: dict[int, int] = {}
    for gpu in snapshot.gpus:
        held = [p.used_bytes or 0 for p in gpu.processes if p.pid in pids]
        if held:
            usage[gpu.index] = sum(held)
    return usage


@dataclass(frozen=True, slots=True)
class WorkerUsage:
    """A worker's memory per GPU, and how it was measured."""

    per_gpu_bytes: tuple[tuple[int, int], ...]
    """(NVML index, bytes) pairs in index order."""
    method: Literal["pid", "delta", "none"]
    """``pid``: NVML per-process usage over the tree; ``delta``: used memory now less
    at launch (PID namespace mismatch); ``none``: nothing attributable yet."""
    note: str

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.per_gpu_bytes)


def worker_usage(
    snapshot: InventorySnapshot,
    pids: Collection[int],
    *,
    gpu_indices: Iterable[int] = (),
    baseline_used_bytes: Mapping[int, int] | None = None,
) -> WorkerUsage:
    """Attribute memory to a worker: by pid when the pids match, else by delta.

    ``gpu_indices`` are the GPUs gatekeeper gave the worker and
    ``baseline_used_bytes`` their ``used_bytes`` just before launch.
    """
    by_pid = tree_usage(snapshot, pids)
    reported = any(
        p.used_bytes is not None for g in snapshot.gpus for p in g.processes if p.pid in pids
    )
    if by_pid and reported:
        return WorkerUsage(tuple(sorted(by_pid.items())), "pid", "NVML per-process usage")
    blind = snapshot.pid_namespace_mismatch or (bool(by_pid) and not reported)
    if blind and baseline_used_bytes is not None:
        deltas = []
        for index in sorted(set(gpu_indices)):
            gpu = next((g for g in snapshot.gpus if g.index == index and g.healthy), None)
            if gpu is not None and index in baseline_used_bytes:
                deltas.append((index, max(0, gpu.used_bytes - baseline_used_bytes[index])))
        return WorkerUsage(
            tuple(deltas),
            "delta",
            "pids do not match NVML's (PID namespace) or usage is not reported: "
            "used memory since launch on the worker's GPUs, including any other process "
            "that started there",
        )
    return WorkerUsage((), "none", "no process of the worker holds GPU memory yet")


def pid_namespace_note(
    pids: Iterable[int], pid_exists: Callable[[int], bool]
) -> tuple[bool, str | None]:
    """Whether the driver's pids look foreign to this PID namespace, and a note.

    Any GPU process pid that is not a process here means the driver reports another
    namespace's pids (a process exiting between the two readings could also do it;
    the next snapshot clears that).
    """
    seen = sorted(set(pids))
    absent = [pid for pid in seen if not pid_exists(pid)]
    if not absent:
        return False, None
    shown = ", ".join(str(p) for p in absent[:5]) + (", ..." if len(absent) > 5 else "")
    return True, (
        f"{len(absent)} of {len(seen)} GPU process pids ({shown}) are not processes in "
        "gatekeeper's PID namespace (a container without hostPID?); worker memory is "
        "attributed by per-GPU used-memory deltas instead of by pid"
    )
