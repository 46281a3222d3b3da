"""The reservations ledger on real SQLite files: lifecycle, persistence, stale sweep,
rollback, bad input, a stateful property test against a stand-in node, and
concurrent admissions from threads and from two processes."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.synchronize
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from gatekeeper.errors import GatekeeperError
from gatekeeper.sidecar.ledger import (
    LEDGER_FILENAME,
    SCHEMA_VERSION,
    Ledger,
    Promise,
    Reservation,
    ledger_path,
)
from gatekeeper.sidecar.ledger_file import LedgerError
from gatekeeper.sidecar.ledger_view import promised_bytes

GiB = 1024**3


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


Decide = Callable[[tuple[Reservation, ...]], tuple[str | None, tuple[Promise, ...]]]


def promised(reservations: tuple[Reservation, ...], gpu_uuid: str) -> int:
    return promised_bytes(reservations).get(gpu_uuid, 0)


def fit(free: dict[str, int], ask: int) -> Decide:
    """A stand-in placement: best fit over GPUs whose free - outstanding covers ``ask``."""

    def decide(outstanding: tuple[Reservation, ...]) -> tuple[str | None, tuple[Promise, ...]]:
        usable = {gpu: f - promised(outstanding, gpu) for gpu, f in free.items()}
        fitting = sorted((u - ask, gpu) for gpu, u in usable.items() if u >= ask)
        if not fitting:
            return None, ()
        gpu = fitting[0][1]
        return gpu, (Promise(gpu, ask),)

    return decide


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ledger(tmp_path: Path, clock: FakeClock) -> Iterator[Ledger]:
    with Ledger(tmp_path / "state" / LEDGER_FILENAME, clock=clock) as opened:
        yield opened


# -- lifecycle -------------------------------------------------------------------------


def test_admit_reserves_then_ready_stops_counting_then_release(ledger: Ledger) -> None:
    decision = ledger.admit("d1", "m", fit({"GPU-0": 10 * GiB}, 4 * GiB), ttl_seconds=60)
    assert decision == "GPU-0"
    (r,) = ledger.outstanding()
    assert (r.deployment_id, r.model, r.gpu_uuid, r.bytes, r.state) == (
        "d1",
        "m",
        "GPU-0",
        4 * GiB,
        "pending",
    )
    assert (r.created_at, r.expires_at, r.pid, json.loads(r.payload)) == (1000, 1060, None, "GPU-0")
    assert len(r.id) == 32
    ledger.set_pid("d1", 4242)
    assert ledger.mark_ready("d1") == 1
    assert ledger.outstanding() == ()
    (live,) = ledger.live()
    assert (live.state, live.pid) == ("ready", 4242)
    assert ledger.release("d1") == 1
    assert ledger.release("d1") == 0
    assert ledger.live() == ()
    assert [x.state for x in ledger.by_deployment("d1")] == ["released"]


def test_rejection_writes_nothing(ledger: Ledger) -> None:
    assert ledger.admit("d1", "m", fit({"GPU-0": GiB}, 2 * GiB), ttl_seconds=60) is None
    assert ledger.by_deployment("d1") == ()


def test_one_admission_can_promise_several_gpus(ledger: Ledger) -> None:
    def tp2(_: tuple[Reservation, ...]) -> tuple[dict[str, int], tuple[Promise, ...]]:
        return {"tp": 2}, (Promise("GPU-0", GiB), Promise("GPU-1", GiB))

    assert ledger.admit("d1", "m", tp2, ttl_seconds=60) == {"tp": 2}
    assert [r.gpu_uuid for r in ledger.by_deployment("d1")] == ["GPU-0", "GPU-1"]
    assert promised_bytes(ledger.outstanding()) == {"GPU-0": GiB, "GPU-1": GiB}
    assert ledger.mark_ready("d1") == 2


def test_reopen_sees_the_same_rows(tmp_path: Path, clock: FakeClock) -> None:
    path = ledger_path(tmp_path)
    with Ledger(path, clock=clock) as first:
        first.admit("d1", "m", fit({"GPU-0": 8 * GiB}, GiB), ttl_seconds=60)
        first.admit("d2", "m", fit({"GPU-0": 8 * GiB}, GiB), ttl_seconds=60)
        first.set_pid("d2", 77)
        first.mark_ready("d2")
        before = first.live()
    with Ledger(path, clock=clock) as second:
        assert second.live() == before
        assert [r.deployment_id for r in second.outstanding()] == ["d1"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_stale_pending_reservations_are_swept(ledger: Ledger, clock: FakeClock) -> None:
    ledger.admit("old", "m", fit({"GPU-0": 10 * GiB}, 6 * GiB), ttl_seconds=30)
    clock.now += 29.9
    assert len(ledger.outstanding()) == 1
    assert ledger.admit("new", "m", fit({"GPU-0": 10 * GiB}, 6 * GiB), ttl_seconds=30) is None
    clock.now += 0.1
    assert ledger.outstanding() == ()
    assert ledger.mark_ready("old") == 0, "an expired reservation cannot become ready"
    assert ledger.admit("new", "m", fit({"GPU-0": 10 * GiB}, 6 * GiB), ttl_seconds=30)
    assert [r.state for r in ledger.by_deployment("old")] == ["released"]
    assert ledger.sweep() == 0
    clock.now += 31
    assert ledger.sweep() == 1


def test_ready_reservations_are_not_swept(ledger: Ledger, clock: FakeClock) -> None:
    ledger.admit("d1", "m", fit({"GPU-0": GiB}, GiB), ttl_seconds=5)
    ledger.mark_ready("d1")
    clock.now += 3600
    assert ledger.sweep() == 0
    assert [r.state for r in ledger.live()] == ["ready"]


def recording(seen: list[tuple[Reservation, ...]]) -> Decide:
    """A decide that records what it was handed and promises nothing."""

    def decide(counted: tuple[Reservation, ...]) -> tuple[str | None, tuple[Promise, ...]]:
        seen.append(counted)
        return None, ()

    return decide


def test_a_row_ready_since_the_snapshot_is_handed_to_decide(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.admit("before", "m", fit({"GPU-0": 80 * GiB}, 10 * GiB), ttl_seconds=60)
    ledger.mark_ready("before")  # ready before the snapshot: in its used memory
    clock.now += 1
    ledger.admit("after", "m", fit({"GPU-0": 80 * GiB}, 20 * GiB), ttl_seconds=60)
    ledger.admit("pending", "m", fit({"GPU-0": 80 * GiB}, 30 * GiB), ttl_seconds=60)
    since = ledger.now()
    assert since == clock.now
    # ... the caller reads its GPU snapshot here; meanwhile "after" turns ready ...
    clock.now += 0.5
    assert ledger.mark_ready("after") == 1
    (row,) = [r for r in ledger.live() if r.deployment_id == "after"]
    assert (row.state, row.ready_at) == ("ready", clock.now)
    seen: list[tuple[Reservation, ...]] = []
    ledger.admit("new", "m", recording(seen), ttl_seconds=60, since=since)
    ledger.admit("new", "m", recording(seen), ttl_seconds=60)
    with_since, without = seen
    assert [(r.deployment_id, r.state) for r in with_since] == [
        ("pending", "pending"),
        ("after", "ready"),
    ], "the row that turned ready after since counts; the one ready before does not"
    assert promised(with_since, "GPU-0") == 50 * GiB
    assert [r.deployment_id for r in without] == ["pending"]
    # A row ready exactly at since counts too (twice, perhaps, but never zero times).
    seen.clear()
    ledger.admit("new", "m", recording(seen), ttl_seconds=60, since=clock.now)
    assert [r.deployment_id for r in seen[0]] == ["pending", "after"]


def test_a_ready_row_fills_the_gpu_for_an_admission_since_before_it(
    ledger: Ledger, clock: FakeClock
) -> None:
    free = {"GPU-0": 10 * GiB}  # the snapshot, read when nothing was ready yet
    since = ledger.now()
    assert ledger.admit("a", "m", fit(free, 6 * GiB), ttl_seconds=60) == "GPU-0"
    clock.now += 1
    ledger.mark_ready("a")
    assert ledger.admit("b", "m", fit(free, 6 * GiB), ttl_seconds=60, since=since) is None
    assert ledger.admit("b", "m", fit(free, 6 * GiB), ttl_seconds=60) == "GPU-0", (
        "without since the ready row counts nowhere: the over-commit of issue #13"
    )


def test_adopt_ready_sets_ready_at(ledger: Ledger, clock: FakeClock) -> None:
    ledger.admit("d1", "m", fit({"GPU-0": GiB}, GiB), ttl_seconds=5)
    clock.now += 10
    ledger.sweep()
    assert ledger.adopt_ready("d1") == 1
    assert [r.ready_at for r in ledger.live()] == [clock.now]


@pytest.mark.parametrize("since", [float("nan"), float("inf"), "now", True])
def test_bad_since_names_the_field(ledger: Ledger, since: object) -> None:
    with pytest.raises(LedgerError, match="since") as info:
        ledger.admit("d1", "m", fit({"GPU-0": GiB}, GiB), ttl_seconds=5, since=since)  # type: ignore[arg-type]
    assert info.value.field == "since"
    assert ledger.by_deployment("d1") == ()


V1_SCHEMA = (
    "CREATE TABLE reservations (id TEXT PRIMARY KEY, deployment_id TEXT NOT NULL,"
    " model TEXT NOT NULL, gpu_uuid TEXT NOT NULL, bytes INTEGER NOT NULL CHECK (bytes > 0),"
    " state TEXT NOT NULL CHECK (state IN ('pending', 'ready', 'released')),"
    " created_at REAL NOT NULL, expires_at REAL NOT NULL, released_at REAL, pid INTEGER,"
    " payload TEXT NOT NULL);"
    " CREATE INDEX reservations_by_state ON reservations (state, expires_at);"
    " CREATE INDEX reservations_by_deployment ON reservations (deployment_id);"
)
"""The schema of version 1 files, as gatekeeper 1 wrote it (no ``ready_at``)."""


def test_a_version_1_file_is_migrated(tmp_path: Path, clock: FakeClock) -> None:
    path = ledger_path(tmp_path)
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    insert = (
        "INSERT INTO reservations (id, deployment_id, model, gpu_uuid, bytes, state,"
        " created_at, expires_at, pid, payload) VALUES (?, ?, 'm', 'GPU-0', ?, ?, 990, 2000, ?, '{}')"
    )
    conn.execute(insert, ("r1", "old-ready", GiB, "ready", 11))
    conn.execute(insert, ("r2", "old-pending", 2 * GiB, "pending", None))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with Ledger(path, clock=clock) as ledger:
        assert [(r.deployment_id, r.state, r.ready_at) for r in ledger.live()] == [
            ("old-ready", "ready", None),
            ("old-pending", "pending", None),
        ]
        assert ledger.mark_ready("old-pending") == 1
        assert [r.ready_at for r in ledger.live()] == [None, clock.now]
    with Ledger(path, clock=clock) as again:  # opening a migrated file is a no-op
        assert len(again.live()) == 2
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    conn.close()


def test_a_new_file_has_ready_at(tmp_path: Path) -> None:
    path = ledger_path(tmp_path)
    Ledger(path).close()
    conn = sqlite3.connect(path)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(reservations)")]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
    assert "ready_at" in columns
    assert version == 3


def test_an_adopted_serving_worker_is_ready_again_even_after_its_row_expired(
    ledger: Ledger, clock: FakeClock
) -> None:
    ledger.admit("loading", "m", fit({"GPU-0": 10 * GiB}, 6 * GiB), ttl_seconds=30)
    ledger.admit("late", "m", fit({"GPU-1": 10 * GiB}, 6 * GiB), ttl_seconds=30)
    clock.now += 31  # the sidecar was down while both loaded: the rows were swept
    assert ledger.sweep() == 2
    assert ledger.adopt_ready("late") == 1
    assert [(r.deployment_id, r.state) for r in ledger.live()] == [("late", "ready")]
    assert ledger.outstanding() == (), "a ready row is in NVML's figure, not promised"
    clock.now += 3600
    assert ledger.sweep() == 0
    assert [r.deployment_id for r in ledger.live()] == ["late"]


def test_prune_deletes_only_old_released_rows(ledger: Ledger, clock: FakeClock) -> None:
    ledger.admit("gone", "m", fit({"GPU-0": 4 * GiB}, GiB), ttl_seconds=60)
    ledger.admit("kept", "m", fit({"GPU-0": 4 * GiB}, GiB), ttl_seconds=60)
    ledger.release("gone")
    clock.now += 50
    assert ledger.prune(older_than_seconds=100) == 0
    clock.now += 50
    assert ledger.prune(older_than_seconds=100) == 1
    assert ledger.by_deployment("gone") == ()
    assert len(ledger.by_deployment("kept")) == 1


def test_decide_raising_rolls_back(ledger: Ledger, clock: FakeClock) -> None:
    ledger.admit("stale", "m", fit({"GPU-0": 4 * GiB}, GiB), ttl_seconds=1)
    clock.now += 2

    def boom(_: tuple[Reservation, ...]) -> tuple[str, tuple[Promise, ...]]:
        raise RuntimeError("placement failed")

    with pytest.raises(RuntimeError, match="placement failed"):
        ledger.admit("d1", "m", boom, ttl_seconds=60)
    assert ledger.by_deployment("d1") == ()
    assert [r.state for r in ledger.by_deployment("stale")] == ["pending"], "sweep rolled back"
    assert ledger.admit("d1", "m", fit({"GPU-0": 4 * GiB}, GiB), ttl_seconds=60) == "GPU-0"


def test_payload_function_and_its_failure(ledger: Ledger) -> None:
    ledger.admit(
        "d1", "m", fit({"GPU-0": GiB}, GiB), ttl_seconds=60, payload=lambda g: f'{{"gpu":"{g}"}}'
    )
    assert json.loads(ledger.by_deployment("d1")[0].payload) == {"gpu": "GPU-0"}

    def opaque(_: tuple[Reservation, ...]) -> tuple[object, tuple[Promise, ...]]:
        return object(), (Promise("GPU-1", GiB),)

    with pytest.raises(LedgerError, match=r"not JSON-serialisable.*pass payload="):
        ledger.admit("d2", "m", opaque, ttl_seconds=60)
    assert ledger.by_deployment("d2") == ()


def test_decision_dataclass_is_stored_as_json(ledger: Ledger) -> None:
    @dataclass(frozen=True)
    class Decision:
        gpus: tuple[str, ...]
        flags: tuple[str, ...]

    def decide(_: tuple[Reservation, ...]) -> tuple[Decision, tuple[Promise, ...]]:
        return Decision(("GPU-0",), ("--max-model-len", "4096")), (Promise("GPU-0", GiB),)

    ledger.admit("d1", "m", decide, ttl_seconds=60)
    stored = json.loads(ledger.by_deployment("d1")[0].payload)
    assert stored == {"gpus": ["GPU-0"], "flags": ["--max-model-len", "4096"]}


# -- bad input -------------------------------------------------------------------------


def promise(gpu: str, size: object) -> Decide:
    return lambda _: ("x", (Promise(gpu, size),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda lg: lg.admit("", "m", promise("G", 1), ttl_seconds=1), "deployment_id"),
        (lambda lg: lg.admit("d", " ", promise("G", 1), ttl_seconds=1), "model"),
        (lambda lg: lg.admit("d", "m", promise("G", 1), ttl_seconds=-1), "ttl_seconds"),
        (lambda lg: lg.admit("d", "m", promise("G", 1), ttl_seconds=float("nan")), "ttl_seconds"),
        (lambda lg: lg.admit("d", "m", promise("G", 0), ttl_seconds=1), "bytes"),
        (lambda lg: lg.admit("d", "m", promise("G", -5), ttl_seconds=1), "bytes"),
        (lambda lg: lg.admit("d", "m", promise("G", 1.5), ttl_seconds=1), "bytes"),
        (lambda lg: lg.admit("d", "m", promise("G", True), ttl_seconds=1), "bytes"),
        (lambda lg: lg.admit("d", "m", promise("G", 2**64), ttl_seconds=1), "bytes"),
        (lambda lg: lg.admit("d", "m", promise("", 1), ttl_seconds=1), "gpu_uuid"),
        (lambda lg: lg.admit("d", "m", lambda _: ("x", "GPU"), ttl_seconds=1), "promises"),
        (lambda lg: lg.set_pid("d", 0), "pid"),
        (lambda lg: lg.set_pid("nobody", 12), "deployment_id"),
        (lambda lg: lg.mark_ready(""), "deployment_id"),
        (lambda lg: lg.prune(-1), "older_than_seconds"),
    ],
)
def test_bad_input_names_the_field(
    ledger: Ledger, call: Callable[[Ledger], object], field: str
) -> None:
    with pytest.raises(LedgerError, match=field) as info:
        call(ledger)
    assert info.value.field == field
    assert isinstance(info.value, GatekeeperError)
    assert ledger.live() == ()


def test_a_deployment_cannot_be_admitted_twice_while_live(ledger: Ledger) -> None:
    ledger.admit("d1", "m", fit({"GPU-0": 8 * GiB}, GiB), ttl_seconds=60)
    with pytest.raises(LedgerError, match="already holds live reservations"):
        ledger.admit("d1", "m", fit({"GPU-0": 8 * GiB}, GiB), ttl_seconds=60)
    ledger.release("d1")
    assert ledger.admit("d1", "m", fit({"GPU-0": 8 * GiB}, GiB), ttl_seconds=60) == "GPU-0"


def test_decide_must_not_call_the_ledger(ledger: Ledger) -> None:
    def reentrant(_: tuple[Reservation, ...]) -> tuple[str, tuple[Promise, ...]]:
        ledger.outstanding()
        return "x", ()

    with pytest.raises(LedgerError, match="decide must be pure"):
        ledger.admit("d1", "m", reentrant, ttl_seconds=60)
    assert ledger.outstanding() == ()


def test_closed_ledger_says_so(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    ledger.close()
    ledger.close()
    with pytest.raises(LedgerError, match="closed; open a new Ledger"):
        ledger.outstanding()


def test_corrupt_file_names_the_file_and_says_move_it_aside(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILENAME
    path.write_bytes(b"this is not a database, just some bytes " * 100)
    with pytest.raises(LedgerError, match="move it aside") as info:
        Ledger(path)
    assert str(path) in str(info.value)


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILENAME
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x)")
        conn.execute("PRAGMA user_version = 7")
    conn.close()
    with pytest.raises(LedgerError, match=r"schema version 7.*move it aside"):
        Ledger(path)


def test_a_writer_holding_the_file_too_long_is_reported(tmp_path: Path) -> None:
    path = ledger_path(tmp_path)
    with Ledger(path, timeout_seconds=0.2) as ledger:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(LedgerError, match=r"more than 0.2 s.*fuser"):
                ledger.admit("d1", "m", fit(ONE_GPU, ASK), ttl_seconds=60)
        finally:
            holder.rollback()
            holder.close()
        assert ledger.admit("d1", "m", fit(ONE_GPU, ASK), ttl_seconds=60) == "GPU-0"


def test_directory_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=f"is a directory.*{LEDGER_FILENAME}"):
        Ledger(tmp_path)


# -- property: no over-commit across random lifecycles ---------------------------------


class LedgerMachine(RuleBasedStateMachine):
    """A stand-in node of three GPUs. ``free`` is what NVML would report: capacity less
    the memory of ready workers. decide() admits only if free - outstanding >= ask."""

    capacity = {"GPU-a": 10_000, "GPU-b": 6_000, "GPU-c": 3_000}  # noqa: RUF012
    deployments = Bundle("deployments")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / LEDGER_FILENAME
        self.clock = FakeClock()
        self.ledger = Ledger(self.path, clock=self.clock)
        self.used: dict[str, int] = dict.fromkeys(self.capacity, 0)  # by ready workers
        self.ready: dict[str, tuple[str, int]] = {}
        self.count = 0

    def free(self) -> dict[str, int]:
        return {gpu: cap - self.used[gpu] for gpu, cap in self.capacity.items()}

    @rule(target=deployments, ask=st.integers(1, 7_000), ttl=st.floats(1, 100))
    def admit(self, ask: int, ttl: float) -> str:
        self.count += 1
        deployment = f"d{self.count}"
        self.ledger.admit(deployment, "m", fit(self.free(), ask), ttl_seconds=ttl)
        return deployment

    @rule(deployment=deployments)
    def become_ready(self, deployment: str) -> None:
        rows = [r for r in self.ledger.outstanding() if r.deployment_id == deployment]
        assert self.ledger.mark_ready(deployment) == len(rows)
        for r in rows:  # the worker's measured usage takes over from its reservation
            self.used[r.gpu_uuid] += r.bytes
            self.ready[deployment] = (r.gpu_uuid, r.bytes)

    @rule(deployment=deployments)
    def exit_or_fail(self, deployment: str) -> None:
        self.ledger.release(deployment)
        if deployment in self.ready:
            gpu, size = self.ready.pop(deployment)
            self.used[gpu] -= size

    @rule(seconds=st.floats(0, 60))
    def advance_clock(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def sweep(self) -> None:
        self.ledger.sweep()

    @rule()
    def restart(self) -> None:
        before = self.ledger.live()
        self.ledger.close()
        self.ledger = Ledger(self.path, clock=self.clock)
        assert self.ledger.live() == before

    @invariant()
    def no_gpu_is_over_promised(self) -> None:
        outstanding = self.ledger.outstanding()
        for gpu, free in self.free().items():
            assert promised(outstanding, gpu) <= free, gpu
        assert all(r.expires_at > self.clock.now for r in outstanding)
        ready = {r.deployment_id for r in self.ledger.live() if r.state == "ready"}
        assert ready == set(self.ready)

    def teardown(self) -> None:
        self.ledger.close()
        self.tmp.cleanup()


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)


# -- concurrency -----------------------------------------------------------------------

FREE = 50 * GiB
ASK = FREE // 50
ONE_GPU = {"GPU-0": FREE}


def admit_many(path: Path, prefix: str, count: int, ledger: Ledger | None = None) -> int:
    """Admit ``count`` deployments asking ``ASK`` each against one GPU; return how many got in."""
    own = ledger is None
    ledger = ledger or Ledger(path)
    try:
        return sum(
            ledger.admit(f"{prefix}-{i}", "m", fit(ONE_GPU, ASK), ttl_seconds=600) is not None
            for i in range(count)
        )
    finally:
        if own:
            ledger.close()


def assert_exactly_fifty(path: Path, admitted: int) -> None:
    assert admitted == 50
    with Ledger(path) as ledger:
        outstanding = ledger.outstanding()
    assert len(outstanding) == 50
    assert promised(outstanding, "GPU-0") == FREE


def test_200_threads_sharing_one_ledger(tmp_path: Path) -> None:
    path = ledger_path(tmp_path)
    with Ledger(path) as ledger, ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda i: admit_many(path, f"t{i}", 1, ledger), range(200)))
    assert_exactly_fifty(path, sum(results))


def test_200_threads_each_with_its_own_ledger(tmp_path: Path) -> None:
    path = ledger_path(tmp_path)
    Ledger(path).close()
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: admit_many(path, f"t{i}", 25), range(8)))
    assert_exactly_fifty(path, sum(results))


def _process_main(
    path: str,
    prefix: str,
    barrier: multiprocessing.synchronize.Barrier,
    out: multiprocessing.Queue[int],
) -> None:
    """One process: 4 threads, each with its own connection, 25 admissions each."""
    barrier.wait(timeout=60)
    with ThreadPoolExecutor(max_workers=4) as pool:
        counts = pool.map(lambda i: admit_many(Path(path), f"{prefix}-{i}", 25), range(4))
        out.put(sum(counts))


def test_two_processes_on_one_file(tmp_path: Path) -> None:
    path = ledger_path(tmp_path)
    Ledger(path).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out: multiprocessing.Queue[int] = ctx.Queue()
    procs = [
        ctx.Process(target=_process_main, args=(str(path), f"p{i}", barrier, out)) for i in range(2)
    ]
    for p in procs:
        p.start()
    counts = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert_exactly_fifty(path, sum(counts))
