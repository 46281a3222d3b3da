"""Placement: which GPUs a new vLLM worker fits on, and the flags to launch it with.

Pure: a request, a node snapshot, the bytes already promised to workers still starting,
and a policy in; a ``Decision`` out.

    usable(GPU) = NVML free - outstanding reservations - (margin + margin_fraction * total)
    need(rank)  = CUDA context (+ NCCL under TP) + weights + non-torch + activation peak
                  + CUDA graphs + the KV cache the request asks for
                  (default: vLLM's minimum, one sequence of max_model_len plus the null block)

One GPU first (best fit: the least usable memory left over), then the smallest
tensor-parallel group (2, 4, 8; TP must divide the heads; GPUs of one product preferred)
whose every member fits the per-rank need, then pipeline parallelism when the policy
allows it. Ties go to GPUs hosting fewer workers. Memory held by processes gatekeeper
did not start is already missing from NVML's free figure.

Worked example: Llama-3.1-8B, bf16, max_model_len 8192, on an idle H100 (79.19 GiB,
margin 0.5 GiB + 2%): usable 77.1 GiB; need = 0.5 context + 14.99 weights + 0.25
non-torch + 1.88 activation + 0.88 graphs + 1.0 KV = 19.5 GiB -> admitted on GPU 0 with
``--gpu-memory-utilization 0.9555`` when alone, or ``--kv-cache-memory-bytes`` when the
GPU is shared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.calibration import scale_estimate
from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimate import Estimate, GpuTarget, estimate
from gatekeeper.gpus import GpuInfo, InventorySnapshot
from gatekeeper.model_spec import ModelSpec
from gatekeeper.overhead import pre_init_bytes
from gatekeeper.placement_types import (
    Decision,
    GpuLine,
    Placement,
    PlacementPolicy,
    PlacementRequest,
    Suggestion,
)
from gatekeeper.serve_options import ServeOptions
from gatekeeper.vllm_flags import LaunchFlags, ceil_fraction, floor_fraction, launch_args

__all__ = [
    "Decision",
    "GpuLine",
    "Placement",
    "PlacementPolicy",
    "PlacementRequest",
    "Suggestion",
    "decide",
    "gpu_lines",
]

TP_SIZES = (1, 2, 4, 8)
PP_SIZES = (2, 4)


@dataclass(frozen=True, slots=True)
class _Need:
    """Per-rank bytes of one (TP, PP) shape on one GPU product."""

    estimate: Estimate
    per_stage: tuple[int, ...]
    kv_bytes: int
    static_in_budget: tuple[int, ...]

    @property
    def max_bytes(self) -> int:
        return max(self.per_stage)


def _need(
    request: PlacementRequest, tp: int, pp: int, total: int, name: str, version: str
) -> _Need:
    options = dataclasses.replace(
        request.options, tensor_parallel_size=tp, pipeline_parallel_size=pp
    )
    e = _estimate(request.model, options, total, name, version)
    if request.corrections:
        e = scale_estimate(e, request.corrections)
    kv = e.kv_bytes_for(request.min_sequences, request.min_kv_tokens)
    pairs = [e.rank_bytes(s, kv) for s in e.stages]
    return _Need(e, tuple(p[0] for p in pairs), kv, tuple(p[1] for p in pairs))


_CACHE: dict[tuple[Any, ...], tuple[ModelSpec, Estimate]] = {}
"""Estimates by (spec object, options, GPU, version). The spec is kept with its estimate
and compared by identity, so a recycled ``id`` can never return another spec's estimate
(hashing a spec whose checkpoint lists thousands of tensors on every decision would cost
more than the estimate)."""


def _estimate(
    spec: ModelSpec, options: ServeOptions, total: int, name: str, version: str
) -> Estimate:
    key = (id(spec), options, total, name, version)
    cached = _CACHE.get(key)
    if cached is not None and cached[0] is spec:
        return cached[1]
    if len(_CACHE) > 4096:
        _CACHE.clear()
    result = estimate(
        spec, options, GpuTarget(total_bytes=total, name=name), default_version=version
    )
    _CACHE[key] = (spec, result)
    return result


def gpu_lines(
    snapshot: InventorySnapshot,
    reserved: Mapping[str, int],
    workers: Mapping[str, int],
    policy: PlacementPolicy,
) -> list[GpuLine]:
    """Each GPU's usable memory and whether it is a candidate under ``policy``."""
    lines = []
    for gpu in snapshot.gpus:
        total = gpu.visible_total_bytes
        margin = policy.margin_bytes + int(policy.margin_fraction * total)
        lines.append(
            GpuLine(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                total_bytes=total,
                free_bytes=gpu.free_bytes,
                reserved_bytes=reserved.get(gpu.uuid, 0),
                margin_bytes=margin,
                workers=workers.get(gpu.uuid, 0),
                status=_status(gpu, workers.get(gpu.uuid, 0), policy),
            )
        )
    return lines


def _status(gpu: GpuInfo, workers: int, policy: PlacementPolicy) -> str:
    if not gpu.healthy:
        return f"unhealthy ({gpu.error})"
    if gpu.fence_reason:
        return f"fenced ({gpu.fence_reason})"
    allowed = policy.allowed_gpus
    if allowed is not None and str(gpu.index) not in allowed and gpu.uuid not in allowed:
        return "not allowed by the policy"
    if workers and not policy.share_gpus:
        return "in use by another gatekeeper worker (sharing is off)"
    return "candidate"


def _shapes(
    request: PlacementRequest, policy: PlacementPolicy, gpu_count: int
) -> list[tuple[int, int]]:
    o = request.options
    if not request.auto_parallel:
        return [(o.tensor_parallel_size, o.pipeline_parallel_size)]
    shapes = [(tp, 1) for tp in TP_SIZES if tp <= gpu_count]
    if policy.allow_pipeline:
        shapes += [(tp, pp) for pp in PP_SIZES for tp in TP_SIZES if tp * pp <= gpu_count]
    return shapes


def _group(candidates: list[GpuLine], size: int, needs: Mapping[int, int]) -> list[GpuLine] | None:
    """The best-fitting ``size`` GPUs among ``candidates``: from one product when any
    product has enough, else mixed; within that, the least usable memory left over, then
    the fewest workers."""

    def room(g: GpuLine) -> int:
        return g.usable_bytes - needs[g.total_bytes]

    fitting = [g for g in candidates if room(g) >= 0]
    groups = [
        sorted(same, key=lambda g: (room(g), g.workers, g.index))[:size]
        for product in sorted({g.name for g in fitting})
        if len(same := [g for g in fitting if g.name == product]) >= size
    ]
    if not groups and size > 1 and len(fitting) >= size:
        groups = [sorted(fitting, key=lambda g: (room(g), g.workers, g.index))[:size]]
    if not groups:
        return None
    return min(groups, key=lambda chosen: (sum(map(room, chosen)), sum(g.workers for g in chosen)))


def _try_shape(
    request: PlacementRequest,
    shape: tuple[int, int],
    candidates: list[GpuLine],
    policy: PlacementPolicy,
) -> tuple[list[GpuLine], dict[int, _Need]] | None:
    tp, pp = shape
    needs: dict[int, _Need] = {}
    for g in candidates:
        if g.total_bytes not in needs:
            needs[g.total_bytes] = _need(
                request, tp, pp, g.total_bytes, g.name, policy.default_vllm_version
            )
    if any(n.estimate.length_beyond_model for n in needs.values()):
        return None
    chosen = _group(candidates, tp * pp, {t: n.max_bytes for t, n in needs.items()})
    return (chosen, needs) if chosen else None


def _placement(
    request: PlacementRequest,
    chosen: list[GpuLine],
    needs: dict[int, _Need],
    policy: PlacementPolicy,
) -> Placement:
    first = needs[chosen[0].total_bytes]
    e = first.estimate
    if policy.share_gpus:
        in_budget = max(max(needs[g.total_bytes].static_in_budget) for g in chosen)
        totals = min(g.total_bytes for g in chosen)
        utilization = ceil_fraction(in_budget, totals)
        kv_budget: int | None = first.kv_bytes
        promise = tuple(needs[g.total_bytes].max_bytes for g in chosen)
    else:
        context = pre_init_bytes(e.tensor_parallel_size)
        outside = max(n.max_bytes - max(n.static_in_budget) - context for n in needs.values())
        utilization = min(
            floor_fraction(g.usable_bytes - context - outside, g.total_bytes) for g in chosen
        )
        kv_budget = None
        promise = tuple(context + outside + int(utilization * g.total_bytes) + 1 for g in chosen)
    flags = LaunchFlags(
        max_model_len=e.max_model_len,
        tensor_parallel_size=e.tensor_parallel_size,
        pipeline_parallel_size=e.pipeline_parallel_size,
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=kv_budget,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
    )
    kv = first.kv_bytes if kv_budget is not None else _kv_in(chosen, needs, utilization)
    return Placement(
        gpu_indices=tuple(g.index for g in chosen),
        gpu_uuids=tuple(g.uuid for g in chosen),
        promise_bytes=promise,
        flags=flags,
        args=launch_args(request.model.serve_reference, flags, request.options),
        estimate=e,
        kv_cache_bytes=kv,
    )


def _kv_in(chosen: list[GpuLine], needs: dict[int, _Need], utilization: float) -> int:
    """KV bytes a utilization-sized worker gets: its budget less what is not KV."""
    return min(
        int(utilization * g.total_bytes)
        - (max(needs[g.total_bytes].static_in_budget) - needs[g.total_bytes].kv_bytes)
        for g in chosen
    )


def decide(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    *,
    reserved: Mapping[str, int] | None = None,
    workers: Mapping[str, int] | None = None,
    policy: PlacementPolicy | None = None,
    suggest: bool = True,
) -> Decision:
    """Admit ``request`` on the best-fitting GPUs of ``snapshot``, or reject it with reasons.

    ``reserved`` maps GPU UUIDs to bytes promised to workers still starting; ``workers``
    maps GPU UUIDs to the number of gatekeeper workers they host.
    """
    policy = policy or PlacementPolicy()
    lines = gpu_lines(snapshot, reserved or {}, workers or {}, policy)
    candidates = [g for g in lines if g.status == "candidate"]
    tried: list[tuple[tuple[int, int], dict[int, _Need]]] = []
    for shape in _shapes(request, policy, len(candidates)):
        try:
            found = _try_shape(request, shape, candidates, policy)
        except ServeOptionsError:
            if not request.auto_parallel:
                raise
            continue
        if found is None:
            tried.append((shape, _needs_for(request, shape, candidates, policy)))
            continue
        chosen, needs = found
        placement = _placement(request, chosen, needs, policy)
        return Decision(
            model=request.model.name,
            admitted=True,
            placement=placement,
            reasons=(),
            gpus=tuple(_mark(lines, chosen, needs)),
        )
    return _reject(request, snapshot, lines, tried, policy, suggest)


def _needs_for(
    request: PlacementRequest,
    shape: tuple[int, int],
    candidates: list[GpuLine],
    policy: PlacementPolicy,
) -> dict[int, _Need]:
    tp, pp = shape
    out: dict[int, _Need] = {}
    for g in candidates:
        if g.total_bytes not in out:
            out[g.total_bytes] = _need(
                request, tp, pp, g.total_bytes, g.name, policy.default_vllm_version
            )
    return out


def _mark(
    lines: list[GpuLine], chosen: Sequence[GpuLine], needs: Mapping[int, _Need]
) -> list[GpuLine]:
    picked = {g.index for g in chosen}
    out = []
    for g in lines:
        if g.status != "candidate":
            out.append(g)
            continue
        need = needs[g.total_bytes].max_bytes if g.total_bytes in needs else None
        fits = need is not None and g.usable_bytes >= need
        status = "chosen" if g.index in picked else ("fits" if fits else "too small")
        out.append(dataclasses.replace(g, status=status, need_bytes=need))
    return out


def _reject(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    lines: list[GpuLine],
    tried: list[tuple[tuple[int, int], dict[int, _Need]]],
    policy: PlacementPolicy,
    suggest: bool,
) -> Decision:
    from gatekeeper.placement_hints import rejection_reasons, suggestions

    last_needs = tried[-1][1] if tried else {}
    marked = _mark(lines, [], last_needs)
    reasons = rejection_reasons(request, snapshot, marked, tried)
    hints = suggestions(request, snapshot, lines, policy) if suggest else ()
    return Decision(
        model=request.model.name,
        admitted=False,
        placement=None,
        reasons=tuple(reasons),
        gpus=tuple(marked),
        suggestions=tuple(hints),
    )
