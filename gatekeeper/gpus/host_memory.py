"""The node's host memory, read in one call: the second resource beside GPU memory.

``HostMemorySource`` has one method, ``read() -> HostMemory``. ``ProcHostMemory`` reads
it from the kernel's files under a root directory (``/`` on a node; a directory of files a
test or a demo wrote, ``write_host_files``, is the stand-in: the same reader, other
files, as the stand-in NVML driver is the real ``pynvml`` over a state file):

- ``<root>/proc/meminfo``: ``MemTotal`` and ``MemAvailable`` (the kernel's estimate of
  what can be allocated without swapping, page cache that can be dropped included);
- the memory cgroup the reader runs under, from ``<root>/proc/self/cgroup``: cgroup v1
  when a line names the ``memory`` controller (``<root>/sys/fs/cgroup/memory/<path>``,
  ``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``total_inactive_file``), else
  v2 (``0::<path>``, ``<root>/sys/fs/cgroup/<path>``, ``memory.max``,
  ``memory.current``, ``inactive_file``). Every level from the reader's cgroup up to
  the hierarchy's root that has a limit counts, since a parent's limit binds its
  children; a level's headroom is its limit less its working set (usage less inactive
  file pages, as the kubelet counts a container's working set).

``available_bytes`` is the smaller of ``MemAvailable`` and the tightest cgroup headroom.
A reading that fails (no ``meminfo``, a figure that does not parse, a limit file that
cannot be read) has ``ok`` False and the reason in ``error``, never a guess: admission
refuses on it. Sizes are bytes from here on (``meminfo`` speaks kB, i.e. KiB).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "CgroupLimit",
    "HostMemory",
    "HostMemorySource",
    "ProcHostMemory",
    "failed_host_memory",
    "write_host_files",
]

_UNLIMITED = 2**60
"""cgroup v1 writes "no limit" as the page-rounded 2^63 - 1; anything this large is none."""


@dataclass(frozen=True, slots=True)
class CgroupLimit:
    """One level of the memory cgroup hierarchy that has a limit."""

    path: str
    """The cgroup's path inside its hierarchy (``/`` for the root)."""
    version: int
    limit_bytes: int
    used_bytes: int
    """Working set: usage less inactive file pages."""

    @property
    def headroom_bytes(self) -> int:
        return max(0, self.limit_bytes - self.used_bytes)


@dataclass(frozen=True, slots=True)
class HostMemory:
    """One reading of the node's host memory; ``ok`` False carries the reason only."""

    ok: bool
    available_bytes: int = 0
    """What a new worker can take: min(MemAvailable, the tightest cgroup headroom)."""
    total_bytes: int = 0
    """``MemTotal``."""
    meminfo_available_bytes: int = 0
    """``MemAvailable``."""
    cgroup: CgroupLimit | None = None
    """The cgroup level with the least headroom, when any level has a limit."""
    error: str = ""

    @property
    def bound_by(self) -> str:
        """What sets ``available_bytes``: ``meminfo`` or the cgroup's path."""
        c = self.cgroup
        if c is not None and c.headroom_bytes < self.meminfo_available_bytes:
            return f"cgroup v{c.version} {c.path}"
        return "meminfo"

    def to_json(self) -> dict[str, object]:
        c = self.cgroup
        return {
            "ok": self.ok,
            "available_bytes": self.available_bytes,
            "total_bytes": self.total_bytes,
            "meminfo_available_bytes": self.meminfo_available_bytes,
            "cgroup_limit_bytes": c.limit_bytes if c else None,
            "cgroup_used_bytes": c.used_bytes if c else None,
            "bound_by": self.bound_by if self.ok else None,
            "error": self.error or None,
        }


def failed_host_memory(error: str) -> HostMemory:
    return HostMemory(ok=False, error=error)


class HostMemorySource(Protocol):
    """Where host memory readings come from."""

    def read(self) -> HostMemory: ...


class ProcHostMemory:
    """Host memory from ``<root>/proc`` and ``<root>/sys/fs/cgroup`` (``/`` on a node)."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root

    def read(self) -> HostMemory:
        meminfo = self.root / "proc" / "meminfo"
        try:
            fields = _meminfo(meminfo.read_text())
            total, available = fields["MemTotal"], fields["MemAvailable"]
        except OSError as e:
            return failed_host_memory(f"cannot read {meminfo}: {e.strerror or e}")
        except UnicodeDecodeError as e:
            return failed_host_memory(f"cannot read {meminfo}: {e}")
        except (KeyError, ValueError) as e:
            return failed_host_memory(f"{meminfo} has no usable MemTotal/MemAvailable ({e})")
        try:
            limits = self._limits()
        except (OSError, ValueError, UnicodeDecodeError) as e:
            return failed_host_memory(f"cannot read the memory cgroup's limit: {e}")
        tightest = min(limits, key=lambda c: c.headroom_bytes, default=None)
        headroom = tightest.headroom_bytes if tightest is not None else available
        return HostMemory(
            ok=True,
            available_bytes=min(available, headroom),
            total_bytes=total,
            meminfo_available_bytes=available,
            cgroup=tightest,
        )

    def _limits(self) -> list[CgroupLimit]:
        own = self.root / "proc" / "self" / "cgroup"
        try:
            lines = own.read_text().splitlines()
        except FileNotFoundError:
            return []  # no cgroups here (or a stand-in without them): meminfo alone
        v1 = [line.split(":", 2) for line in lines if line.count(":") >= 2]
        for _, controllers, path in v1:
            if "memory" in controllers.split(","):
                base = self.root / "sys" / "fs" / "cgroup" / "memory"
                return _walk(base, path, 1)
        for hierarchy, _, path in v1:
            if hierarchy == "0":
                return _walk(self.root / "sys" / "fs" / "cgroup", path, 2)
        return []


_FILES = {
    1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    2: ("memory.max", "memory.current", "inactive_file"),
}


def _walk(base: Path, path: str, version: int) -> list[CgroupLimit]:
    """Every level from ``path`` up to the hierarchy's root that has a limit. A path the
    mount does not show (a container's own cgroup namespace) is the mount's root."""
    parts = [p for p in path.strip().split("/") if p]
    if not (base.joinpath(*parts)).is_dir():
        parts = []
    limit_file, usage_file, inactive_key = _FILES[version]
    out = []
    for depth in range(len(parts), -1, -1):
        level = base.joinpath(*parts[:depth])
        limit_path = level / limit_file
        if not limit_path.exists():
            continue  # the root of a v2 hierarchy has no memory.max
        text = limit_path.read_text().strip()
        if text == "max" or int(text) >= _UNLIMITED:
            continue
        used = int((level / usage_file).read_text().strip())
        used -= _stat(level / "memory.stat").get(inactive_key, 0)
        out.append(CgroupLimit("/" + "/".join(parts[:depth]), version, int(text), max(0, used)))
    return out


def _stat(path: Path) -> dict[str, int]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo``'s figures in bytes (the file's ``kB`` is KiB)."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if not words:
            continue
        scale = 1024 if words[1:] == ["kB"] else 1
        out[key.strip()] = int(words[0]) * scale
    return out


def write_host_files(
    root: Path,
    *,
    total_bytes: int,
    available_bytes: int,
    cgroup_limit_bytes: int | None = None,
    cgroup_used_bytes: int = 0,
    version: int = 2,
    path: str = "/gatekeeper.slice",
) -> Path:
    """Write the files ``ProcHostMemory(root)`` reads: a node of ``total_bytes`` with
    ``available_bytes`` available, and the reader's memory cgroup at ``path`` with a
    limit (``None``: unlimited) and usage. For tests, rehearsals and demos; returns
    ``root``. Called again, it rewrites the figures (a node whose memory moves)."""
    (root / "proc" / "self").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "meminfo").write_text(
        f"MemTotal:       {total_bytes // 1024} kB\n"
        f"MemFree:        {available_bytes // 1024} kB\n"
        f"MemAvailable:   {available_bytes // 1024} kB\n"
    )
    limit_file, usage_file, _ = _FILES[version]
    if version == 1:
        (root / "proc" / "self" / "cgroup").write_text(f"4:memory:{path}\n0::/\n")
        level = root / "sys" / "fs" / "cgroup" / "memory" / path.strip("/")
        unlimited = str(2**63 - 4096)
    else:
        (root / "proc" / "self" / "cgroup").write_text(f"0::{path}\n")
        level = root / "sys" / "fs" / "cgroup" / path.strip("/")
        unlimited = "max"
    level.mkdir(parents=True, exist_ok=True)
    limit = unlimited if cgroup_limit_bytes is None else str(cgroup_limit_bytes)
    (level / limit_file).write_text(limit + "\n")
    (level / usage_file).write_text(f"{cgroup_used_bytes}\n")
    return root
