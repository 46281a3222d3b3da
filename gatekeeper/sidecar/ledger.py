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
ready after the caller's GPU snapshot was taken. ``view()`` reads what the live rows
mean for placement, per GPU, at one moment (``ledger_view``: promised, held, workers).
The file itself (opening, schema, transactions, errors) is ``ledger_file``. See
docs/ledger.md.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from gatekeeper.sidecar.ledger_file import (
    LEDGER_FILENAME,
    SCHEMA_VERSION,
    LedgerFile,
    invalid,
)
from gatekeeper.sidecar.ledger_view import LedgerView

__all__ = [
    "LEDGER_FILENAME",
    "SCHEMA_VERSION",
    "Ledger",
    "Promise",
    "Reservation",
    "ReservationState",
    "default_payload",
    "host_promises",
    "ledger_path",
    "ledger_usage",
]

T = TypeVar("T")

ReservationState = Literal["pending", "ready", "released"]

_MAX_BYTES = 2**63 - 1  # SQLite's INTEGER range

_COLUMNS = (
    "id, deployment_id, model, gpu_uuid, bytes, state, created_at, expires_at, pid, payload,"
    " ready_at, host_bytes"
)
_OUTSTANDING = "state = 'pending' AND expires_at > ?"
_LIVE = "(state = 'ready' OR (state = 'pending' AND expires_at > ?))"
_READY_SINCE = "state = 'ready' AND ready_at >= ?"


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
    host_bytes: int = 0
    """Host bytes promised with this row (``Promise.host_bytes``): a deployment's are the
    sum over its rows; 0 in rows from schema 2 and before."""


@dataclass(frozen=True, slots=True)
class Promise:
    """What a ``decide`` callback asks the ledger to reserve."""

    gpu_uuid: str
    bytes: int
    host_bytes: int = 0
    """The part of the deployment's host bytes promised with this GPU's row (the
    deployment's host figure is the sum over its rows)."""


def host_promises(promises: Iterable[tuple[str, int]], host_bytes: int) -> tuple[Promise, ...]:
    """(GPU UUID, bytes) pairs as the rows of one deployment, with its ``host_bytes``
    spread over them (the first carries the remainder), so that their sum is its host
    promise."""
    rows = list(promises)
    share, rest = divmod(host_bytes, max(1, len(rows)))
    return tuple(
        Promise(gpu, num_bytes, share + (rest if i == 0 else 0))
        for i, (gpu, num_bytes) in enumerate(rows)
    )


def ledger_path(state_dir: Path) -> Path:
    """The ledger file in a state directory (``~`` expanded)."""
    return state_dir.expanduser() / LEDGER_FILENAME


def ledger_usage(state_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """What the ledger in ``state_dir`` means for placement: (bytes promised to workers
    still starting, by GPU UUID; live gatekeeper workers, by GPU UUID). Empty without a
    ledger (the CLI's ``check`` and ``gpus`` on a node where no sidecar ran)."""
    path = ledger_path(state_dir)
    if not path.is_file():
        return {}, {}
    with Ledger(path) as ledger:
        view = ledger.view()
    return dict(view.promised), dict(view.workers)


def default_payload(decision: object) -> str:
    """JSON text of a decision: a dataclass instance as its fields, anything else as is."""
    value = decision
    if is_dataclass(decision) and not isinstance(decision, type):
        value = asdict(decision)
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise invalid(
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
        self._file = LedgerFile(self.path, timeout_seconds)

    def vanished(self) -> bool:
        """True when the file this ledger opened is no longer at its path (removed,
        moved aside or replaced by another file): one ``stat``."""
        return self._file.vanished()

    def reopen(self) -> None:
        """Close the connection and open the file at ``path`` again, creating an empty
        ledger there when it is gone (after ``vanished()``): the caller then writes its
        workers' rows back with ``restore``."""
        self._file.reopen()

    def close(self) -> None:
        """Close the connection; later calls raise ``LedgerError``. Idempotent."""
        self._file.close()

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
            raise invalid("since", since, "give the ledger time (ledger.now()) or None")
        with self._file.write() as conn:
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
                    raise invalid("payload", type(text).__name__, "return JSON text (a str)")
                common = (now, now + ttl_seconds, text)
                rows = [
                    (deployment_id, model, p.gpu_uuid, p.bytes, p.host_bytes, *common)
                    for p in checked
                ]
                conn.executemany(
                    "INSERT INTO reservations (id, deployment_id, model, gpu_uuid, bytes,"
                    " host_bytes, state, created_at, expires_at, payload)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
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

    def asleep(self, deployment_id: str, kept: Mapping[str, int]) -> int:
        """A worker put to sleep (vLLM's ``/sleep`` answered, or an adopted worker's
        ``/is_sleeping`` said so): each live row of the deployment becomes ready with
        the bytes vLLM keeps on that GPU while asleep (``kept``, by GPU UUID); returns
        the count. Written after the worker slept, so that a crash in between leaves
        the larger figure (a worker that is asleep but still counted awake), never a
        smaller one."""
        _require_id("deployment_id", deployment_id)
        count = 0
        with self._file.write() as conn:
            now = self._clock()
            for p in _check_promises([Promise(g, b) for g, b in kept.items()]):
                count += conn.execute(
                    "UPDATE reservations SET state = 'ready', bytes = ?1,"
                    " ready_at = COALESCE(ready_at, ?2) WHERE deployment_id = ?3"
                    " AND gpu_uuid = ?4 AND (state = 'ready' OR (state = 'pending'"
                    " AND expires_at > ?2))",
                    (p.bytes, now, deployment_id, p.gpu_uuid),
                ).rowcount
        return count

    def wake(
        self,
        deployment_id: str,
        decide: Callable[[tuple[Reservation, ...]], tuple[T, tuple[Promise, ...]]],
        *,
        ttl_seconds: float,
    ) -> T:
        """Admit a sleeping worker's wake in one transaction, as ``admit`` admits a new
        one: ``decide(outstanding)`` gets the pending rows and returns ``(decision,
        promises)``; a non-empty ``promises`` turns the deployment's ready row on each
        promised GPU pending again with the promised bytes (its whole size awake),
        expiring ``ttl_seconds`` from now, until ``mark_ready`` once it is awake (or
        ``release`` when the wake fails)."""
        _require_id("deployment_id", deployment_id)
        _require_seconds("ttl_seconds", ttl_seconds, "how long a waking worker may hold it")
        with self._file.write() as conn:
            now = self._clock()
            _sweep(conn, now)
            decision, promises = decide(_select(conn, _OUTSTANDING, (now,)))
            for p in _check_promises(promises):
                conn.execute(
                    "UPDATE reservations SET state = 'pending', bytes = ?, expires_at = ?,"
                    " ready_at = NULL WHERE deployment_id = ? AND gpu_uuid = ?"
                    " AND state = 'ready'",
                    (p.bytes, now + ttl_seconds, deployment_id, p.gpu_uuid),
                )
            return decision

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
        with self._file.write() as conn:
            query = "SELECT 1 FROM reservations WHERE deployment_id = ? LIMIT 1"
            if conn.execute(query, (deployment_id,)).fetchone() is not None:
                return 0
            now = self._clock()
            state, ready_at = ("ready", now) if ready else ("pending", None)
            common = (state, now, now + ttl_seconds, pid, payload, ready_at)
            rows = [
                (uuid.uuid4().hex, deployment_id, model, p.gpu_uuid, p.bytes, *common, p.host_bytes)
                for p in checked
            ]
            conn.executemany(
                f"INSERT INTO reservations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return len(rows)

    def set_pid(self, deployment_id: str, pid: int) -> None:
        """Record the worker's pid on the deployment's live reservations."""
        _require_id("deployment_id", deployment_id)
        if not (_is_int(pid) and pid > 0):
            raise invalid("pid", pid, "give the worker's process id (an int > 0)")
        count = self._update(
            f"UPDATE reservations SET pid = ? WHERE deployment_id = ? AND {_LIVE}",
            (pid, deployment_id, self._clock()),
        )
        if count == 0:
            raise invalid(
                "deployment_id",
                deployment_id,
                "it has no live reservation (never admitted, released, or expired before "
                "launch); stop the worker or admit it again",
            )

    def sweep(self) -> int:
        """Release pending reservations past ``expires_at``; returns the count."""
        with self._file.write() as conn:
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
        with self._file.read() as conn:
            return _select(conn, _OUTSTANDING, (self._clock(),))

    def view(self) -> LedgerView:
        """Promised, held and live workers per GPU, from one read of the live rows
        (``gatekeeper.sidecar.ledger_view``)."""
        return LedgerView.of(self.live())

    def live(self) -> tuple[Reservation, ...]:
        """Ready reservations and unexpired pending ones (what to adopt after a restart)."""
        with self._file.read() as conn:
            return _select(conn, _LIVE, (self._clock(),))

    def by_deployment(self, deployment_id: str) -> tuple[Reservation, ...]:
        """Every reservation of a deployment, released ones included, oldest first."""
        _require_id("deployment_id", deployment_id)
        with self._file.read() as conn:
            return _select(conn, "deployment_id = ?", (deployment_id,))

    def _update(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._file.write() as conn:
            return conn.execute(sql, args).rowcount


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
        raise invalid(
            "deployment_id",
            deployment_id,
            "it already holds live reservations; release it first or use a new deployment id",
        )


def _check_promises(promises: object) -> tuple[Promise, ...]:
    if not isinstance(promises, tuple | list):
        raise invalid(
            "promises", type(promises).__name__, "decide must return (decision, tuple of Promise)"
        )
    for p in promises:
        if not isinstance(p, Promise):
            raise invalid(
                "promises", type(p).__name__, "decide must return Promise(gpu_uuid, bytes) items"
            )
        _require_id("gpu_uuid", p.gpu_uuid)
        if not (_is_int(p.bytes) and 0 < p.bytes <= _MAX_BYTES):
            raise invalid(
                "bytes", p.bytes, f"a promise on {p.gpu_uuid} must be an int number of bytes > 0"
            )
        if not (_is_int(p.host_bytes) and 0 <= p.host_bytes <= _MAX_BYTES):
            raise invalid(
                "host_bytes",
                p.host_bytes,
                f"a promise on {p.gpu_uuid} must carry an int number of host bytes >= 0",
            )
    return tuple(promises)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_id(field: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise invalid(field, value, f"give a non-empty string {field}")


def _require_seconds(field: str, value: float, meaning: str, *, zero: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not (ok and (value >= 0 if zero else value > 0)):
        bound = ">= 0" if zero else "> 0"
        raise invalid(field, value, f"give a finite number of seconds {bound} ({meaning})")
