"""The estimate: per-GPU memory of a vLLM worker, as vLLM itself will account it.

Pure: a ``ModelSpec``, ``ServeOptions`` and a ``GpuTarget`` in, an ``Estimate`` out.
Per pipeline stage (identical across its TP ranks)::

    budget   = ceil(u * T)                                    u = gpu_memory_utilization
    KV       = budget - weights - non_torch - activation_peak [- cuda_graphs  (v0.21+)]
             (or exactly --kv-cache-memory-bytes)
    blocks   = floor(KV / bytes_per_block), the minimum over stages
    fits    <=> KV > 0 and bytes_per_block * blocks_per_request(L) <= KV - bytes_per_block
    NVML     ~ CUDA context (+ NCCL under TP) + budget [+ cuda_graphs before v0.21]

Worked example: Llama-3.1-8B on an H100 (T = 79.19 GiB), vLLM 0.19, u = 0.95:
budget 75.23 GiB - 14.99 weights - 0.25 non-torch - 1.89 activation = 58.10 GiB of KV
(vLLM printed 58.11), 29,750 blocks of 2 MiB, 476,000 tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from gatekeeper.estimate.accounting import (
    DEFAULT_VLLM_VERSION,
    Accounting,
    accounting_by_name,
    accounting_for,
)
from gatekeeper.estimate.kv_cache import KvLayout, kv_layout
from gatekeeper.estimate.options import (
    ServeOptions,
    check_parallelism,
    resolve_dtype,
    resolve_kv_dtype,
)
from gatekeeper.estimate.overhead import (
    BatchShape,
    batch_defaults,
    cuda_graph_bytes,
    encoder_peak_bytes,
    forward_peak_bytes,
    non_torch_bytes,
    pre_init_bytes,
    sampler_peak_bytes,
)
from gatekeeper.estimate.weights import pp_partition, weight_plan
from gatekeeper.models.quantization import QuantSpec, quant_from_flag
from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec
from gatekeeper.units import format_gib

__all__ = ["Estimate", "GpuTarget", "StageEstimate", "estimate"]

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """The GPU a worker would run on: total bytes as vLLM sees them, and free bytes
    when known (a live snapshot)."""

    total_bytes: int
    free_bytes: int | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One pipeline stage's ranks (each TP rank of a stage holds the same)."""

    stage: int
    layers: int
    weights_bytes: int
    non_torch_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int
    num_blocks: int
    budget_bytes: int
    nvml_bytes: int
    """What NVML will show the worker process holding on this GPU once it is ready."""


@dataclass(frozen=True, slots=True)
class Estimate:
    model: str
    method: Literal["vllm", "simple"]
    vllm_version: str
    accounting: str
    gpu_total_bytes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    dtype: str
    kv_cache_dtype: str
    quantization: str | None
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    block_size: int
    enforce_eager: bool
    weights_source: str
    kv_bytes_per_token: int
    kv_block_bytes: int
    """Bytes of one KV block on the most loaded rank (all its layers)."""
    blocks_per_request: int
    """Blocks one request of max_model_len holds on that rank."""
    cuda_graphs_in_budget: bool
    """True from vLLM 0.21: graph memory is inside ``gpu_memory_utilization x total``."""
    stages: tuple[StageEstimate, ...]
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len_fit: int
    fits: bool
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())
    length_beyond_model: bool = False
    """max_model_len exceeds the model's derived maximum: vLLM refuses it whatever the
    memory (the one refusal no KV budget can fix)."""

    @property
    def worst(self) -> StageEstimate:
        """The most loaded rank: the stage with the fewest KV blocks."""
        return min(self.stages, key=lambda s: (s.num_blocks, s.kv_cache_bytes))

    def kv_bytes_for(self, sequences: int = 1, tokens: int | None = None) -> int:
        """KV bytes that hold ``sequences`` requests of max_model_len (or ``tokens``
        tokens, whichever is more) plus vLLM's null block: ``sequences=1`` is the least
        vLLM accepts."""
        if not self.kv_block_bytes:
            return 0
        blocks = self.blocks_per_request * sequences
        if tokens:
            per_token = self.blocks_per_request / self.max_model_len
            blocks = max(blocks, -(-int(per_token * tokens * 1000) // 1000))
        return self.kv_block_bytes * (blocks + 1)

    def rank_bytes(self, stage: StageEstimate, kv_bytes: int) -> tuple[int, int]:
        """(bytes the rank holds, bytes inside vLLM's budget) with ``kv_bytes`` of KV cache:
        the CUDA context (and NCCL under TP) sit outside the budget, and so do CUDA graphs
        before vLLM 0.21."""
        in_budget = stage.weights_bytes + stage.non_torch_bytes + stage.activation_peak_bytes
        in_budget += kv_bytes
        outside = pre_init_bytes(self.tensor_parallel_size)
        if self.cuda_graphs_in_budget:
            in_budget += stage.cuda_graph_bytes
        else:
            outside += stage.cuda_graph_bytes
        return outside + in_budget, in_budget

    def to_json(self) -> dict[str, Any]:
        w = self.worst
        return {
            "model": self.model,
            "method": self.method,
            "vllm_version": self.vllm_version,
            "accounting": self.accounting,
            "accounting_description": accounting_by_name(self.accounting).description,
            "weights_bytes": w.weights_bytes,
            "non_torch_bytes": w.non_torch_bytes,
            "activation_peak_bytes": w.activation_peak_bytes,
            "cuda_graph_bytes": w.cuda_graph_bytes,
            "kv_cache_bytes": w.kv_cache_bytes,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
            "fits": self.fits,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "max_model_len": self.max_model_len,
            "max_model_len_fit": self.max_model_len_fit,
            "budget_bytes": w.budget_bytes,
            "nvml_bytes": w.nvml_bytes,
            "gpu_total_bytes": self.gpu_total_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_block_bytes": self.kv_block_bytes,
            "blocks_per_request": self.blocks_per_request,
            "weights_source": self.weights_source,
            "options": {
                "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "dtype": self.dtype,
                "kv_cache_dtype": self.kv_cache_dtype,
                "quantization": self.quantization,
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "block_size": self.block_size,
                "enforce_eager": self.enforce_eager,
            },
            "stages": [{k: getattr(s, k) for k in StageEstimate.__slots__} for s in self.stages],
        }


@dataclass(frozen=True, slots=True)
class _Plan:
    """Resolved options shared by every stage."""

    acc: Accounting
    spec: ModelSpec
    opts: ServeOptions
    gpu: GpuTarget
    tp: int
    pp: int
    dtype: str
    quant: QuantSpec | None
    max_model_len: int
    utilization: float
    shape: BatchShape
    block_size: int

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def _resolve(spec: ModelSpec, opts: ServeOptions, gpu: GpuTarget, default_version: str) -> _Plan:
    acc = accounting_for(opts.vllm_version or default_version)
    tp, pp = opts.tensor_parallel_size, opts.pipeline_parallel_size
    check_parallelism(spec, tp, pp)
    dtype = resolve_dtype(opts.dtype, spec, v1=acc.engine == "v1")
    quant = (
        quant_from_flag(opts.quantization, spec.quantization)
        if opts.quantization
        else spec.quantization
    )
    length = opts.max_model_len or spec.max_position_embeddings
    shape = batch_defaults(
        acc,
        total_bytes=gpu.total_bytes,
        gpu_name=gpu.name,
        max_model_len=length,
        max_num_seqs=opts.max_num_seqs,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        llm_class=opts.embedded,
    )
    block = opts.block_size or (acc.mla_block_size if spec.mla else DEFAULT_BLOCK_SIZE)
    utilization = opts.gpu_memory_utilization or acc.default_utilization
    return _Plan(acc, spec, opts, gpu, tp, pp, dtype, quant, length, utilization, shape, block)


def _stage(p: _Plan, k: int, layers: range, weights: int, last: bool) -> StageEstimate:
    forward = forward_peak_bytes(
        p.spec, layers, p.shape.max_num_batched_tokens, p.tp, p.dtype_bytes
    )
    sampler = sampler_peak_bytes(p.acc, p.spec, p.shape.max_num_seqs, p.dtype_bytes) if last else 0
    encoder = encoder_peak_bytes(p.acc, p.spec, p.shape, p.dtype_bytes) if k == 0 else 0
    activation = max(forward, sampler, encoder)
    graphs = cuda_graph_bytes(p.acc, p.spec, layers, p.tp, p.shape, p.opts.enforce_eager)
    non_torch = non_torch_bytes(p.acc, p.tp, p.pp, embedded=p.opts.embedded)
    budget = math.ceil(p.utilization * p.gpu.total_bytes)
    in_budget = graphs if p.acc.cuda_graphs_in_budget else 0
    if p.opts.kv_cache_memory_bytes is not None:
        kv = p.opts.kv_cache_memory_bytes
        nvml = pre_init_bytes(p.tp) + weights + non_torch + activation + kv + graphs
    else:
        kv = budget - weights - non_torch - activation - in_budget
        nvml = pre_init_bytes(p.tp) + budget + graphs - in_budget
    layout = _layout(p, layers)
    return StageEstimate(
        stage=k,
        layers=len(layers),
        weights_bytes=weights,
        non_torch_bytes=non_torch,
        activation_peak_bytes=activation,
        cuda_graph_bytes=graphs,
        kv_cache_bytes=kv,
        num_blocks=layout.num_blocks(kv),
        budget_bytes=budget,
        nvml_bytes=nvml,
    )


def _layout(p: _Plan, layers: range) -> KvLayout:
    kv = resolve_kv_dtype(p.opts.kv_cache_dtype, p.dtype, p.spec)
    return kv_layout(
        p.spec,
        layers,
        tp=p.tp,
        kv=kv,
        block_size=p.block_size,
        hybrid=p.acc.hybrid_kv,
        mla_align=p.acc.mla_align,
    )


def _in_flight(p: _Plan) -> int:
    """Tokens a sliding-window request may hold beyond its window (scheduled batches)."""
    return p.shape.max_num_batched_tokens * p.pp


def _capacity(p: _Plan, layout: KvLayout, blocks: int, kv: int) -> tuple[int, float, int, bool]:
    """(kv tokens, max concurrency, largest max_model_len that fits, whether L fits)."""
    length = p.max_model_len
    limit = p.spec.max_position_embeddings if p.opts.max_model_len is None else max(length, 1)
    if not layout.groups:
        return 0, 0.0, limit, True
    if p.acc.engine == "v0":
        tokens = blocks * p.block_size
        return tokens, tokens / length, min(tokens, limit), length <= tokens
    in_flight = _in_flight(p)
    per_request = layout.blocks_per_request(length, in_flight)
    concurrency = blocks / per_request
    fit_len = layout.max_length(kv, max(limit, length), in_flight) if kv > 0 else 0
    return int(concurrency * length), concurrency, fit_len, layout.fits(kv, length, in_flight)


def estimate(
    spec: ModelSpec,
    options: ServeOptions,
    gpu: GpuTarget,
    *,
    default_version: str = DEFAULT_VLLM_VERSION,
) -> Estimate:
    """Estimate one worker's per-GPU memory under vLLM's accounting."""
    p = _resolve(spec, options, gpu, default_version)
    plan = weight_plan(spec, tp=p.tp, pp=p.pp, dtype_bytes=p.dtype_bytes, quant=p.quant)
    parts = pp_partition(spec.num_layers, p.pp)
    stages = tuple(
        _stage(p, k, layers, plan.stage_bytes[k], last=k == p.pp - 1)
        for k, layers in enumerate(parts)
    )
    worst = min(stages, key=lambda s: (s.num_blocks, s.kv_cache_bytes))
    layout = _layout(p, parts[worst.stage])
    tokens, concurrency, fit_len, length_fits = _capacity(
        p, layout, worst.num_blocks, worst.kv_cache_bytes
    )
    reasons, warnings = _verdict(p, worst, layout, length_fits, tokens)
    return Estimate(
        model=spec.name,
        method="vllm",
        vllm_version=options.vllm_version or default_version,
        accounting=p.acc.name,
        gpu_total_bytes=gpu.total_bytes,
        tensor_parallel_size=p.tp,
        pipeline_parallel_size=p.pp,
        dtype=p.dtype,
        kv_cache_dtype=options.kv_cache_dtype,
        quantization=p.quant.label if p.quant else None,
        max_model_len=p.max_model_len,
        max_num_seqs=p.shape.max_num_seqs,
        max_num_batched_tokens=p.shape.max_num_batched_tokens,
        gpu_memory_utilization=p.utilization,
        block_size=p.block_size,
        enforce_eager=options.enforce_eager,
        weights_source=plan.source,
        kv_bytes_per_token=layout.bytes_per_token_all_layers,
        cuda_graphs_in_budget=p.acc.cuda_graphs_in_budget,
        kv_block_bytes=layout.bytes_per_block if layout.groups else 0,
        blocks_per_request=layout.blocks_per_request(p.max_model_len, _in_flight(p))
        if layout.groups
        else 0,
        stages=stages,
        kv_cache_tokens=max(0, tokens),
        max_concurrency=max(0.0, concurrency),
        max_model_len_fit=max(0, fit_len),
        fits=not reasons,
        length_beyond_model=_length_beyond_model(p),
        reasons=tuple(reasons),
        warnings=tuple(warnings),
    )


def _length_beyond_model(p: _Plan) -> bool:
    return bool(p.opts.max_model_len) and p.max_model_len > p.spec.max_position_embeddings


def _verdict(
    p: _Plan, worst: StageEstimate, layout: KvLayout, length_fits: bool, tokens: int
) -> tuple[list[str], list[str]]:
    """vLLM's start-up checks, in the order vLLM runs them, as human reasons."""
    reasons: list[str] = []
    warnings: list[str] = []
    total, budget = p.gpu.total_bytes, worst.budget_bytes
    free = p.gpu.free_bytes
    if _length_beyond_model(p):
        reasons.append(
            f"max_model_len {p.max_model_len} is greater than the model's derived maximum "
            f"{p.spec.max_position_embeddings}; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    if free is not None and free < budget:
        reasons.append(
            f"free memory on the GPU ({format_gib(free)}) is less than the desired "
            f"gpu_memory_utilization ({p.utilization}, {format_gib(budget)}); lower "
            "gpu_memory_utilization or free the GPU"
        )
    room = (free if free is not None else total) - pre_init_bytes(p.tp)
    if worst.weights_bytes > room:
        reasons.append(
            f"weights need {format_gib(worst.weights_bytes)} per GPU but only {format_gib(room)} "
            "can be allocated: loading would run out of memory; raise tensor_parallel_size or quantize"
        )
    elif worst.kv_cache_bytes <= 0:
        reasons.append(
            f"no memory left for the KV cache: budget {format_gib(budget)} minus weights "
            f"{format_gib(worst.weights_bytes)}, activation {format_gib(worst.activation_peak_bytes)}, "
            f"non-torch {format_gib(worst.non_torch_bytes)} leaves {format_gib(worst.kv_cache_bytes)}"
        )
    elif not length_fits and layout.groups:
        needed = layout.bytes_per_block * layout.blocks_per_request(
            p.max_model_len, p.shape.max_num_batched_tokens * p.pp
        )
        reasons.append(
            f"max_model_len {p.max_model_len} needs {format_gib(needed)} of KV cache for one request "
            f"but only {format_gib(worst.kv_cache_bytes)} is available ({tokens} tokens)"
        )
    if worst.nvml_bytes > total:
        warnings.append(
            f"the worker would hold {format_gib(worst.nvml_bytes)} on a {format_gib(total)} GPU "
            "(CUDA context and graphs sit outside the budget): lower gpu_memory_utilization"
        )
    if free is None and budget + pre_init_bytes(p.tp) > total:
        warnings.append(
            f"budget {format_gib(budget)} plus the CUDA context exceeds the GPU's {format_gib(total)}: "
            "vLLM's free-memory check will fail unless the context is small"
        )
    return reasons, warnings
