"""The search: which GPUs a request fits on, and the flags to launch it with.

Pure: a request, a node snapshot, the bytes already promised to workers still starting,
and a policy in; a ``SearchResult`` out (the GPU lines, and a ``Placement`` or the shapes
tried). ``decide`` turns it into a ``Decision``; ``hints`` probes variants with it.

    usable(GPU) = NVML free - outstanding reservations - policy.margin_for(total)
    need(rank)  = CUDA context (+ NCCL under TP) + weights + non-torch + activation peak
                  + CUDA graphs + the KV cache the request asks for
                  (default: vLLM's minimum, one sequence of max_model_len plus the null
                  block; with ``share_gpus``, up to ``shared_kv_sequences`` of them)

One GPU first (best fit: the least usable memory left over), then the smallest
tensor-parallel group (TP must divide the heads; GPUs of one product preferred) whose
every member fits the per-rank need, then pipeline parallelism when the policy allows
it. Ties go to GPUs hosting fewer workers.

Worked example: Llama-3.1-8B, bf16, max_model_len 8192, on an idle H100 (79.19 GiB,
margin 0.5 GiB + 2%): usable 77.1 GiB; need = 0.5 context + 14.99 weights + 0.25
non-torch + 1.88 activation + 0.88 graphs + 1.0 KV = 19.5 GiB -> GPU 0 with
``--gpu-memory-utilization 0.9555`` when alone, or ``--kv-cache-memory-bytes`` when the
GPU is shared (a fraction on releases before 0.10.2: ``gatekeeper.placement.budget``
derives the flags as the request's vLLM release takes them, and a whole-device release
shares no GPU).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.calibration import scale_estimate
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot
from gatekeeper.gpus.products import best_capability
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.budget import Need, placement_for, whole_device_status
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.sizing import sequences_held, sized_for
from gatekeeper.placement.types import GpuLine, Placement, PlacementRequest
from gatekeeper.units import format_gib
from gatekeeper.vllm.launch import release_budget

__all__ = [
    "PP_SIZES",
    "TP_SIZES",
    "EstimateCache",
    "SearchResult",
    "gpu_lines",
    "search",
    "shared_sequences",
]

TP_SIZES = (1, 2, 4, 8, 16)
"""Tensor-parallel sizes tried, smallest first (the larger ones only on nodes with that
many GPUs; the webhook suggests from the same list)."""
PP_SIZES = (2, 4)

Shape = tuple[int, int]
"""(tensor-parallel size, pipeline-parallel size)."""


class EstimateCache:
    """Estimates by (spec object, options, GPU, version), held by the caller (the
    sidecar's admission keeps one for its lifetime; a single decision needs none).

    The spec is kept with its estimate and compared by identity, so a recycled ``id``
    can never return another spec's estimate (hashing a spec whose checkpoint lists
    thousands of tensors on every decision would cost more than the estimate).
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._entries: dict[tuple[Any, ...], tuple[ModelSpec, ModelSpec | None, Estimate]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def estimate(
        self,
        spec: ModelSpec,
        options: ServeOptions,
        total: int,
        name: str,
        version: str,
        draft: ModelSpec | None = None,
    ) -> Estimate:
        key = (id(spec), id(draft), options, total, name, version)
        cached = self._entries.get(key)
        if cached is not None and cached[0] is spec and cached[1] is draft:
            return cached[2]
        if len(self._entries) >= self.limit:
            self._entries.clear()
        result = estimate(
            spec,
            options,
            GpuTarget(total_bytes=total, name=name, compute_capability=best_capability([name])),
            default_version=version,
            draft=draft,
        )
        self._entries[key] = (spec, draft, result)
        return result


@dataclass(frozen=True, slots=True)
class SearchResult:
    """What the search saw and found: every GPU's line, then either the placement (and
    the needs of its shape per GPU product) or the shapes tried with their needs."""

    lines: tuple[GpuLine, ...]
    placement: Placement | None = None
    chosen: tuple[GpuLine, ...] = ()
    needs: Mapping[int, Need] = field(default_factory=dict)
    tried: tuple[tuple[Shape, Mapping[int, Need]], ...] = ()


def gpu_lines(
    snapshot: InventorySnapshot,
    reserved: Mapping[str, int],
    workers: Mapping[str, int],
    policy: PlacementPolicy,
    release: str | None = None,
) -> list[GpuLine]:
    """Each GPU's usable memory and whether it is a candidate under ``policy`` for a
    worker of vLLM ``release`` (a whole-device release shares no GPU)."""
    alone = release is not None and release_budget(release).whole_device
    lines = []
    for gpu in snapshot.gpus:
        total = gpu.visible_total_bytes
        held = workers.get(gpu.uuid, 0)
        status = _status(gpu, held, policy)
        if alone and status == "candidate" and (held or reserved.get(gpu.uuid, 0)):
            status = whole_device_status(str(release))
        lines.append(
            GpuLine(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                total_bytes=total,
                free_bytes=gpu.free_bytes,
                reserved_bytes=reserved.get(gpu.uuid, 0),
                margin_bytes=policy.margin_for(total),
                workers=held,
                status=status,
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


def _shapes(request: PlacementRequest, policy: PlacementPolicy, gpu_count: int) -> list[Shape]:
    o = request.options
    if not request.auto_parallel:
        return [(o.tensor_parallel_size, o.pipeline_parallel_size)]
    shapes = [(tp, 1) for tp in TP_SIZES if tp <= gpu_count]
    if policy.allow_pipeline:
        shapes += [(tp, pp) for pp in PP_SIZES for tp in TP_SIZES if tp * pp <= gpu_count]
    return shapes


def _needs(
    request: PlacementRequest,
    shape: Shape,
    candidates: list[GpuLine],
    policy: PlacementPolicy,
    cache: EstimateCache,
    sequences: int,
) -> dict[int, Need]:
    """The need of ``shape`` on each GPU product (by total bytes) among ``candidates``,
    with a KV cache of ``sequences`` requests of max_model_len unless the request sets
    its own budget."""
    tp, pp = shape
    options = dataclasses.replace(
        request.options, tensor_parallel_size=tp, pipeline_parallel_size=pp
    )
    out: dict[int, Need] = {}
    for g in candidates:
        if g.total_bytes in out:
            continue
        e = cache.estimate(
            request.model,
            options,
            g.total_bytes,
            g.name,
            policy.default_vllm_version,
            request.draft,
        )
        if request.corrections:
            e = scale_estimate(e, request.corrections)
        out[g.total_bytes] = _need(request, e, g.total_bytes, sequences)
    return out


def _need(request: PlacementRequest, e: Estimate, total: int, sequences: int) -> Need:
    """The per-rank need on a GPU of ``total`` bytes. The KV cache is what the request
    asks for: its ``--kv-cache-memory-bytes`` exactly; what its
    ``--gpu-memory-utilization`` budget leaves after the rest (vLLM's own sizing); else
    enough for ``sequences`` requests of max_model_len (or ``min_kv_tokens``)."""
    o = request.options
    wanted = e.kv_bytes_for(sequences, request.min_kv_tokens)
    if o.kv_cache_memory_bytes is not None:
        kvs = [o.kv_cache_memory_bytes] * len(e.stages)
        what = f"--kv-cache-memory-bytes {o.kv_cache_memory_bytes}"
    elif o.gpu_memory_utilization is not None and e.extensible_kv_cache:
        # vLLM 0.34's extensible cache: u x total is a cap, and the margin it keeps free
        # when it sizes the cache after warm-up may bind first (the estimate's KV at u)
        kvs = [s.kv_cache_bytes for s in e.stages]
        what = f"--gpu-memory-utilization {o.gpu_memory_utilization}"
    elif o.gpu_memory_utilization is not None:
        budget = math.ceil(o.gpu_memory_utilization * total)
        kvs = [budget - e.rank_bytes(s, 0)[1] for s in e.stages]
        what = f"--gpu-memory-utilization {o.gpu_memory_utilization}"
    else:
        kvs = [wanted] * len(e.stages)
        what = ""
    pairs = [e.rank_bytes(s, max(kv, 0)) for s, kv in zip(e.stages, kvs, strict=True)]
    short = None
    if what and min(kvs) < wanted:
        short = (
            f"{what} leaves {format_gib(max(min(kvs), 0))} of KV cache on a "
            f"{format_gib(total)} GPU, less than the {format_gib(wanted)} of a KV cache "
            f"{sized_for(sequences_held(e, wanted), e.max_model_len)}; raise it or leave it to "
            "gatekeeper"
        )
    return Need(
        e,
        tuple(p[0] for p in pairs),
        max(min(kvs), 0),
        tuple(p[1] for p in pairs),
        short,
    )


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


_Fit = tuple[dict[int, Need], list[GpuLine] | None]


def _fit(
    request: PlacementRequest,
    shape: Shape,
    candidates: list[GpuLine],
    policy: PlacementPolicy,
    cache: EstimateCache,
) -> _Fit:
    """The needs of ``shape`` and the GPUs it fits on (None when none): with the KV
    cache ``shared_sequences`` asks for, else the most sequences that fit down to the
    request's ``min_sequences`` (binary search: more sequences never need less)."""
    gpus = shape[0] * shape[1] * request.options.data_parallel_size  # dp x tp x pp

    def attempt(sequences: int) -> _Fit:
        needs = _needs(request, shape, candidates, policy, cache, sequences)
        beyond = any(n.estimate.length_beyond_model for n in needs.values())
        beyond = beyond or all(n.short for n in needs.values())
        # a GPU product the request's own budget cannot work on takes no rank
        sizes = {t: (n.max_bytes if not n.short else 2**62) for t, n in needs.items()}
        return needs, None if beyond else _group(candidates, gpus, sizes)

    least = request.min_sequences
    best = attempt(least)
    if best[1] is None or not best[0]:
        return best
    lo, hi = least + 1, shared_sequences(request, policy, next(iter(best[0].values())).estimate)
    while lo <= hi:
        mid = (lo + hi) // 2
        found = attempt(mid)
        if found[1] is not None:
            best, lo = found, mid + 1
        else:
            hi = mid - 1
    return best


def shared_sequences(request: PlacementRequest, policy: PlacementPolicy, e: Estimate) -> int:
    """The sequences of max_model_len a worker's KV cache is sized for when it shares
    its GPUs (``share_gpus``) and the request sets no budget of its own (neither
    ``--kv-cache-memory-bytes`` nor ``--gpu-memory-utilization``):
    ``max(min_sequences, min(max_num_seqs, shared_kv_sequences))``. Otherwise the
    request's ``min_sequences`` (alone on its GPUs, a worker gets all their usable
    memory, as ``vllm serve`` would take ``--gpu-memory-utilization 0.9``)."""
    o = request.options
    if not policy.share_gpus or (o.kv_cache_memory_bytes or o.gpu_memory_utilization):
        return request.min_sequences
    return max(request.min_sequences, min(e.max_num_seqs, policy.shared_kv_sequences))


def search(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    *,
    reserved: Mapping[str, int] | None = None,
    workers: Mapping[str, int] | None = None,
    policy: PlacementPolicy | None = None,
    cache: EstimateCache | None = None,
) -> SearchResult:
    """The best-fitting placement of ``request`` on ``snapshot``, or the shapes tried.

    ``reserved`` maps GPU UUIDs to bytes promised to workers still starting; ``workers``
    maps GPU UUIDs to the number of gatekeeper workers they host. A shape the options
    cannot take (TP not dividing the heads) is skipped while searching, and raises
    ``ServeOptionsError`` when the request fixed it.
    """
    policy = policy or PlacementPolicy()
    cache = cache if cache is not None else EstimateCache()
    release = request.options.vllm_version or policy.default_vllm_version
    lines = gpu_lines(snapshot, reserved or {}, workers or {}, policy, release)
    candidates = [g for g in lines if g.status == "candidate"]
    tried: list[tuple[Shape, Mapping[int, Need]]] = []
    for shape in _shapes(request, policy, len(candidates)):
        try:
            needs, chosen = _fit(request, shape, candidates, policy, cache)
        except ServeOptionsError:
            if not request.auto_parallel:
                raise
            continue
        if chosen is None:
            tried.append((shape, needs))
            continue
        return SearchResult(
            lines=tuple(lines),
            placement=placement_for(request, chosen, needs, policy, release),
            chosen=tuple(chosen),
            needs=needs,
        )
    return SearchResult(lines=tuple(lines), tried=tuple(tried))
