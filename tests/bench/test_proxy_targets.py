"""What ``bench/proxy.py`` counts as a target's CPU: the process tree it walks (nginx's
master and workers) and the CPU time it reads, on real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench.proxy_targets import cpu_seconds, process_tree

BURN = """
import sys, threading, time
def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
threads = [threading.Thread(target=burn, args=(0.2,)) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print("burnt", flush=True)
time.sleep(30)
"""


@pytest.fixture
def burner() -> Iterator[subprocess.Popen[str]]:
    """A process whose two threads each burn 0.2 s of CPU, then idle."""
    with subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "burnt\n"
            yield proc
        finally:
            proc.kill()


def test_cpu_seconds_counts_every_thread_and_nothing_idle(burner: subprocess.Popen[str]) -> None:
    used = cpu_seconds([burner.pid])
    assert 0.4 <= used < 1.5  # both threads' 0.2 s, plus the interpreter's start
    time.sleep(0.3)
    assert cpu_seconds([burner.pid]) - used < 0.05  # asleep: no more


def test_cpu_seconds_of_a_process_that_is_gone_is_zero() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert cpu_seconds([proc.pid]) == 0.0


def test_process_tree_is_the_process_and_its_descendants() -> None:
    script = "sleep 30 & (sleep 30 & wait) & echo started; wait"
    with subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        _check_tree(proc)


def _check_tree(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        deadline = time.monotonic() + 5
        while len(tree := process_tree(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        # sh, its sleep, the subshell and the subshell's sleep (a grandchild)
        assert len(tree) == 4 and proc.pid in tree
        leaves = [pid for pid in tree if process_tree(pid) == [pid]]
        assert len(leaves) == 2  # the two sleeps; the subshell's tree holds its sleep
    finally:
        for pid in reversed(process_tree(proc.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
