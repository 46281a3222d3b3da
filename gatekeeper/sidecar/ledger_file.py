"""The ledger's SQLite file and its one connection (``LedgerFile``): open it (rollback
journal, no memory mapping), create or migrate its schema, use it under a lock for one
read or one write transaction at a time, see it vanish from its path, and turn SQLite's
errors into ``LedgerError``s that name the file and what to do.
``gatekeeper.sidecar.ledger`` holds the rows and what they mean; see docs/ledger.md
("File, locking and errors").

Imports ``sqlite3``, ``threading`` and ``gatekeeper.errors`` only.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gatekeeper.errors import GatekeeperError

__all__ = [
    "LEDGER_FILENAME",
    "SCHEMA_VERSION",
    "LedgerError",
    "LedgerFile",
    "LedgerLostError",
    "connect",
    "file_identity",
    "invalid",
    "transaction",
    "translated",
]

LEDGER_FILENAME = "reservations.sqlite3"
"""The ledger's file name inside the state directory."""

SCHEMA_VERSION = 3
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
    ready_at REAL,
    host_bytes INTEGER NOT NULL DEFAULT 0 CHECK (host_bytes >= 0)
);
CREATE INDEX reservations_by_state ON reservations (state, expires_at);
CREATE INDEX reservations_by_deployment ON reservations (deployment_id);
"""


_MIGRATIONS = {
    1: ("ALTER TABLE reservations ADD COLUMN ready_at REAL",),
    2: (
        "ALTER TABLE reservations ADD COLUMN host_bytes INTEGER NOT NULL DEFAULT 0"
        " CHECK (host_bytes >= 0)",
    ),
}
"""Statements that bring a file of schema version ``key`` to ``key + 1``."""


class LedgerError(GatekeeperError):
    """The ledger refused an input, or its file cannot be used."""


class LedgerLostError(LedgerError):
    """The ledger's file was removed, moved aside or replaced while it was open: SQLite
    then refuses every write as "read-only" (``SQLITE_READONLY_DBMOVED``). The owner
    recreates it (``Ledger.reopen``) and writes its workers' rows back
    (``Ledger.restore``)."""


class LedgerFile:
    """The ledger's one connection to its file, used under a lock: one read or one
    write transaction at a time in this process (SQLite's file locking, with
    ``busy_timeout`` = ``timeout_seconds``, orders the processes)."""

    def __init__(self, path: Path, timeout_seconds: float) -> None:
        self.path = path
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._conn: sqlite3.Connection | None = connect(path, timeout_seconds)
        self._identity = file_identity(path)

    def vanished(self) -> bool:
        """True when the file opened is no longer at its path: one ``stat``."""
        return self._conn is not None and file_identity(self.path) != self._identity

    def reopen(self) -> None:
        """Close the connection and open the file at ``path`` again (creating it)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._conn = connect(self.path, self.timeout_seconds)
            self._identity = file_identity(self.path)

    def close(self) -> None:
        """Close the connection; later calls raise ``LedgerError``. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._locked() as conn, translated(self.path, self.timeout_seconds, self._identity):
            yield conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), rolled back if the body raises."""
        with (
            self._locked() as conn,
            translated(self.path, self.timeout_seconds, self._identity),
            transaction(conn),
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


def connect(path: Path, timeout_seconds: float) -> sqlite3.Connection:
    if path.is_dir():
        raise invalid(
            "path",
            str(path),
            f"it is a directory; give the ledger file, e.g. {path / LEDGER_FILENAME}",
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise invalid(
            "path",
            str(path),
            f"cannot create {path.parent} ({e.strerror}); set GATEKEEPER_STATE_DIR to a writable directory",
        ) from e
    conn = sqlite3.connect(
        path, timeout=timeout_seconds, isolation_level=None, check_same_thread=False
    )
    try:
        with translated(path, timeout_seconds):
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
            with transaction(conn):
                _migrate(conn, path)
    except LedgerError:
        conn.close()
        raise
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
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
    version 1 gains ``ready_at``, NULL on its rows; version 2 ``host_bytes``, 0 on its
    rows: workers admitted before host memory was counted promise none); refuse a file
    this version cannot read."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reservations'"
    if version > SCHEMA_VERSION or conn.execute(query).fetchone() is None:
        raise invalid(
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


def invalid(field: str, value: object, advice: str) -> LedgerError:
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


def file_identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@contextmanager
def translated(
    path: Path, timeout_seconds: float, identity: tuple[int, int] | None = None
) -> Iterator[None]:
    """Turn a ``sqlite3.Error`` into a ``LedgerError`` that names the file and what to do
    (a ``LedgerLostError`` when the opened file is no longer at ``path``)."""
    try:
        yield
    except sqlite3.Error as e:
        text = f"{type(e).__name__}: {e}"
        if identity is not None and file_identity(path) != identity:
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
