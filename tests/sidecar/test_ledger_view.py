"""``Ledger.view()``: what the live rows mean for placement, per GPU, from one read; and
the worker states the sidecar and the metrics share (``metrics.worker_states``)."""

from __future__ import annotations

import time
from pathlib import Path

from gatekeeper.metrics import workers as worker_metrics
from gatekeeper.metrics.worker_states import (
    PENDING_STATES,
    RESERVING_STATES,
    SERVING_STATES,
    WORKER_STATES,
)
from gatekeeper.sidecar.ledger import Ledger, Promise, Reservation, ledger_path, ledger_usage

GiB = 2**30


class Clock:
    """Ten seconds behind the wall clock (which ``ledger_usage``'s ledger reads)."""

    def __init__(self) -> None:
        self.now = time.time() - 10

    def __call__(self) -> float:
        return self.now


def _promise(*promises: Promise):
    def decide(_: tuple[Reservation, ...]) -> tuple[None, tuple[Promise, ...]]:
        return None, promises

    return decide


def test_view_sums_pending_ready_and_workers_per_gpu_and_ignores_dead_rows(
    tmp_path: Path,
) -> None:
    clock = Clock()
    with Ledger(ledger_path(tmp_path), clock=clock) as ledger:
        ledger.admit("starting", "m", _promise(Promise("G0", 3 * GiB)), ttl_seconds=60)
        tp2 = _promise(Promise("G0", 5 * GiB), Promise("G1", 5 * GiB))
        ledger.admit("serving", "m", tp2, ttl_seconds=60)
        ledger.mark_ready("serving")
        ledger.admit("gone", "m", _promise(Promise("G1", 7 * GiB)), ttl_seconds=60)
        ledger.release("gone")
        ledger.admit("stale", "m", _promise(Promise("G1", 11 * GiB)), ttl_seconds=1)
        clock.now += 2  # "stale" expired; "starting" is still pending
        view = ledger.view()
        assert dict(view.promised) == {"G0": 3 * GiB}
        assert dict(view.held) == {"G0": 5 * GiB, "G1": 5 * GiB}
        assert dict(view.workers) == {"G0": 2, "G1": 1}
        assert view.outstanding == 1 == len(ledger.outstanding())
    assert ledger_usage(tmp_path) == ({"G0": 3 * GiB}, {"G0": 2, "G1": 1})


def test_an_empty_state_directory_has_an_empty_view(tmp_path: Path) -> None:
    assert ledger_usage(tmp_path / "none") == ({}, {})
    with Ledger(ledger_path(tmp_path)) as ledger:
        view = ledger.view()
    assert (dict(view.promised), dict(view.held), dict(view.workers)) == ({}, {}, {})


def test_the_worker_states_are_written_once_and_partitioned() -> None:
    assert worker_metrics.WORKER_STATES == WORKER_STATES, "the metrics' copy drifted"
    assert PENDING_STATES.isdisjoint(SERVING_STATES)
    assert RESERVING_STATES == PENDING_STATES | SERVING_STATES
    assert set(RESERVING_STATES) < set(WORKER_STATES)
    assert {"failed", "stopped"}.isdisjoint(RESERVING_STATES)
