"""Calibration: learn how far predictions are off, per model family and component,
and correct the next admission.

When a worker reaches ready, its predicted bytes per component are paired with the
ones vLLM reported in its start-up log. For each (family, component) the correction
is an exponentially weighted mean of ``actual / raw predicted`` (the first pair sets
it; later pairs move it by ``alpha``), clamped to ``[0.8, 1.25]`` when applied. The
family is the model's ``model_type`` (``llama``, ``qwen2``): models of one family
share the code paths whose memory the estimator approximates.

Corrected components (``gatekeeper.estimator.components``' ``corrected`` column):
weights, activation, non_torch and cuda_graph. The KV cache is not corrected: vLLM gives
it what its budget leaves after the others (or exactly ``--kv-cache-memory-bytes``), so
correcting the others corrects it.

Worked example: a llama worker predicted 1.00 GiB of activation and its log says
1.20 GiB. The factor becomes 1.20, so the next llama admission plans 1.20 GiB for
that component and its error goes from +20% to 0%. A later pair of 1.10 GiB against
the corrected 1.20 GiB (raw 1.00 GiB, ratio 1.10) moves it to 0.7 x 1.20 + 0.3 x 1.10
= 1.17. A pair at 1.60 moves the stored mean the same way, but at most 1.25 is applied.

This is the pure half: ``CalibrationTable`` (immutable; ``record``, ``apply``,
``factors``) and ``scale_estimate``. The sidecar's ``Calibrator``
(``gatekeeper.sidecar.calibrator``) keeps a table behind a lock, persists it in the
state directory and can be switched off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gatekeeper.estimator.components import CORRECTED, MEMORY_COMPONENTS
from gatekeeper.estimator.vllm_method import Estimate, StageEstimate

__all__ = [
    "BOUNDS",
    "CORRECTED",
    "CalibrationTable",
    "Factor",
    "scale_estimate",
]

BOUNDS = (0.8, 1.25)
"""The range an applied factor is clamped to."""
PLAUSIBLE = (0.2, 5.0)
"""Ratios outside this range are ignored as bad readings (a misparsed log line)."""
ALPHA = 0.3
"""Weight of a new pair in the running mean."""

_STAGE_FIELDS: Mapping[str, str] = {c.name: c.field for c in MEMORY_COMPONENTS if c.corrected}
"""A corrected component's name -> its ``StageEstimate`` field."""


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
    groups = stage.weights_by_group
    if "weights_bytes" in changes and groups.entries:
        return replace(
            stage, **changes, weights_by_group=groups.scaled_to(changes["weights_bytes"])
        )
    return replace(stage, **changes)
