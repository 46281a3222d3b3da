"""The data of a placement: the request, and the decision with its GPU
lines, placement and suggestions, and the decision's machine-readable form (bytes as
integers). ``gatekeeper.placement.decision`` makes decisions."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import Estimate
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.sizing import kv_text, sequences_held
from gatekeeper.units import format_gib
from gatekeeper.vllm.launch import LaunchFlags

__all__ = [
    "Decision",
    "GpuLine",
    "Placement",
    "PlacementRequest",
    "Prediction",
    "Suggestion",
    "auto_parallel",
]


def auto_parallel(given: Iterable[str]) -> bool:
    """Whether placement searches TP (and PP) sizes: only when the request ``given``
    (the option names the operator set) fixes neither."""
    return not {"tensor_parallel_size", "pipeline_parallel_size"} & set(given)


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
    learned from earlier workers of the same family (``gatekeeper.estimator.calibration``)."""
    draft: ModelSpec | None = None
    """The speculative draft model's spec, when the options' ``speculative_config`` names
    one (``gatekeeper.estimator.speculative.draft_reference``)."""


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
class Prediction:
    """The per-GPU bytes a placement was sized by (its worst pipeline stage), by component:
    one field per ``gatekeeper.estimator.components`` ``field``, which is also its JSON key."""

    weights_bytes: int = 0
    non_torch_bytes: int = 0
    activation_peak_bytes: int = 0
    cuda_graph_bytes: int = 0
    kv_cache_bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Prediction | None:
        """The prediction a decision's JSON recorded (``placement.predicted``); a missing
        or non-integer figure reads as 0, and a record with no figure at all as None."""
        figures = {
            f.name: value
            for f in dataclasses.fields(cls)
            if isinstance(value := data.get(f.name), int) and not isinstance(value, bool)
        }
        return cls(**figures) if figures else None


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

    @property
    def prediction(self) -> Prediction:
        w = self.estimate.worst
        return Prediction(
            weights_bytes=w.weights_bytes,
            non_torch_bytes=w.non_torch_bytes,
            activation_peak_bytes=w.activation_peak_bytes,
            cuda_graph_bytes=w.cuda_graph_bytes,
            kv_cache_bytes=self.kv_cache_bytes,
        )


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
    warnings: tuple[str, ...] = ()
    """What an admitted worker will not do as asked (its KV cache cannot run
    max_num_seqs sequences of max_model_len at once)."""

    def promises(self) -> tuple[tuple[str, int], ...]:
        """(GPU UUID, bytes) to reserve; empty when rejected."""
        if self.placement is None:
            return ()
        return tuple(zip(self.placement.gpu_uuids, self.placement.promise_bytes, strict=True))

    def to_json(self) -> dict[str, Any]:
        """The machine-readable form (bytes as integers), as the API and records show it."""
        return _decision_json(self)


def _gpu_json(g: GpuLine) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "total_bytes": g.total_bytes,
        "free_bytes": g.free_bytes,
        "reserved_bytes": g.reserved_bytes,
        "margin_bytes": g.margin_bytes,
        "usable_bytes": g.usable_bytes,
        "workers": g.workers,
        "need_bytes": g.need_bytes,
        "status": g.status,
        "text": g.text(),
    }


def _placement_json(p: Placement) -> dict[str, Any]:
    f = p.flags
    return {
        "gpu_indices": list(p.gpu_indices),
        "gpu_uuids": list(p.gpu_uuids),
        "promise_bytes": list(p.promise_bytes),
        "vllm_args": list(p.args),
        "flags": {
            "max_model_len": f.max_model_len,
            "tensor_parallel_size": f.tensor_parallel_size,
            "pipeline_parallel_size": f.pipeline_parallel_size,
            "gpu_memory_utilization": f.gpu_memory_utilization,
            "kv_cache_memory_bytes": f.kv_cache_memory_bytes,
            "max_num_seqs": f.max_num_seqs,
            "max_num_batched_tokens": f.max_num_batched_tokens,
        },
        "predicted": p.prediction.to_json(),
        "host_bytes": p.estimate.host.host_bytes,
        "host": p.estimate.host.to_json(),
        "kv_sequences": sequences_held(p.estimate, p.kv_cache_bytes),
        "sizing": kv_text(p.estimate, p.kv_cache_bytes),
        "vllm_version": p.estimate.vllm_version,
        "accounting": p.estimate.accounting,
    }


def _decision_json(d: Decision) -> dict[str, Any]:
    return {
        "model": d.model,
        "admitted": d.admitted,
        "placement": _placement_json(d.placement) if d.placement is not None else None,
        "reasons": list(d.reasons),
        "gpus": [_gpu_json(g) for g in d.gpus],
        "suggestions": [
            {"kind": s.kind, "text": s.text, "options": dict(s.options)} for s in d.suggestions
        ],
        "warnings": list(d.warnings),
    }
