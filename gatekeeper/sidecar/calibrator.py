"""The sidecar's calibrator: the learned corrections kept behind a lock, saved in the
state directory after every change, and switchable off.

The factors themselves and how they are learned and applied are pure
(``gatekeeper.estimator.calibration``); this module adds the file
(``calibration.json``, written atomically), the lock (admissions read while workers
turning ready write) and the clock (when a factor was last updated).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gatekeeper.estimator.calibration import CalibrationTable, Factor

__all__ = [
    "CALIBRATION_FILENAME",
    "CALIBRATION_SCHEMA",
    "Calibrator",
    "load_table",
    "save_table",
]

logger = logging.getLogger(__name__)

CALIBRATION_FILENAME = "calibration.json"
CALIBRATION_SCHEMA = "gatekeeper.calibration/v1"


def load_table(path: Path) -> CalibrationTable:
    """The table stored at ``path``; empty when the file is missing. A file that cannot
    be read is logged and ignored (the next save replaces it)."""
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f"schema is {data.get('schema')!r}, not {CALIBRATION_SCHEMA!r}")
        entries = {(str(e["family"]), str(e["component"])): _factor(e) for e in data["factors"]}
    except FileNotFoundError:
        return CalibrationTable()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        logger.warning(
            "calibration: %s cannot be read (%s); starting without corrections, "
            "and the file will be rewritten after the next worker is ready",
            path,
            e,
        )
        return CalibrationTable()
    return CalibrationTable(entries)


def _factor(entry: Mapping[str, Any]) -> Factor:
    ratio, samples = float(entry["ratio"]), int(entry["samples"])
    if not math.isfinite(ratio) or ratio <= 0 or samples < 1:
        raise ValueError(f"bad entry {dict(entry)!r}")
    return Factor(ratio, samples, float(entry.get("updated_at", 0.0)))


def save_table(path: Path, table: CalibrationTable) -> None:
    """Write ``table`` to ``path`` atomically (temporary file, then rename)."""
    factors = [
        {
            "family": family,
            "component": component,
            "ratio": f.ratio,
            "samples": f.samples,
            "updated_at": f.updated_at,
        }
        for (family, component), f in sorted(table.entries.items())
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"schema": CALIBRATION_SCHEMA, "factors": factors}, indent=1))
    os.replace(tmp, path)


class Calibrator:
    """The sidecar's calibration: a table behind a lock, saved after every change.

    ``enabled=False`` (the ``calibration`` setting off) applies and records nothing.
    """

    def __init__(self, path: Path | None, *, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self._lock = threading.Lock()
        self._table = load_table(path) if path is not None and enabled else CalibrationTable()

    @classmethod
    def in_state_dir(cls, state_dir: Path, *, enabled: bool = True) -> Calibrator:
        return cls(state_dir.expanduser() / CALIBRATION_FILENAME, enabled=enabled)

    @property
    def table(self) -> CalibrationTable:
        with self._lock:
            return self._table

    def factors(self, family: str) -> dict[str, float]:
        """The corrections for ``family``'s next admission ({} when off or unknown)."""
        return self.table.factors(family) if self.enabled else {}

    def apply(self, family: str, components: Mapping[str, int]) -> dict[str, int]:
        return self.table.apply(family, components) if self.enabled else dict(components)

    def record_worker(
        self,
        family: str,
        predicted: Mapping[str, int],
        actual: Mapping[str, int],
        applied: Mapping[str, float] | None = None,
    ) -> None:
        """Learn from a worker that reached ready, and save."""
        if not self.enabled or not family:
            return
        with self._lock:
            table = self._table.record_all(
                family, predicted, actual, applied=applied, now=time.time()
            )
            if table is self._table:
                return
            self._table = table
            if self.path is not None:
                try:
                    save_table(self.path, table)
                except OSError as e:
                    logger.warning("calibration: cannot save %s (%s)", self.path, e)

    def metric_items(self) -> dict[tuple[str, str], tuple[float, int]]:
        """(family, component) -> (applied factor, samples), for the metrics."""
        if not self.enabled:
            return {}
        table = self.table
        return {k: (f.applied(table.bounds), f.samples) for k, f in table.entries.items()}
