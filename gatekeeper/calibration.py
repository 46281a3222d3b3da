"""Calibration: learn how far predictions are off, per model family and component,
and correct the next admission.

When a worker reaches ready, its predicted bytes per component are paired with the
ones vLLM reported in its start-up log. For each (family, component) the correction
is an exponentially weighted mean of ``actual / raw predicted`` (the first pair sets
it; later pairs move it by ``alpha``), clamped to ``[0.8, 1.25]`` when applied. The
family is the model's ``model_type`` (``llama``, ``qwen2``): models of one family
share the code paths whose memory the estimator approximates.

Corrected components: weights, activation, non_torch and cuda_graph. The KV cache is
not corrected: vLLM gives it what its budget leaves after the others (or exactly
``--kv-cache-memory-bytes``), so correcting the others corrects it.

Worked example: a llama worker predicted 1.00 GiB of activation and its log says
1.20 GiB. The factor becomes 1.20, so the next llama admission plans 1.20 GiB for
that component and its error goes from +20% to 0%. A later pair of 1.10 GiB against
the corrected 1.20 GiB (raw 1.00 GiB, ratio 1.10) moves it to 0.7 x 1.20 + 0.3 x 1.10
= 1.17. A pair at 1.60 moves the stored mean the same way, but at most 1.25 is applied.

Pure core: ``CalibrationTable`` (immutable; ``record``, ``apply``, ``factors``) and
``scale_estimate``. Shell: ``Calibrator`` keeps a table behind a lock, persists it as
JSON in the state directory (``calibration.json``) and can be switched off.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gatekeeper.estimate import Estimate, StageEstimate

__all__ = [
    "BOUNDS",
    "CALIBRATION_FILENAME",
    "CALIBRATION_SCHEMA",
    "CORRECTED",
    "CalibrationTable",
    "Calibrator",
    "Factor",
    "load_table",
    "save_table",
    "scale_estimate",
]

logger = logging.getLogger(__name__)

CALIBRATION_FILENAME = "calibration.json"
CALIBRATION_SCHEMA = "gatekeeper.calibration/v1"
CORRECTED = ("weights", "activation", "non_torch", "cuda_graph")
"""The components a correction applies to (``gatekeeper.metrics.COMPONENTS``' names)."""
BOUNDS = (0.8, 1.25)
"""The range an applied factor is clamped to."""
PLAUSIBLE = (0.2, 5.0)
"""Ratios outside this range are ignored as bad readings (a misparsed log line)."""
ALPHA = 0.3
"""Weight of a new pair in the running mean."""

_STAGE_FIELDS = {
    "weights": "weights_bytes",
    "activation": "activation_peak_bytes",
    "non_torch": "non_torch_bytes",
    "cuda_graph": "cuda_graph_bytes",
}


@dataclass(frozen=True, slots=True)
class Factor:
    """The running mean of ``actual / raw predicted`` for one family and component."""

    ratio: float
    samples: int
    updated_at: float = 0.0

    def applied(self, bounds: tuple[float, float] = BOUNDS) -> float:
        return min(max(self.ratio, bounds[0]), bounds[1])


@dataclass(frozen=True, slots=True)
class CalibrationTable:
    """Factors keyed by (family, component); pure and immutable."""

    entries: Mapping[tuple[str, str], Factor] = field(default_factory=dict)
    alpha: float = ALPHA
    bounds: tuple[float, float] = BOUNDS

    def factor(self, family: str, component: str) -> float:
        """The factor applied to ``component`` for ``family`` (1.0 when unknown)."""
        entry = self.entries.get((family, component))
        return entry.applied(self.bounds) if entry is not None else 1.0

    def factors(self, family: str) -> dict[str, float]:
        """The factors of ``family``'s learned components."""
        return {c: self.factor(f, c) for f, c in self.entries if f == family}

    def apply(self, family: str, components: Mapping[str, int]) -> dict[str, int]:
        """``components`` (bytes by component) with ``family``'s factors applied."""
        return {c: math.ceil(b * self.factor(family, c)) for c, b in components.items()}

    def record(
        self,
        family: str,
        component: str,
        predicted: int,
        actual: int,
        *,
        applied: float = 1.0,
        now: float = 0.0,
    ) -> CalibrationTable:
        """The table after one (predicted, actual) pair; ``applied`` is the factor the
        prediction already included. Unusable pairs leave the table as it is."""
        if component not in CORRECTED or predicted <= 0 or actual < 0 or applied <= 0:
            return self
        observed = actual * applied / predicted
        if not PLAUSIBLE[0] <= observed <= PLAUSIBLE[1]:
            return self
        old = self.entries.get((family, component))
        if old is None:
            new = Factor(observed, 1, now)
        else:
            ratio = (1 - self.alpha) * old.ratio + self.alpha * observed
            new = Factor(ratio, old.samples + 1, now)
        return replace(self, entries={**self.entries, (family, component): new})

    def record_all(
        self,
        family: str,
        predicted: Mapping[str, int],
        actual: Mapping[str, int],
        *,
        applied: Mapping[str, float] | None = None,
        now: float = 0.0,
    ) -> CalibrationTable:
        """``record`` for every component present in both ``predicted`` and ``actual``."""
        table = self
        for component in CORRECTED:
            if component in predicted and component in actual:
                factor = (applied or {}).get(component, 1.0)
                table = table.record(
                    family,
                    component,
                    predicted[component],
                    actual[component],
                    applied=factor,
                    now=now,
                )
        return table


def scale_estimate(estimate: Estimate, factors: Mapping[str, float]) -> Estimate:
    """``estimate`` with each stage's corrected components multiplied by ``factors``.

    Only the static components change (weights, non-torch, activation peak, CUDA
    graphs); placement sizes the KV cache from them, so the figures it derives (the
    need per GPU, the KV that fits, the promise) follow.
    """
    wanted = {c: f for c, f in factors.items() if c in _STAGE_FIELDS and f != 1.0}
    if not wanted:
        return estimate
    return replace(estimate, stages=tuple(_scale_stage(s, wanted) for s in estimate.stages))


def _scale_stage(stage: StageEstimate, factors: Mapping[str, float]) -> StageEstimate:
    changes = {
        _STAGE_FIELDS[c]: math.ceil(getattr(stage, _STAGE_FIELDS[c]) * f)
        for c, f in factors.items()
    }
    return replace(stage, **changes)


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
