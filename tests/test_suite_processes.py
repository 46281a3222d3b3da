"""The suite itself (#39 item 5): it passes when started with SIGINT ignored, as a
script's ``pytest &`` starts it, because the tests that stop a child with Ctrl-C start it
with SIGINT's default (``tests.support.processes``); and a child that does not stop in
time is ended with its process group, not left running after its test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import ctrl_c_reaches_children, interrupt

ROOT = Path(__file__).resolve().parent.parent
SHOW_SIGINT = (
    "import signal; h = signal.getsignal(signal.SIGINT)\n"
    "print('ignored' if h == signal.SIG_IGN else 'KeyboardInterrupt'"
    " if h is signal.default_int_handler else h)"
)


def _child_sigint() -> str:
    return subprocess.run(
        [sys.executable, "-c", SHOW_SIGINT], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_child_started_in_the_block_takes_ctrl_c_where_the_suite_ignores_it():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `pytest &` in a script
    try:
        assert _child_sigint() == "ignored"  # what every other child inherits
        with ctrl_c_reaches_children():
            assert _child_sigint() == "KeyboardInterrupt"
            os.kill(os.getpid(), signal.SIGINT)  # and this process still takes no Ctrl-C
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_child_that_does_not_stop_on_ctrl_c_is_ended_with_its_group():
    """A child that ignores SIGINT and SIGTERM, with a child of its own in its group:
    ``interrupt`` fails the test with ``TimeoutExpired`` and both are gone."""
    code = (
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(subprocess.Popen(['sleep', '60']).pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, process_group=0
    )
    assert process.stdout is not None
    with process.stdout:
        grandchild = int(process.stdout.readline())
        with pytest.raises(subprocess.TimeoutExpired):
            interrupt(process, timeout=0.5, grace=0.5)
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(grandchild):  # killed; init reaps it
        assert time.monotonic() < deadline, f"pid {grandchild} outlived its group"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie not yet reaped counts as gone
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


CUT_SHORT = """
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.processes import end_group


@pytest.fixture
def child():
    process = subprocess.Popen(["sleep", "120"], process_group=0)
    Path("child.pid").write_text(str(process.pid))
    yield process
    end_group(process, 1)


def test_hangs(child):
    time.sleep(120)
"""


def test_a_test_cut_short_by_its_timeout_ends_what_it_started(tmp_path: Path):
    """The suite's own configuration (pytest-timeout, ``timeout_method = "signal"``), its
    timeout lowered to 2 s: the hung test fails, and its fixture's teardown ends the
    process it started."""
    (tmp_path / "test_cut_short.py").write_text(CUT_SHORT)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
            "-c", str(ROOT / "pyproject.toml"), "-o", "timeout=2", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert "Timeout (>2.0s) from pytest-timeout" in result.stdout, result.stdout[-3000:]
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} outlived its test"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_ctrl_c_test_passes_in_a_suite_started_with_sigint_ignored(tmp_path: Path):
    """A test that stops ``gatekeeper serve`` with Ctrl-C and wants its exit code 130, run
    by a pytest that a shell started with SIGINT ignored (``trap '' INT``, as ``&`` does
    in a script). Before ``ctrl_c_reaches_children`` the sidecar inherited the ignore,
    took the Ctrl-C, stopped, and exited 0 instead of 130."""
    test = (
        "tests/sidecar/test_http_servers.py::test_granian_answers_an_endless_head_431_at_its_buffer"
    )
    inner = tmp_path / "inner"
    pytest_argv = f"{sys.executable} -m pytest -q -p no:cacheprovider --basetemp {inner} {test}"
    result = subprocess.run(
        ["sh", "-c", f"trap '' INT; exec {pytest_argv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout
