"""The reservations ledger: bytes promised to workers that are still starting.

A SQLite file in the state directory (``ledger_path(state_dir)``), shared by every
thread and process on the node. ``Ledger.admit`` runs one write transaction (``BEGIN
IMMEDIATE``): sweep stale reservations, read the outstanding ones, call the caller's
pure ``decide`` with them and write the ``Promise``s it returns; SQLite lets one writer
in at a time, so no bytes are promised twice. The ledger does not know what a decision
is; ``payload`` turns it into the JSON text stored with each row.

Lifecycle (one row per GPU)::

    pending --mark_ready--> ready --release--> released
       +---- release, or past expires_at (swept) ----^

A pending row past ``expires_at`` is dead everywhere (not outstanding, not live,
cannot become ready). ``ready`` rows no longer count (the worker's usage is in NVML's
figure) but are kept for adoption after a restart (``live()``); ``ready_at`` records
when a row became ready, so that ``admit(since=…)`` can still count a row that turned
ready after the caller's GPU snapshot was taken. See docs/ledger.md.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from gatekeeper.errors import GatekeeperError

__all__ = [
    "LEDGER_FILENAME",
    "SCHEMA_VERSION",
    "Ledger",
    "LedgerError",
    "LedgerLostError",
    "Promise",
    "Reservation",
    "ReservationState",
    "default_payload",
    "ledger_path",
    "ledger_usage",
    "promised_bytes",
    "workers_per_gpu",
]

T = TypeVar("T")

ReservationState = Literal["pending", "ready", "released"]

LEDGER_FILENAME = "reservations.sqlite3"
"""The ledger's file name inside the state directory."""

SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of the schema this module writes."""

_MAX_BYTES = 2**63 - 1  # SQLite's INTEGER range

_SCHEMA = """
CREATE TABLE reservations (
    id TEXT PRIMARY KEY,
    deployment_id TEXT NOT NULL,
    model TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    bytes INTEGER NOT NULL CHECK (bytes > 0),
    state TEXT NOT NULL CHECK (state IN ('pending', 'ready', 'released')),
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    released_at REAL,
    pid INTEGER,
    payload TEXT NOT NULL,
    ready_at REAL
);
CREATE INDEX reservations_by_state ON reservations (state, expires_at);
CREATE INDEX reservations_by_deployment ON reservations (deployment_id);
"""

_COLUMNS = (
    "id, deployment_id, model, gpu_uuid, bytes, state, created_at, expires_at, pid, payload,"
    " ready_at"
)
_OUTSTANDING = "state = 'pending' AND expires_at > ?"
_LIVE = "(state = 'ready' OR (state = 'pending' AND expires_at > ?))"
_READY_SINCE = "state = 'ready' AND ready_at >= ?"
_MIGRATIONS = {1: ("ALTER TABLE reservations ADD COLUMN ready_at REAL",)}
"""Statements that bring a file of schema version ``key`` to ``key + 1``."""


class LedgerError(GatekeeperError):
    """The ledger refused an input, or its file cannot be used."""


class LedgerLostError(LedgerError):
    """The ledger's file was removed, moved aside or replaced while it was open: SQLite
    then refuses every write as "read-only" (``SQLITE_READONLY_DBMOVED``). The owner
    recreates it (``Ledger.reopen``) and writes its workers' rows back
    (``Ledger.restore``)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """Bytes promised to one deployment on one GPU."""

    id: str
    """Random identifier (uuid4 hex)."""
    deployment_id: str
    """The caller's id of the deployment or worker; every row of one admission shares it."""
    model: str
    gpu_uuid: str
    bytes: int
    """Promised bytes on that GPU (> 0)."""
    state: ReservationState
    created_at: float
    """Clock seconds when admitted."""
    expires_at: float
    """A pending reservation is stale from this clock time on."""
    pid: int | None
    """The worker's pid once launched (for adoption after a restart), else ``None``."""
    payload: str
    """JSON text stored by the caller with the reservation (the decision)."""
    ready_at: float | None = None
    """Clock seconds when the row became ready (``mark_ready``/``adopt_ready``), else
    ``None`` (still pending, released before ready, or a ready row from schema 1)."""


@dataclass(frozen=True, slots=True)
class Promise:
    """What a ``decide`` callback asks the ledger to reserve."""

    gpu_uuid: str
    bytes: int


def ledger_path(state_dir: Path) -> Path:
    """The ledger file in a state directory (``~`` expanded)."""
    return state_dir.expanduser() / LEDGER_FILENAME


def promised_bytes(reservations: Iterable[Reservation]) -> dict[str, int]:
    """Bytes promised per GPU UUID: the ``reserved`` map placement subtracts."""
    totals: dict[str, int] = {}
    for r in reservations:
        totals[r.gpu_uuid] = totals.get(r.gpu_uuid, 0) + r.bytes
    return totals


def workers_per_gpu(reservations: Iterable[Reservation]) -> dict[str, int]:
    """Live gatekeeper workers per GPU UUID (one per deployment and GPU)."""
    seen = {(r.deployment_id, r.gpu_uuid) for r in reservations}
    counts: dict[str, int] = {}
    for _, gpu in seen:
        counts[gpu] = counts.get(gpu, 0) + 1
    return counts


def ledger_usage(state_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """What the ledger in ``state_dir`` means for placement: (bytes promised to workers
    still starting, by GPU UUID; live gatekeeper workers, by GPU UUID). Empty without a
    ledger (the CLI's ``check`` and ``gpus`` on a node where no sidecar ran)."""
    path = ledger_path(state_dir)
    if not path.is_file():
        return {}, {}
    with Ledger(path) as ledger:
        return dict(promised_bytes(ledger.outstanding())), workers_per_gpu(ledger.live())


def default_payload(decision: object) -> str:
    """JSON text of a decision: a dataclass instance as its fields, anything else as is."""
    value = decision
    if is_dataclass(decision) and not isinstance(decision, type):
        value = asdict(decision)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise _invalid(
            "payload",
            type(decision).__name__,
            f"the decision is not JSON-serialisable ({e}); pass payload= to Ledger.admit",
        ) from e


class Ledger:
    """The reservations ledger in one SQLite file; safe across threads and processes.

    One connection per ``Ledger``, used under a lock; SQLite's own file locking
    (rollback journal, ``busy_timeout``) serialises writers across processes. ``timeout_seconds`` bounds
    how long a call waits for another writer before raising ``LedgerError``.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        timeout_seconds: float = 30.0,
    ) -> None:
        _require_seconds("timeout_seconds", timeout_seconds, "seconds to wait for another writer")
        self.path = path.expanduser()
        self._clock = clock
        self._timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._conn: sqlite3.Connection | None = _connect(self.path, timeout_seconds)
        self._identity = _file_identity(self.path)

    def vanished(self) -> bool:
        """True when the file this ledger opened is no longer at its path (removed,
        moved aside or replaced by another file): one ``stat``."""
        return self._conn is not None and _file_identity(self.path) != self._identity

    def reopen(self) -> None:
        """Close the connection and open the file at ``path`` again, creating an empty
        ledger there when it is gone (after ``vanished()``): the caller then writes its
        workers' rows back with ``restore``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._conn = _connect(self.path, self._timeout_seconds)
            self._identity = _file_identity(self.path)

    def close(self) -> None:
        """Close the connection; later calls raise ``LedgerError``. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def now(self) -> float:
        """The ledger's clock: the time ``ready_at`` is written in (pass it to ``admit``
        as ``since``)."""
        return self._clock()

    def admit(
        self,
        deployment_id: str,
        model: str,
        decide: Callable[[tuple[Reservation, ...]], tuple[T, tuple[Promise, ...]]],
        *,
        ttl_seconds: float,
        payload: Callable[[T], str] = default_payload,
        since: float | None = None,
    ) -> T:
        """Decide and reserve in one transaction; return the decision.

        ``decide(outstanding)`` gets the pending, unexpired reservations and returns
        ``(decision, promises)``; a non-empty ``promises`` is written as one pending
        reservation per promise, expiring ``ttl_seconds`` from now. ``decide`` must be
        pure and fast (other writers wait for it) and must not call the ledger. If it
        (or ``payload``) raises, nothing is written and the exception propagates.

        ``since`` closes the gap between the caller's GPU snapshot and this
        transaction: take ``since = ledger.now()`` *before* reading the snapshot, and
        the rows that became ready at or after ``since`` are handed to ``decide`` too
        (after the pending ones), counted as promised. A worker that turned ready in
        between may be in the snapshot's used memory as well, so it can be counted
        twice (a conservative refusal) but never zero times (an over-commit).
        ``None`` hands over the pending rows only.
        """
        _require_id("deployment_id", deployment_id)
        _require_id("model", model)
        _require_seconds("ttl_seconds", ttl_seconds, "how long a starting worker may hold it")
        if since is not None and not (
            not isinstance(since, bool) and isinstance(since, int | float) and math.isfinite(since)
        ):
            raise _invalid("since", since, "give the ledger time (ledger.now()) or None")
        with self._write() as conn:
            now = self._clock()
            _sweep(conn, now)
            counted = _select(conn, _OUTSTANDING, (now,))
            if since is not None:
                counted += _select(conn, _READY_SINCE, (since,))
            decision, promises = decide(counted)
            checked = _check_promises(promises)
            if checked:
                _require_not_live(conn, deployment_id, now)
                text = payload(decision)
                if not isinstance(text, str):
                    raise _invalid("payload", type(text).__name__, "return JSON text (a str)")
                common = (now, now + ttl_seconds, text)
                rows = [(deployment_id, model, p.gpu_uuid, p.bytes, *common) for p in checked]
                conn.executemany(
                    "INSERT INTO reservations (id, deployment_id, model, gpu_uuid, bytes, state,"
                    " created_at, expires_at, payload) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                    [(uuid.uuid4().hex, *row) for row in rows],
                )
            return decision

    def mark_ready(self, deployment_id: str) -> int:
        """Pending, unexpired reservations of a deployment become ready; returns the count.

        0 means the reservation had expired or was released: the worker runs without
        one, so the caller should stop it (or admit it again)."""
        _require_id("deployment_id", deployment_id)
        return self._update(
            "UPDATE reservations SET state = 'ready', ready_at = ?1 "
            "WHERE deployment_id = ?2 AND state = 'pending' AND expires_at > ?1",
            (self._clock(), deployment_id),
        )

    def adopt_ready(self, deployment_id: str) -> int:
        """A worker found serving after a sidecar restart: every row of its deployment
        becomes ready again, pending or already swept for expiry (the worker is
        healthy and its memory is in NVML's figure, so it must not be stopped for the
        lateness of its sidecar); returns the count. Call it only for a worker whose
        identity (pid and start time) and health were checked."""
        _require_id("deployment_id", deployment_id)
        return self._update(
            "UPDATE reservations SET state = 'ready', released_at = NULL, ready_at = ? "
            "WHERE deployment_id = ? AND state != 'ready'",
            (self._clock(), deployment_id),
        )

    def release(self, deployment_id: str) -> int:
        """Every unreleased reservation of a deployment becomes released; returns the count."""
        _require_id("deployment_id", deployment_id)
        return self._update(
            "UPDATE reservations SET state = 'released', released_at = ? "
            "WHERE deployment_id = ? AND state != 'released'",
            (self._clock(), deployment_id),
        )

    def restore(
        self,
        deployment_id: str,
        model: str,
        promises: tuple[Promise, ...],
        *,
        ready: bool,
        ttl_seconds: float,
        pid: int | None = None,
        payload: str = "{}",
    ) -> int:
        """Write back the rows of a running worker that the ledger does not hold (its file
        was lost, or replaced by a new one): ``ready`` rows for a serving worker,
        pending ones expiring ``ttl_seconds`` from now for one still loading. A
        deployment with any row, released ones included, is left as it is (0 is
        returned): only a deployment the ledger never saw is restored."""
        _require_id("deployment_id", deployment_id)
        _require_id("model", model)
        _require_seconds("ttl_seconds", ttl_seconds, "how long a loading worker may hold it")
        checked = _check_promises(promises)
        with self._write() as conn:
            query = "SELECT 1 FROM reservations WHERE deployment_id = ? LIMIT 1"
            if conn.execute(query, (deployment_id,)).fetchone() is not None:
                return 0
            now = self._clock()
            state, ready_at = ("ready", now) if ready else ("pending", None)
            common = (state, now, now + ttl_seconds, pid, payload, ready_at)
            rows = [
                (uuid.uuid4().hex, deployment_id, model, p.gpu_uuid, p.bytes, *common)
                for p in checked
            ]
            conn.executemany(
                f"INSERT INTO reservations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return len(rows)

    def set_pid(self, deployment_id: str, pid: int) -> None:
        """Record the worker's pid on the deployment's live reservations."""
        _require_id("deployment_id", deployment_id)
        if not (_is_int(pid) and pid > 0):
            raise _invalid("pid", pid, "give the worker's process id (an int > 0)")
        count = self._update(
            f"UPDATE reservations SET pid = ? WHERE deployment_id = ? AND {_LIVE}",
            (pid, deployment_id, self._clock()),
        )
        if count == 0:
            raise _invalid(
                "deployment_id",
                deployment_id,
                "it has no live reservation (never admitted, released, or expired before "
                "launch); stop the worker or admit it again",
            )

    def sweep(self) -> int:
        """Release pending reservations past ``expires_at``; returns the count."""
        with self._write() as conn:
            return _sweep(conn, self._clock())

    def prune(self, older_than_seconds: float) -> int:
        """Delete reservations released more than ``older_than_seconds`` ago; returns the count."""
        _require_seconds(
            "older_than_seconds", older_than_seconds, "age of released rows", zero=True
        )
        return self._update(
            "DELETE FROM reservations WHERE state = 'released' AND released_at <= ?",
            (self._clock() - older_than_seconds,),
        )

    def outstanding(self) -> tuple[Reservation, ...]:
        """Pending reservations that have not expired: bytes promised but not yet in use."""
        with self._read() as conn:
            return _select(conn, _OUTSTANDING, (self._clock(),))

    def live(self) -> tuple[Reservation, ...]:
        """Ready reservations and unexpired pending ones (what to adopt after a restart)."""
        with self._read() as conn:
            return _select(conn, _LIVE, (self._clock(),))

    def by_deployment(self, deployment_id: str) -> tuple[Reservation, ...]:
        """Every reservation of a deployment, released ones included, oldest first."""
        _require_id("deployment_id", deployment_id)
        with self._read() as conn:
            return _select(conn, "deployment_id = ?", (deployment_id,))

    def _update(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._write() as conn:
            return conn.execute(sql, args).rowcount

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._locked() as conn, _translated(self.path, self._timeout_seconds, self._identity):
            yield conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with (
            self._locked() as conn,
            _translated(self.path, self._timeout_seconds, self._identity),
            _transaction(conn),
        ):
            yield conn

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        if self._owner == threading.get_ident():
            raise LedgerError(
                "the ledger was called from inside admit()'s decide callback; decide must be "
                "pure: use the outstanding reservations it is given"
            )
        with self._lock:
            if self._conn is None:
                raise LedgerError(f"the ledger {self.path} is closed; open a new Ledger")
            self._owner = threading.get_ident()
            try:
                yield self._conn
            finally:
                self._owner = None


def _connect(path: Path, timeout_seconds: float) -> sqlite3.Connection:
    if path.is_dir():
        raise _invalid(
            "path", str(path), f"it is a directory; give the ledger file, e.g. {ledger_path(path)}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _invalid(
            "path",
            str(path),
            f"cannot create {path.parent} ({e.strerror}); set GATEKEEPER_STATE_DIR to a writable directory",
        ) from e
    conn = sqlite3.connect(
        path, timeout=timeout_seconds, isolation_level=None, check_same_thread=False
    )
    try:
        with _translated(path, timeout_seconds):
            conn.execute(f"PRAGMA busy_timeout = {int(timeout_seconds * 1000)}")
            # No memory-mapped I/O anywhere: WAL's index (-shm) is an mmap, and a page of
            # it that the kernel cannot back (the file truncated by another opener, a disk
            # gone read-only or full) is a SIGBUS that kills the sidecar. With a rollback
            # journal and mmap_size 0 every failure is an error from a read or write call,
            # which _translated turns into an answer. A file left in WAL mode by an older
            # gatekeeper is converted here (its WAL is checkpointed first).
            conn.execute("PRAGMA mmap_size = 0")
            mode = conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
            if str(mode).lower() != "delete":
                raise sqlite3.OperationalError(
                    f"database is locked: its journal mode stays {mode!r} while another "
                    "process has it open in WAL mode"
                )
            conn.execute("PRAGMA synchronous = FULL")
            with _transaction(conn):
                _migrate(conn, path)
    except LedgerError:
        conn.close()
        raise
    return conn


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: SQLite lets one in at a time across every process."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Create the schema in a new file, bring an older one up to date (``_MIGRATIONS``:
    version 1 gains ``ready_at``, NULL on its rows); refuse a file this version cannot
    read."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reservations'"
    if version > SCHEMA_VERSION or conn.execute(query).fetchone() is None:
        raise _invalid(
            "path",
            str(path),
            f"it is not a ledger this gatekeeper reads (schema version {version}, this one "
            f"writes {SCHEMA_VERSION}); move it aside (a new ledger is started) or upgrade",
        )
    while version < SCHEMA_VERSION:
        for statement in _MIGRATIONS[version]:
            conn.execute(statement)
        version += 1
        conn.execute(f"PRAGMA user_version = {version}")


def _sweep(conn: sqlite3.Connection, now: float) -> int:
    return conn.execute(
        "UPDATE reservations SET state = 'released', released_at = ? "
        "WHERE state = 'pending' AND expires_at <= ?",
        (now, now),
    ).rowcount


def _select(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> tuple[Reservation, ...]:
    cursor = conn.execute(
        f"SELECT {_COLUMNS} FROM reservations WHERE {where} ORDER BY created_at, rowid", args
    )
    return tuple(Reservation(*row) for row in cursor.fetchall())


def _require_not_live(conn: sqlite3.Connection, deployment_id: str, now: float) -> None:
    query = f"SELECT 1 FROM reservations WHERE deployment_id = ? AND {_LIVE} LIMIT 1"
    if conn.execute(query, (deployment_id, now)).fetchone() is not None:
        raise _invalid(
            "deployment_id",
            deployment_id,
            "it already holds live reservations; release it first or use a new deployment id",
        )


def _check_promises(promises: object) -> tuple[Promise, ...]:
    if not isinstance(promises, tuple | list):
        raise _invalid(
            "promises", type(promises).__name__, "decide must return (decision, tuple of Promise)"
        )
    for p in promises:
        if not isinstance(p, Promise):
            raise _invalid(
                "promises", type(p).__name__, "decide must return Promise(gpu_uuid, bytes) items"
            )
        _require_id("gpu_uuid", p.gpu_uuid)
        if not (_is_int(p.bytes) and 0 < p.bytes <= _MAX_BYTES):
            raise _invalid(
                "bytes", p.bytes, f"a promise on {p.gpu_uuid} must be an int number of bytes > 0"
            )
    return tuple(promises)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_id(field: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise _invalid(field, value, f"give a non-empty string {field}")


def _require_seconds(field: str, value: float, meaning: str, *, zero: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not (ok and (value >= 0 if zero else value > 0)):
        bound = ">= 0" if zero else "> 0"
        raise _invalid(field, value, f"give a finite number of seconds {bound} ({meaning})")


def _invalid(field: str, value: object, advice: str) -> LedgerError:
    return LedgerError(
        f"ledger: {field} = {value!r} is invalid: {advice}", field=field, value=value
    )


def _lost(path: Path, text: str) -> LedgerLostError:
    return LedgerLostError(
        f"ledger: {path} was removed or replaced while the sidecar ran ({text}): the "
        "sidecar recreates it and writes its running workers' reservations back; retry in "
        "a few seconds (moving the ledger aside under a running sidecar is never needed: "
        "stop the sidecar first)",
        field="path",
        value=str(path),
    )


def _file_identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@contextmanager
def _translated(
    path: Path, timeout_seconds: float, identity: tuple[int, int] | None = None
) -> Iterator[None]:
    """Turn a ``sqlite3.Error`` into a ``LedgerError`` that names the file and what to do
    (a ``LedgerLostError`` when the opened file is no longer at ``path``)."""
    try:
        yield
    except sqlite3.Error as e:
        text = f"{type(e).__name__}: {e}"
        if identity is not None and _file_identity(path) != identity:
            raise _lost(path, text) from e
        if "locked" in text or "busy" in text:
            advice = (
                f"another writer held it for more than {timeout_seconds} s; look for a hung "
                f"process holding it (fuser {path}) or raise timeout_seconds"
            )
        elif "disk is full" in text or "disk I/O error" in text:
            advice = (
                f"the disk holding {path.parent} is full or failing: free space there (or set "
                "GATEKEEPER_STATE_DIR to another disk); nothing was written"
            )
        elif "readonly" in text or "read-only" in text or _read_only(path.parent):
            advice = (
                f"{path.parent} is read-only: remount it read-write, fix its permissions, or "
                "set GATEKEEPER_STATE_DIR to a writable directory; nothing was written"
            )
        elif "unable to open" in text:
            advice = (
                f"check the permissions of {path.parent} and of the file (SQLite creates its "
                "journal beside it), or set GATEKEEPER_STATE_DIR to a writable directory"
            )
        else:
            advice = (
                "it is unreadable or damaged; move it aside (gatekeeper starts a new ledger; "
                "running workers are then re-adopted from NVML)"
            )
        raise LedgerError(
            f"ledger: {path} failed ({text}): {advice}", field="path", value=str(path)
        ) from e


def _read_only(directory: Path) -> bool:
    """Whether ``directory`` is on a read-only mount (SQLite says only "unable to open"
    when it cannot create its journal there)."""
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
