"""``CachedReading``: one read per ``ttl_seconds`` however many callers ask at once, and
its two failure policies (raise; keep the last good reading)."""

from __future__ import annotations

import logging
import threading

import pytest

from gatekeeper.gpus.cached import CachedReading, KeepLastGood


class Source:
    """A reading that counts its reads and fails while ``failing`` is set."""

    def __init__(self, failing: type[Exception] | None = None) -> None:
        self.reads = 0
        self.failing = failing

    def __call__(self) -> str:
        self.reads += 1
        if self.failing is not None:
            raise self.failing(f"read {self.reads} failed")
        return f"reading {self.reads}"


def keep_last() -> KeepLastGood[str]:
    return KeepLastGood((OSError,), lambda e: f"unread: {e}", lambda why: f"none yet ({why})")


def test_callers_at_once_share_one_read() -> None:
    """Eight threads ask while the first read is under way: one read serves them all."""
    started, release = threading.Event(), threading.Event()
    reads: list[int] = []

    def slow() -> int:
        reads.append(1)
        started.set()
        release.wait(10)
        return len(reads)

    reading = CachedReading(slow, 60.0)
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(reading())) for _ in range(8)]
    for t in threads:
        t.start()
    assert started.wait(10)
    release.set()
    for t in threads:
        t.join(10)
    assert (len(reads), got) == (1, [1] * 8)


def test_raise_policy_passes_a_failure_on_and_reads_again_at_the_next_call() -> None:
    now = [0.0]
    source = Source()
    reading = CachedReading(source, 5.0, clock=lambda: now[0])
    assert [reading(), reading()] == ["reading 1"] * 2
    now[0], source.failing = 5.0, OSError
    with pytest.raises(OSError, match="read 2 failed"):
        reading()
    with pytest.raises(OSError, match="read 3 failed"):  # not kept: read again
        reading()
    source.failing = None
    assert (reading(), reading(), source.reads) == ("reading 4", "reading 4", 4)


def test_keep_last_good_serves_the_last_good_reading_for_another_ttl(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    source = Source()
    reading = CachedReading(source, 10.0, on_failure=keep_last(), clock=lambda: now[0])
    assert reading() == "reading 1"
    now[0], source.failing = 12.0, OSError
    with caplog.at_level(logging.WARNING):
        assert reading() == "reading 1"
    assert "unread: read 2 failed; serving the reading of 12.0 s ago" in caplog.text
    now[0], source.failing = 21.9, None
    assert (reading(), source.reads) == ("reading 1", 2)  # kept for another ttl
    now[0] = 22.0
    assert reading() == "reading 3"


def test_keep_last_good_with_none_yet_serves_the_failure_and_never_keeps_it() -> None:
    now = [0.0]
    source = Source(failing=OSError)
    reading = CachedReading(source, 10.0, on_failure=keep_last(), clock=lambda: now[0])
    assert reading() == "none yet (unread: read 1 failed)"
    now[0] = 9.9
    assert (reading(), source.reads) == ("none yet (unread: read 1 failed)", 1)
    now[0] = 10.0
    assert reading() == "none yet (unread: read 2 failed)"  # the failure was not good
    source.failing = ValueError  # not among the policy's errors: raised
    now[0] = 20.0
    with pytest.raises(ValueError, match="read 3 failed"):
        reading()


def test_a_ttl_of_zero_reads_at_every_call() -> None:
    source = Source()
    reading = CachedReading(source, 0.0, clock=lambda: 0.0)
    assert [reading(), reading()] == ["reading 1", "reading 2"]
