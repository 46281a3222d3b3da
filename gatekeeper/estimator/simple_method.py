"""The seed's rule of thumb, kept as a named method for comparison.

``M = P * (Q / 8) * 1.2`` bytes: P parameters at Q bits, plus 20% for everything else.
Llama-2-7b with P = 7e9: fp32 26.08 GiB of weights (7e9 * 4 / 2^30), fp16 13.04, int8
6.52, int4 3.26, each then x 1.2 (31.29, 15.65, 7.82, 3.91 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OVERHEAD_FACTOR", "SimpleEstimate", "simple_estimate"]

OVERHEAD_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class SimpleEstimate:
    parameters: int
    bits: int
    weights_bytes: int
    total_bytes: int


def simple_estimate(parameters: int, bits: int) -> SimpleEstimate:
    """Weights ``P * Q / 8`` and total ``x 1.2``, in bytes."""
    weights = parameters * bits // 8
    return SimpleEstimate(parameters, bits, weights, round(weights * OVERHEAD_FACTOR))
