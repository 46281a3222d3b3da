"""Processes a test starts and stops with Ctrl-C (#39): the suite passes when it is
started with SIGINT ignored, and a test whose child does not stop in time ends it.

A suite started from a script in the background (``pytest &`` in a non-interactive
shell, ``nohup``) runs with SIGINT ignored, and an ignored signal stays ignored through
``fork`` and ``exec``: every child inherits it, and Python, finding SIGINT ignored at
start-up, never installs its KeyboardInterrupt handler. A test that sends Ctrl-C to its
``gatekeeper serve`` would then wait for nothing. A signal with a handler, though, is
reset to its default by ``exec``: ``ctrl_c_reaches_children`` catches SIGINT (and does
nothing with it, as ignoring would) while the child is started, so the child gets
SIGINT's default, in the shell's way and without a ``preexec_fn`` (which the
subprocess module calls unsafe where threads run, as they do in this suite).

``interrupt`` sends the Ctrl-C and waits; a child still running at the deadline is
ended with its process group (SIGTERM, then SIGKILL), and the test fails with
``TimeoutExpired`` rather than leaving it to serve on. Start children in their own
process group (``process_group=0``) so that ending it ends theirs and nothing else,
and so that a Ctrl-C typed at the terminal running the suite reaches pytest alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

__all__ = ["ctrl_c_reaches_children", "end_group", "interrupt"]


@contextlib.contextmanager
def ctrl_c_reaches_children() -> Iterator[None]:
    """Children started in the block get SIGINT's default action even where this process
    ignores SIGINT (which it keeps doing: the handler does nothing). Main thread only."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def end_group(process: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float = 10) -> None:
    """SIGTERM to ``process``'s process group (where it leads one, else to it alone),
    SIGKILL ``grace`` seconds later if it still runs; waits for it, and kills what it
    left in its group."""
    if process.poll() is not None:
        return
    own_group = os.getpgid(process.pid) == process.pid

    def send(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if own_group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)

    send(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
    if own_group:
        send(signal.SIGKILL)


def interrupt(
    process: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float, grace: float = 10
) -> int:
    """Ctrl-C (SIGINT) to ``process``; its exit code once it exits within ``timeout``
    seconds, else it is ended (``end_group``, SIGKILL after ``grace`` seconds more) and
    ``TimeoutExpired`` raised."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(process, grace)
        raise
