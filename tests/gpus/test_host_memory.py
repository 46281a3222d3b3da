"""The node's host memory read from the kernel's files: on this machine, and from files a
test writes under a root (the stand-in, ``write_host_files``), for cgroup v1 and v2, a
parent's limit, and readings that fail."""

from __future__ import annotations

import os
from pathlib import Path

from gatekeeper.gpus.host_memory import ProcHostMemory, write_host_files
from gatekeeper.gpus.host_usage import process_host_bytes, tree_host_bytes
from gatekeeper.gpus.proctree import process_tree

GiB = 1 << 30


def test_this_machine_is_read_and_available_is_at_most_total() -> None:
    reading = ProcHostMemory().read()
    assert reading.ok, reading.error
    assert 0 < reading.available_bytes <= reading.meminfo_available_bytes <= reading.total_bytes


def test_meminfo_alone_when_no_cgroup_limits(tmp_path: Path) -> None:
    write_host_files(tmp_path, total_bytes=64 * GiB, available_bytes=40 * GiB)
    reading = ProcHostMemory(tmp_path).read()
    assert (reading.ok, reading.available_bytes, reading.total_bytes) == (True, 40 * GiB, 64 * GiB)
    assert reading.cgroup is None and reading.bound_by == "meminfo"


def test_a_v2_limit_binds_with_its_working_set(tmp_path: Path) -> None:
    write_host_files(
        tmp_path,
        total_bytes=64 * GiB,
        available_bytes=40 * GiB,
        cgroup_limit_bytes=16 * GiB,
        cgroup_used_bytes=6 * GiB,
        path="/kubepods/pod1/gatekeeper",
    )
    level = tmp_path / "sys/fs/cgroup/kubepods/pod1/gatekeeper"
    (level / "memory.stat").write_text(f"anon {4 * GiB}\ninactive_file {GiB}\n")
    reading = ProcHostMemory(tmp_path).read()
    assert reading.available_bytes == 16 * GiB - (6 * GiB - GiB)
    assert reading.bound_by == "cgroup v2 /kubepods/pod1/gatekeeper"
    assert reading.to_json()["cgroup_limit_bytes"] == 16 * GiB


def test_a_parents_limit_binds_its_child(tmp_path: Path) -> None:
    write_host_files(tmp_path, total_bytes=64 * GiB, available_bytes=40 * GiB, path="/pod/ctr")
    parent = tmp_path / "sys/fs/cgroup/pod"
    (parent / "memory.max").write_text(f"{8 * GiB}\n")
    (parent / "memory.current").write_text(f"{3 * GiB}\n")
    reading = ProcHostMemory(tmp_path).read()
    assert reading.available_bytes == 5 * GiB and reading.bound_by == "cgroup v2 /pod"


def test_v1_limits_and_v1s_unlimited(tmp_path: Path) -> None:
    limited, unlimited = tmp_path / "a", tmp_path / "b"
    write_host_files(
        limited, total_bytes=32 * GiB, available_bytes=30 * GiB, version=1,
        cgroup_limit_bytes=12 * GiB, cgroup_used_bytes=2 * GiB,
    )  # fmt: skip
    write_host_files(unlimited, total_bytes=32 * GiB, available_bytes=30 * GiB, version=1)
    assert ProcHostMemory(limited).read().available_bytes == 10 * GiB
    assert ProcHostMemory(unlimited).read().available_bytes == 30 * GiB


def test_a_reading_that_fails_says_why_and_guesses_nothing(tmp_path: Path) -> None:
    missing = ProcHostMemory(tmp_path / "nowhere").read()
    assert not missing.ok and "meminfo" in missing.error and missing.available_bytes == 0
    write_host_files(tmp_path, total_bytes=GiB, available_bytes=GiB, cgroup_limit_bytes=GiB)
    (tmp_path / "sys/fs/cgroup/gatekeeper.slice/memory.max").write_text("lots\n")
    bad = ProcHostMemory(tmp_path).read()
    assert not bad.ok and "cgroup" in bad.error
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1 kB\n")
    assert "MemAvailable" in ProcHostMemory(tmp_path).read().error


def test_a_process_tree_is_summed_by_pss() -> None:
    own = process_host_bytes(os.getpid())
    assert own > 10 * 2**20  # an interpreter with pytest loaded
    assert tree_host_bytes(process_tree(os.getpid())) >= own
    assert process_host_bytes(2**22 + 1) == 0  # no such process
