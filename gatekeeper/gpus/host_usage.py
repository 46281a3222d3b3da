"""A worker's actual host memory: the sum over its process tree.

vLLM's API server, its engine core and one process per rank each hold host memory (the
Python interpreter, torch and, on a GPU build, the CUDA libraries; pinned buffers for CPU
offload, KV offloading and sleeping weights). ``tree_host_bytes`` adds up, for the pids
of a tree (``gatekeeper.gpus.proctree.process_tree``), each process's ``Pss`` from
``/proc/<pid>/smaps_rollup``: proportional set size, which splits a page shared by
several processes (the libraries every process of the tree maps) between them, so the sum
is what the tree holds, not each library once per process as RSS would count it. A
kernel without ``smaps_rollup`` (before 4.14) gives ``VmRSS`` from ``/proc/<pid>/status``
instead; a process that exits while being read counts 0. ``proc_root`` lets tests point
at a fixture tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gatekeeper.gpus.proctree import PROC

__all__ = ["process_host_bytes", "tree_host_bytes"]


def process_host_bytes(pid: int, proc_root: Path = PROC) -> int:
    """One process's host bytes (PSS, else RSS); 0 when it is gone or unreadable."""
    base = proc_root / str(pid)
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            text = (base / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(key):
                words = line.split()
                return int(words[1]) * 1024 if len(words) >= 2 and words[1].isdigit() else 0
    return 0


def tree_host_bytes(pids: Iterable[int], proc_root: Path = PROC) -> int:
    """The host bytes of every process in ``pids``, added up."""
    return sum(process_host_bytes(pid, proc_root) for pid in pids)
