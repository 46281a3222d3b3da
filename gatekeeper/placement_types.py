"""The data of a placement: the policy, the request, and the decision with its GPU
lines, placement and suggestions. ``placement.decide`` makes decisions."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.estimate import Estimate
from gatekeeper.model_spec import ModelSpec
from gatekeeper.serve_options import ServeOptions
from gatekeeper.units import MIB, format_gib
from gatekeeper.vllm_flags import LaunchFlags

__all__ = ["Decision", "GpuLine", "Placement", "PlacementPolicy", "PlacementRequest", "Suggestion"]


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """The operator's rules for placing workers."""

    margin_bytes: int = 512 * MIB
    margin_fraction: float = 0.02
    allowed_gpus: frozenset[str] | None = None
    """GPU indices (as strings) or UUIDs gatekeeper may use; None = all."""
    share_gpus: bool = False
    """Several workers on one GPU, each with a byte budget (--kv-cache-memory-bytes)."""
    allow_pipeline: bool = False
    default_vllm_version: str = "0.33.0"


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """A model and how to serve it."""

    model: ModelSpec
    options: ServeOptions
    auto_parallel: bool = True
    """Search TP (and PP) sizes; False keeps the options' sizes as given."""
    min_kv_tokens: int | None = None
    min_sequences: int = 1
    """Concurrent sequences of max_model_len the KV cache must hold (vLLM's minimum is 1)."""
    corrections: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Calibration factors per component (weights, activation, non_torch, cuda_graph)
    learned from earlier workers of the same family (``gatekeeper.calibration``)."""


@dataclass(frozen=True, slots=True)
class GpuLine:
    """One GPU as the decision saw it."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    free_bytes: int
    reserved_bytes: int
    margin_bytes: int
    workers: int
    status: str
    """chosen, fits, too small, unhealthy, fenced, not allowed or in use."""
    need_bytes: int | None = None

    @property
    def usable_bytes(self) -> int:
        return max(0, self.free_bytes - self.reserved_bytes - self.margin_bytes)

    def text(self) -> str:
        head = (
            f"GPU {self.index} ({self.name}): {format_gib(self.usable_bytes)} usable "
            f"(free {format_gib(self.free_bytes)} - reserved {format_gib(self.reserved_bytes)} "
            f"- margin {format_gib(self.margin_bytes)})"
        )
        if self.status == "too small" and self.need_bytes is not None:
            short = self.need_bytes - self.usable_bytes
            return f"{head}; needs {format_gib(self.need_bytes)}, short by {format_gib(short)}"
        return f"{head}; {self.status}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the worker goes and how it is launched."""

    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    promise_bytes: tuple[int, ...]
    """Bytes promised on each chosen GPU until the worker is ready."""
    flags: LaunchFlags
    args: tuple[str, ...]
    estimate: Estimate
    kv_cache_bytes: int


@dataclass(frozen=True, slots=True)
class Suggestion:
    """A nearby configuration that would fit here and now (or the lack of one)."""

    kind: str
    text: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    model: str
    admitted: bool
    placement: Placement | None
    reasons: tuple[str, ...]
    gpus: tuple[GpuLine, ...]
    suggestions: tuple[Suggestion, ...] = ()

    def promises(self) -> tuple[tuple[str, int], ...]:
        """(GPU UUID, bytes) to reserve; empty when rejected."""
        if self.placement is None:
            return ()
        return tuple(zip(self.placement.gpu_uuids, self.placement.promise_bytes, strict=True))

    def to_json(self) -> dict[str, Any]:
        from gatekeeper.decision_json import decision_to_json

        return decision_to_json(self)
