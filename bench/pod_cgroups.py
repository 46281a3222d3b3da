"""Real processes in real pod cgroups, for measuring the node agent's per-pod figures.

kubelet puts each pod's processes in a cgroup whose path names the pod's UID
(``.../pod<uid>/...`` with the cgroupfs driver, ``...-pod<uid>.slice`` with systemd's);
the agent reads it back from ``/proc/PID/cgroup`` (``gatekeeper.cluster.pod_cgroup.pod_uid``).
Here one ``sleep`` per pod is moved into ``<root>/gatekeeper-bench-<pid>/pod<uid>``, under
the first writable hierarchy of cgroup v1's ``pids`` controller or cgroup v2's unified
one: root is needed, and nothing is made under kubelet's own ``kubepods``. Everything
made is removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["cgroup_root", "pod_processes"]

_CANDIDATES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def cgroup_root() -> Path | None:
    """A cgroup hierarchy this process may make children in, else None."""
    for root in _CANDIDATES:
        if (root / "cgroup.procs").is_file() and os.access(root, os.W_OK):
            return root
    return None


@contextlib.contextmanager
def pod_processes(uids: Sequence[str]) -> Iterator[dict[str, int]]:
    """One live process per pod UID, each in a cgroup named after its pod: UID -> pid."""
    root = cgroup_root()
    if root is None:
        raise RuntimeError("no writable cgroup hierarchy (run as root on a host with cgroups)")
    base = root / f"gatekeeper-bench-{os.getpid()}"
    base.mkdir()
    sleepers: list[subprocess.Popen[bytes]] = []
    made: list[Path] = []
    try:
        pids = {}
        for uid in uids:
            group = base / f"pod{uid}"
            group.mkdir()
            made.append(group)
            sleeper = subprocess.Popen(["sleep", "3600"])
            sleepers.append(sleeper)
            (group / "cgroup.procs").write_text(f"{sleeper.pid}\n")
            pids[uid] = sleeper.pid
        yield pids
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        for group in reversed(made):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()
