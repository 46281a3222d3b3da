"""The estimate: per-GPU memory of a vLLM worker, as vLLM itself will account it.

Pure: a ``ModelSpec``, ``ServeOptions`` and a ``GpuTarget`` in, an ``Estimate`` out.
Per pipeline stage (identical across its TP ranks)::

    budget   = ceil(u * T)                                    u = gpu_memory_utilization
    KV       = budget - weights - non_torch - activation_peak [- cuda_graphs  (v0.21+)]
             (or exactly --kv-cache-memory-bytes)
             v0.34's extensible KV cache (``extensible_kv``), u = 1.0 by default, sized
             after warm-up: the same with budget = min(ceil(u * T), free - pre_init - margin),
             margin = max(1 GiB, 0.75 x activation_peak)
    blocks   = floor(KV / bytes_per_block), the minimum over stages
    fits    <=> KV > 0 and bytes_per_block * blocks_per_request(L) <= KV - bytes_per_block
    NVML     ~ CUDA context (+ NCCL under TP) + budget [+ cuda_graphs before v0.21]
             (v0.34 extensible: the margin stays free; the activation peak, kept free when
             the cache is sized, is held again once serving reaches it)

Worked example: Llama-3.1-8B on an H100 (T = 79.19 GiB), vLLM 0.19, u = 0.95:
budget 75.23 GiB - 14.99 weights - 0.25 non-torch - 1.89 activation = 58.10 GiB of KV
(vLLM printed 58.11), 29,750 blocks of 2 MiB, 476,000 tokens.

The result types (``GpuTarget``, ``StageEstimate``, ``Estimate``) live in ``types``;
they are re-exported here, where callers import them.
"""

from __future__ import annotations

import math
from functools import cache

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION, parse_vllm_version
from gatekeeper.estimator.drafter import DraftContext, DraftCost, draft_cost
from gatekeeper.estimator.extensible_kv import kv_cache_available, kv_cache_margin
from gatekeeper.estimator.host import host_estimate
from gatekeeper.estimator.kv_cache import KvLayout, KvOptions, StatePages, kv_layout
from gatekeeper.estimator.lora import lora_bytes
from gatekeeper.estimator.moe_backend import experts_backend_label
from gatekeeper.estimator.options import ServeOptions, resolve_kv_dtype
from gatekeeper.estimator.overhead import (
    cuda_graph_bytes,
    encoder_peak_bytes,
    forward_peak_bytes,
    non_torch_bytes,
    pre_init_bytes,
    sampler_peak_bytes,
)
from gatekeeper.estimator.plan import Plan, resolve_plan
from gatekeeper.estimator.releases import release_warning
from gatekeeper.estimator.state import state_bytes
from gatekeeper.estimator.types import Estimate as Estimate
from gatekeeper.estimator.types import GpuTarget as GpuTarget
from gatekeeper.estimator.types import StageEstimate as StageEstimate
from gatekeeper.estimator.weight_groups import WeightGroups, weight_groups
from gatekeeper.estimator.weights import pp_partition, weight_plan
from gatekeeper.models.module_names import unknown_architecture_warning
from gatekeeper.models.spec import ModelSpec
from gatekeeper.units import format_gib

__all__ = ["estimate"]


def _draft(p: Plan, draft: ModelSpec | None) -> DraftCost:
    sp = p.features.speculative
    if sp is None:
        return DraftCost(0, 0, 0, 0)
    if sp.needs_draft and draft is None:
        raise ServeOptionsError(
            f"speculative_config: the draft model {sp.model!r} must be resolved to size it "
            "(estimate(..., draft=spec)); give a model gatekeeper can read",
            field="speculative_config",
            value=p.opts.speculative_config,
        )
    kv = resolve_kv_dtype(p.opts.kv_cache_dtype, p.dtype, p.spec)
    ctx = DraftContext(
        acc=p.acc,
        spec=p.spec,
        tp=p.tp,
        dtype_bytes=p.dtype_bytes,
        quant=p.quant,
        kv=kv,
        shape=p.shape,
        eager=not p.features.graphs,
        cap=p.features.cap,
    )
    return draft_cost(sp, ctx, draft)


def _lora_activation(p: Plan) -> int:
    """Punica's shrink buffer: ``3 slices x tokens x rank`` in fp32 in the widest layer."""
    lora = p.features.lora
    return 3 * p.shape.max_num_batched_tokens * lora.rank * 4 if lora else 0


def _draft_format(p: Plan, draft: ModelSpec | None) -> str:
    """The drafter's format: its quantization's method (an MTP head the target's), else
    the model dtype."""
    sp = p.features.speculative
    quant = p.quant if sp is not None and sp.method == "mtp" else None
    quant = draft.quantization if draft is not None else quant
    return quant.method if quant is not None else p.dtype


def _stage(
    p: Plan,
    k: int,
    layers: range,
    share: tuple[int, int, WeightGroups],
    draft: tuple[DraftCost, str],
) -> StageEstimate:
    """Stage ``k``'s rank; ``share``: (bytes, offloaded bytes, bytes by group) from the
    weight plan; ``draft``: the drafter's cost and format."""
    weights_bytes, offloaded, groups = share
    drafter, draft_format = draft
    f = p.features
    last = k == p.pp - 1
    forward = forward_peak_bytes(
        p.spec, layers, p.shape.max_num_batched_tokens, p.tp, p.dtype_bytes
    )
    if last:
        forward = max(forward, drafter.forward_peak_bytes)
    forward += _lora_activation(p)
    sampling = last and not f.pooling
    sampler = (
        sampler_peak_bytes(p.acc, p.spec, p.shape.max_num_seqs, p.dtype_bytes) if sampling else 0
    )
    encoder = (
        encoder_peak_bytes(p.acc, p.spec, p.shape, p.dtype_bytes, items_per_prompt=f.mm_items)
        if k == 0
        else 0
    )
    activation = max(forward, sampler, encoder)
    graphs = cuda_graph_bytes(p.acc, p.spec, layers, p.tp, p.shape, not f.graphs, cap=f.cap or None)
    lora = (
        lora_bytes(
            p.spec,
            layers,
            f.lora,
            tp=p.tp,
            ep=f.ep,
            model_dtype=p.dtype,
            first=k == 0,
            last=last,
        )
        if f.lora
        else 0
    )
    draft_weights = drafter.weights_bytes if last else 0
    if last:
        graphs += drafter.cuda_graph_bytes
    weights = weights_bytes + lora + draft_weights
    groups = groups.plus("lora", p.dtype, lora).plus("drafter", draft_format, draft_weights)
    non_torch = non_torch_bytes(p.acc, p.tp, p.pp, embedded=p.opts.embedded)
    budget = math.ceil(p.utilization * p.gpu.total_bytes)
    in_budget = graphs if p.acc.cuda_graphs_in_budget else 0
    layout = _layout(p, layers, drafter)
    fixed = weights + non_torch + activation
    pre_init = pre_init_bytes(p.tp, p.acc, embedded=p.opts.embedded)
    margin = kv_cache_margin(activation) if p.extensible else 0
    if p.extensible:
        kv, budget = _measured_kv(p, weights + non_torch + graphs, activation, budget, pre_init)
    elif p.opts.kv_cache_memory_bytes is not None:
        kv = p.opts.kv_cache_memory_bytes
    else:
        kv = budget - fixed - in_budget
    if p.opts.num_gpu_blocks_override is not None and layout.groups:
        kv = p.opts.num_gpu_blocks_override * layout.bytes_per_block  # allocated, whatever fits
    if p.opts.kv_cache_memory_bytes is None and p.opts.num_gpu_blocks_override is None:
        # 0.34's extensible cache: once serving has regrown the transient peak kept free
        nvml = pre_init + budget + graphs - in_budget
    else:
        nvml = pre_init + fixed + kv + graphs
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
        lora_bytes=lora,
        draft_weights_bytes=draft_weights,
        cpu_offloaded_bytes=offloaded,
        weights_by_group=groups,
        kv_margin_bytes=margin,
    )


def _measured_kv(
    p: Plan, non_kv_used: int, activation: int, requested: int, pre_init: int
) -> tuple[int, int]:
    """vLLM 0.34's extensible KV cache, sized after warm-up and CUDA-graph capture
    (``extensible_kv``): (KV bytes, the budget they are what is left of).

    ``measure_kv_cache_bytes`` over the memory the rank would measure: the GPU's free
    memory at start (its total when unknown) less what the worker holds before vLLM's
    snapshot is ``init_free``; weights, non-torch and the captured graphs are used; the
    transient peak is the profile's activation peak (gpu_worker.py:946-948);
    ``requested``, ``ceil(u x total)`` with u 1.0 unless given (config/cache.py:494-501),
    caps it. The budget is then ``min(requested, init_free - margin)``: the KV cache is it
    less the used memory and the activation peak, as in the older spans."""
    init_free = (p.gpu.free_bytes if p.gpu.free_bytes is not None else p.gpu.total_bytes) - pre_init
    kv = kv_cache_available(
        init_free_memory=init_free,
        free_memory=init_free - non_kv_used,
        committed_bytes=0,  # the committed prefix cancels: used less it, headroom plus it
        requested_memory=requested,
        transient_peak_bytes=activation,
    )
    return kv, min(requested, init_free - kv_cache_margin(activation))


def _layout(p: Plan, layers: range, drafter: DraftCost | None = None) -> KvLayout:
    kv = resolve_kv_dtype(p.opts.kv_cache_dtype, p.dtype, p.spec)
    last = bool(layers) and layers[-1] == p.spec.num_layers - 1
    extra = drafter.kv_bytes_per_token if drafter is not None and last else 0
    options = KvOptions(
        tp=p.tp,
        kv=kv,
        block_size=p.block_size,
        hybrid=p.acc.hybrid_kv,
        mla_align=p.acc.mla_align,
        extra_bytes_per_token=extra,
        dcp=p.features.dcp,
        state=_state_pages(p),
        chunked_hybrid=_since(p, CHUNKED_HYBRID_SINCE),
        # what each request's cross-attention reserves: max_num_encoder_input_tokens
        encoder_tokens=p.shape.max_num_batched_tokens if p.spec.encoder is not None else 0,
    )
    return kv_layout(p.spec, layers, options)


CHUNKED_HYBRID_SINCE = (0, 32, 0)
"""vLLM keeps the hybrid allocator on for chunked-local attention: 0.32's
``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` defaults to 1 (read from the
0.32.0 CPU wheel's ``envs.py``); earlier releases are kept as modelled before, with the
allocator off for chunked layers (shared/reference/vllm-memory.md). The conformance test
(tests/estimator/test_conformance.py) measures it on a tiny Llama 4."""
MAMBA2_CHECKPOINT_SINCE = (0, 32, 0)
"""Mamba-2 mixers declare ``num_prefill_checkpoint_blocks=1`` (0.32.0's
``mamba_mixer2.py::get_kv_cache_spec``): in align mode a request holds
``2 + 1 + draft tokens`` state blocks per group. Measured by the conformance test on
Granite 4.0-H and Falcon-H1 shapes."""


def _since(p: Plan, release: tuple[int, int, int]) -> bool:
    version, _ = parse_vllm_version(p.version)
    return version >= release


def _state_pages(p: Plan) -> StatePages | None:
    """The recurrent state of hybrid and attention-free models, in vLLM's KV pool."""
    s = p.spec.state
    if s is None:
        return None
    sp = p.features.speculative
    k = sp.tokens(p.spec) if sp else 0  # every method's draft tokens widen the state
    per_sequence = state_bytes(
        s,
        p.tp,
        p.dtype,
        cache_dtype=p.opts.mamba_cache_dtype,
        ssm_cache_dtype=p.opts.mamba_ssm_cache_dtype,
        speculative_tokens=k,
    )
    attends = any(kind != "none" for kind in p.spec.layer_attention)
    caching = p.opts.enable_prefix_caching
    align = attends if caching is None else caching  # vLLM: on for hybrid, off attention-free
    checkpoint = int(align and s.kind == "mamba2" and _since(p, MAMBA2_CHECKPOINT_SINCE))
    return StatePages(per_sequence, (2 if align else 1) + checkpoint + k, p.max_model_len)


def _in_flight(p: Plan) -> int:
    """Tokens a sliding-window request may hold beyond its window (scheduled batches)."""
    return p.shape.max_num_batched_tokens * p.pp


def _capacity(p: Plan, layout: KvLayout, blocks: int, kv: int) -> tuple[int, float, int, bool]:
    """(kv tokens, max concurrency, largest max_model_len that fits, whether L fits)."""
    length = p.max_model_len
    # never beyond the model's derived maximum: vLLM refuses a longer max_model_len
    limit = max(length, 1)
    if p.spec.max_position_declared:
        limit = min(limit, p.spec.max_position_embeddings)
    if not layout.groups:
        return 0, 0.0, limit, True
    if p.acc.engine == "v0":
        tokens = blocks * p.block_size
        return tokens, tokens / length, min(tokens, limit), length <= tokens
    in_flight = _in_flight(p)
    per_request = layout.blocks_per_request(length, in_flight)
    concurrency = blocks / per_request
    fit_len = layout.max_length(kv, limit, in_flight) if kv > 0 else 0
    return int(concurrency * length), concurrency, fit_len, layout.fits(kv, length, in_flight)


def estimate(
    spec: ModelSpec,
    options: ServeOptions,
    gpu: GpuTarget,
    *,
    default_version: str = DEFAULT_VLLM_VERSION,
    draft: ModelSpec | None = None,
) -> Estimate:
    """Estimate one worker's per-GPU memory under vLLM's accounting.

    ``draft`` is the speculative draft model's spec when ``--speculative-config`` names
    one (``Speculative.needs_draft``); the caller resolves it, as it resolved ``spec``."""
    p = resolve_plan(spec, options, gpu, default_version)
    drafter = _draft(p, draft)
    plan = weight_plan(
        spec,
        tp=p.tp,
        pp=p.pp,
        dtype_bytes=p.dtype_bytes,
        quant=p.quant,
        options=p.features.weights,
    )
    offloaded = plan.offloaded_bytes or (0,) * p.pp
    every_stage = cache(
        lambda: weight_groups(spec, plan, p.dtype, tp=p.tp, quant=p.quant, opts=p.features.weights)
    )
    groups = tuple(
        WeightGroups.later(lambda k=k: every_stage()[k])  # type: ignore[misc]
        for k in range(p.pp)
    )
    parts = pp_partition(spec.num_layers, p.pp)
    draft_format = _draft_format(p, draft)
    stages = tuple(
        _stage(
            p, k, layers, (plan.stage_bytes[k], offloaded[k], groups[k]), (drafter, draft_format)
        )
        for k, layers in enumerate(parts)
    )
    worst = min(stages, key=lambda s: (s.num_blocks, s.kv_cache_bytes))
    layout = _layout(p, parts[worst.stage], drafter)
    tokens, concurrency, fit_len, length_fits = _capacity(
        p, layout, worst.num_blocks, worst.kv_cache_bytes
    )
    reasons, warnings = _verdict(p, worst, layout, length_fits, tokens)
    unregistered = unknown_architecture_warning(spec.architecture)
    past_newest = release_warning(options.vllm_version or default_version)
    warnings += [w for w in (past_newest, unregistered) if w]
    sp = p.features.speculative
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
        block_size=layout.block_size,
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
        experts_backend=experts_backend_label(p.spec, p.quant, p.gpu.compute_capability),
        data_parallel_size=options.data_parallel_size,
        expert_parallel_size=p.features.ep,
        decode_context_parallel_size=p.features.dcp,
        speculative_method=sp.method if sp else None,
        cuda_graph_capture_size=p.features.cap,
        state_bytes_per_sequence=layout.state_bytes_per_sequence,
        extensible_kv_cache=p.extensible,
        host=host_estimate(
            ranks=p.tp * p.pp,
            replicas=options.data_parallel_size,
            weights_bytes=sum(s.weights_bytes for s in stages) * p.tp,
            cpu_offloaded_bytes=sum(s.cpu_offloaded_bytes for s in stages) * p.tp,
            kv_offloading_gib=options.kv_offloading_size,
            swap_space_gib=options.swap_space,
            engine=p.acc.engine,
        ),
    )


def _length_beyond_model(p: Plan) -> bool:
    if not p.spec.max_position_declared:
        return False  # vLLM takes --max-model-len as given when the config names no length
    return bool(p.opts.max_model_len) and p.max_model_len > p.spec.max_position_embeddings


def _removed_method(p: Plan) -> str | None:
    """A quantization method the release no longer loads (bitsandbytes and GGUF: in the
    0.21 wheels, gone from 0.32's, after RFC vllm-project/vllm#39583)."""
    q = p.quant
    if q is None or not q.removed_in:
        return None
    version, _ = parse_vllm_version(p.version)
    gone, _ = parse_vllm_version(q.removed_in)
    if version < gone:
        return None
    return (
        f"quantization: vLLM {'.'.join(map(str, version))} no longer loads {q.method} "
        f"checkpoints (gone by {q.removed_in}); serve it with an older vLLM (--vllm-version "
        "0.21.0 sizes it) or use an AWQ, GPTQ or FP8 checkpoint"
    )


def _verdict(
    p: Plan, worst: StageEstimate, layout: KvLayout, length_fits: bool, tokens: int
) -> tuple[list[str], list[str]]:
    """vLLM's start-up checks, in the order vLLM runs them, as human reasons."""
    reasons: list[str] = []
    warnings: list[str] = []
    total, budget = p.gpu.total_bytes, worst.budget_bytes
    free = p.gpu.free_bytes
    removed = _removed_method(p)
    if removed:
        reasons.append(removed)
    if _length_beyond_model(p):
        reasons.append(
            f"max_model_len {p.max_model_len} is greater than the model's derived maximum "
            f"{p.spec.max_position_embeddings}; vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    if free is not None and free < budget and not p.extensible:  # utils.py:783-786 (0.34)
        reasons.append(
            f"free memory on the GPU ({format_gib(free)}) is less than the desired "
            f"gpu_memory_utilization ({p.utilization}, {format_gib(budget)}); lower "
            "gpu_memory_utilization or free the GPU"
        )
    pre_init = pre_init_bytes(p.tp, p.acc, embedded=p.opts.embedded)
    room = (free if free is not None else total) - pre_init
    if worst.weights_bytes > room:
        reasons.append(
            f"weights need {format_gib(worst.weights_bytes)} per GPU but only {format_gib(room)} "
            "can be allocated: loading would run out of memory; raise tensor_parallel_size or quantize"
        )
    elif worst.kv_cache_bytes <= 0 and p.extensible:
        reasons.append(
            f"no memory left for the KV cache after warm-up and CUDA-graph capture: weights "
            f"{format_gib(worst.weights_bytes)}, non-torch {format_gib(worst.non_torch_bytes)}, "
            f"CUDA graphs {format_gib(worst.cuda_graph_bytes)}, the transient peak "
            f"{format_gib(worst.activation_peak_bytes)} and the margin "
            f"{format_gib(worst.kv_margin_bytes)} kept free take it all (vLLM 0.34's "
            "extensible KV cache)"
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
        # 0.34's extensible cache: checked once the cache is sized after warm-up
        # (kv_cache_planning.py:1827-1860, shrink_kv_cache_configs)
        when = " after warm-up and CUDA-graph capture" if p.extensible else ""
        reasons.append(
            f"max_model_len {p.max_model_len} needs {format_gib(needed)} of KV cache for one request "
            f"but only {format_gib(worst.kv_cache_bytes)} is available{when} ({tokens} tokens)"
        )
    if worst.nvml_bytes > total:
        warnings.append(
            f"the worker would hold {format_gib(worst.nvml_bytes)} on a {format_gib(total)} GPU "
            "(CUDA context and graphs sit outside the budget): lower gpu_memory_utilization"
        )
    if free is None and budget + pre_init > total and not p.extensible:
        warnings.append(
            f"budget {format_gib(budget)} plus the CUDA context exceeds the GPU's {format_gib(total)}: "
            "vLLM's free-memory check will fail unless the context is small"
        )
    return reasons, warnings
