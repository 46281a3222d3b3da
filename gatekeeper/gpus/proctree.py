"""Process trees from ``/proc``: which pids belong to a worker.

vLLM's API server starts an engine-core process, which starts one worker per
tensor-parallel rank; the GPU memory is held by the workers, so a worker's usage is
the sum over its whole tree. ``read_parent_map`` is the only I/O here (one read of
``/proc/<pid>/stat`` per process); ``descendants`` is pure. ``proc_root`` lets tests
point at a fixture tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["PROC", "descendants", "parse_ppid", "pid_exists", "process_tree", "read_parent_map"]

PROC = Path("/proc")


def read_parent_map(proc_root: Path = PROC) -> dict[int, int]:
    """Map every visible pid to its parent pid, from ``<proc_root>/<pid>/stat``.

    Processes that exit while being read are skipped.
    """
    parents: dict[int, int] = {}
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return parents
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = parse_ppid(stat)
        if ppid is not None:
            parents[int(entry.name)] = ppid
    return parents


def parse_ppid(stat: str) -> int | None:
    """The parent pid from a ``/proc/<pid>/stat`` line.

    The command name (field 2) is in parentheses and may contain spaces or ``)``,
    so fields are counted from the last ``)``: ``pid (comm) state ppid ...``.
    """
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


def descendants(root: int, parents: Mapping[int, int]) -> frozenset[int]:
    """``root`` and every process below it, given a pid → parent-pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree = {root}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in tree:
                tree.add(child)
                stack.append(child)
    return frozenset(tree)


def process_tree(root: int, proc_root: Path = PROC) -> frozenset[int]:
    """``root`` and its descendants as they are now."""
    return descendants(root, read_parent_map(proc_root))


def pid_exists(pid: int, proc_root: Path = PROC) -> bool:
    """Whether ``pid`` is a process in this PID namespace."""
    return (proc_root / str(pid)).is_dir()
