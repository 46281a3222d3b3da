"""Weight bytes per GPU rank, sharded the way vLLM shards them.

Per rank: ``W = column/row-parallel linear shards + vocab shard of the embedding
(+ lm_head when untied) + replicated small parameters + buffers``.

- QKV: ``(q_heads/tp + 2*max(1, kv_heads/tp)) * head_dim`` output rows per rank, so KV
  heads replicate (and cost extra) when ``kv_heads < tp``.
- Embedding and lm_head: ``round_up(vocab, 64) / tp`` rows. Tied embeddings share one
  tensor. PP: the embedding lives on the first stage, lm_head on the last.
- MoE: every rank holds all experts with the intermediate split by TP; the router is
  replicated.
- MLA: ``q_a_proj`` and ``kv_a_proj_with_mqa`` are replicated; when ``kv_b_proj`` is
  quantized vLLM also keeps dequantized ``W_UK_T``/``W_UV`` copies of it in the model
  dtype (unquantized, they are views of it).
- Buffers: the rotary cos/sin cache, ``positions x rotary_dim`` in the model dtype
  (Llama 3.1: 131072 x 128 x 2 B = 32 MiB, which is why vLLM reports 14.99 GiB for
  8.03e9 parameters = 14.96 GiB).

Worked example: Llama-3.1-8B, bf16, TP=1: 8,030,261,248 params x 2 B + 32 MiB =
16,093,642,752 B = 14.99 GiB; TP=2: 7.51 GiB per rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gatekeeper.estimator.state import mixer_weight_bytes
from gatekeeper.models.module_names import ModuleNames, module_names
from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import CheckpointWeights, ModelSpec
from gatekeeper.units import cdiv, round_up

__all__ = [
    "VOCAB_PADDING",
    "WeightOptions",
    "WeightPlan",
    "layer_bytes",
    "lm_head_bytes",
    "parameter_count",
    "pp_partition",
    "weight_plan",
]

VOCAB_PADDING = 64


@dataclass(frozen=True, slots=True)
class WeightOptions:
    """Serving flags that change which weights a rank holds.

    - ``ep_size``: expert parallelism (``--enable-expert-parallel``) over ``dp x tp``
      ranks: each rank holds ``experts / ep_size`` whole experts instead of every
      expert's ``intermediate / tp`` slice;
    - ``lm_head``: False for pooling runners, which load no LM head;
    - ``vision``: False when ``--limit-mm-per-prompt`` allows no item of any modality
      (vLLM then builds no encoder); ``vision_replicated`` for
      ``--mm-encoder-tp-mode data`` (the encoder whole on every rank);
    - ``cpu_offload_bytes``: ``--cpu-offload-gb`` x 2^30: vLLM's UVA offloader moves
      decoder-layer parameters, first layers first, to host memory until that many
      bytes are off the GPU (``model_executor/offloader/uva.py``).
    """

    ep_size: int = 1
    lm_head: bool = True
    vision: bool = True
    vision_replicated: bool = False
    cpu_offload_bytes: int = 0


@dataclass(frozen=True, slots=True)
class WeightPlan:
    """Weight bytes per pipeline stage (identical across the TP ranks of a stage)."""

    stage_bytes: tuple[int, ...]
    source: str
    offloaded_bytes: tuple[int, ...] = ()
    """Bytes of each stage's decoder layers held in host memory (``--cpu-offload-gb``),
    already taken out of ``stage_bytes``."""

    @property
    def max_bytes(self) -> int:
        return max(self.stage_bytes)


def pp_partition(num_layers: int, pp: int) -> list[range]:
    """vLLM's ``get_pp_indices``: an even split, the remainder added to the stages
    from the second-to-last backwards."""
    sizes = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        sizes[(pp - 2 - i) % pp] += 1
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def _names(spec: ModelSpec) -> ModuleNames:
    return module_names(spec.architecture, q_lora_rank=spec.mla.q_lora_rank if spec.mla else None)


@dataclass(frozen=True, slots=True)
class _Ctx:
    """One rank's sizing context. Modules are named as vLLM's model class names them
    (``model.layers.0.self_attn.qkv_proj``, ``...mlp.gate_up_proj``, ``...mlp.experts``),
    which is how vLLM asks the quantization config (``get_quant_method(layer, prefix)``)."""

    spec: ModelSpec
    tp: int
    dtype_bytes: int
    quant: QuantSpec | None
    names: ModuleNames
    opts: WeightOptions = WeightOptions()

    @classmethod
    def of(
        cls,
        spec: ModelSpec,
        tp: int,
        dtype_bytes: int,
        quant: QuantSpec | None,
        opts: WeightOptions | None = None,
    ) -> _Ctx:
        names = _names(spec)
        quant = quant.for_model(names) if quant is not None else None
        return cls(spec, tp, dtype_bytes, quant, names, opts or WeightOptions())

    def module(self, i: int, name: str) -> str:
        return f"{self.names.layer(i)}.{name}"

    def linear(self, name: str, in_f: int, out_f: int, *, quantizable: bool = True) -> int:
        return self.fused(name, in_f, (out_f,), quantizable=quantizable)

    def fused(
        self, name: str, in_f: int, outs: tuple[int, ...], *, quantizable: bool = True
    ) -> int:
        """A linear whose output is the concatenation of ``outs`` (the shards of vLLM's
        ``QKVParallelLinear``/``MergedColumnParallelLinear``): one scheme for every shard,
        per-shard scales per shard, per-module tensors once."""
        scheme = self.quant.scheme_for(name) if self.quant is not None and quantizable else None
        if scheme is None:
            return in_f * sum(outs) * self.dtype_bytes
        return scheme.module_bytes(in_f, outs, self.dtype_bytes)

    def vec(self, numel: int) -> int:
        return numel * self.dtype_bytes


def _attention_bytes(c: _Ctx, i: int) -> int:
    s, tp, p = c.spec, c.tp, c.module(i, c.names.attention)
    h = s.hidden_size
    if s.mla is not None:
        return _mla_bytes(c, i)
    q_rank = cdiv(s.num_attention_heads, tp) * s.head_dim
    kv_heads = max(1, s.num_kv_heads // tp)
    k_rank = kv_heads * s.head_dim
    v_rank = kv_heads * s.value_head_dim
    o_in = cdiv(s.num_attention_heads, tp) * s.value_head_dim
    if s.attention_output_gate:
        q_rank *= 2  # the gate's rows ride in q_proj (qwen3_next.py: heads x (1 + gate))
    qkv = c.fused(f"{p}.qkv_proj", h, (q_rank, k_rank, v_rank))  # QKVParallelLinear
    total = qkv + c.linear(f"{p}.o_proj", o_in, h)
    if s.attention_bias:
        total += c.vec(q_rank + k_rank + v_rank)
    if s.output_bias:
        total += c.vec(h)
    if s.qk_norm:
        total += c.vec(2 * s.head_dim)
    if s.attention_sinks:
        total += cdiv(s.num_attention_heads, tp) * 4
    return total


def _mla_bytes(c: _Ctx, i: int) -> int:
    s, tp, p = c.spec, c.tp, c.module(i, c.names.attention)
    m = s.mla
    assert m is not None
    h = s.hidden_size
    heads = cdiv(s.num_attention_heads, tp)
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    # deepseek_v2.py: q_a_proj and kv_a_proj_with_mqa are one fused_qkv_a_proj with q_lora
    kv_a_rows = m.kv_lora_rank + m.qk_rope_head_dim
    if m.q_lora_rank:
        total = c.fused(f"{p}.fused_qkv_a_proj", h, (m.q_lora_rank, kv_a_rows))
        total += c.vec(m.q_lora_rank) + c.linear(f"{p}.q_b_proj", m.q_lora_rank, heads * qk)
    else:
        total = c.linear(f"{p}.q_proj", h, heads * qk)
        total += c.linear(f"{p}.kv_a_proj_with_mqa", h, kv_a_rows)
    total += c.vec(m.kv_lora_rank)
    total += c.linear(f"{p}.kv_b_proj", m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim))
    total += c.linear(f"{p}.o_proj", heads * m.v_head_dim, h)
    return total + _mla_copies(c, i)


def _mla_copies(c: _Ctx, i: int) -> int:
    """W_UK_T and W_UV, which vLLM's MLA layers derive from ``kv_b_proj`` after loading
    (``split_kv_b_proj``): dequantized copies in the model dtype when ``kv_b_proj`` is
    quantized; when it is not, ``get_and_maybe_dequant_weights`` returns the weight itself
    and both are views of it, no memory of their own (measured by the conformance test on
    bf16 DeepSeek-V2/V3: every W_UK_T/W_UV storage is ``kv_b_proj``'s)."""
    m, quant = c.spec.mla, c.quant
    name = c.module(i, f"{c.names.attention}.kv_b_proj")
    if m is None or quant is None or quant.scheme_for(name) is None:
        return 0
    heads = cdiv(c.spec.num_attention_heads, c.tp)
    return heads * m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim) * c.dtype_bytes


def _mlp_bytes(c: _Ctx, i: int, prefix: str, inter: int, *, gated: bool, bias: bool) -> int:
    h = c.spec.hidden_size
    inter_rank = cdiv(inter, c.tp)
    if gated:  # MergedColumnParallelLinear gate_up_proj
        total = c.fused(f"{prefix}.gate_up_proj", h, (inter_rank, inter_rank))
    else:
        total = c.linear(f"{prefix}.fc1", h, inter_rank)
    total += c.linear(f"{prefix}.down_proj", inter_rank, h)
    if bias:
        total += c.vec(inter_rank * (2 if gated else 1) + h)
    return total


def _moe_bytes(c: _Ctx, i: int) -> int:
    s, moe, p = c.spec, c.spec.moe, c.module(i, c.names.mlp)
    assert moe is not None
    h = s.hidden_size
    router = c.linear(f"{p}.gate", h, moe.num_experts, quantizable=c.names.quantized_router)
    total = router + (c.vec(moe.num_experts) if moe.router_bias else 0)
    ep = c.opts.ep_size
    # expert parallel: whole experts, num_experts / ep of them; else every expert TP-split
    inter = moe.expert_intermediate_size if ep > 1 else cdiv(moe.expert_intermediate_size, c.tp)
    local_experts = cdiv(moe.num_experts, ep)
    # RoutedExperts: one module for every expert's projections
    q = c.quant.scheme_for(f"{p}.experts", experts=True) if c.quant else None
    if q is not None:
        inter = q.expert_intermediate(inter)
        w13 = q.module_bytes(h, (inter, inter), c.dtype_bytes)  # w13: gate and up, merged
        per_expert = w13 + q.linear_bytes(inter, h, c.dtype_bytes)
    else:
        per_expert = 3 * h * inter * c.dtype_bytes
    if moe.expert_bias:
        per_expert += c.vec(2 * inter + h)
    total += local_experts * per_expert
    if moe.shared_intermediate_size:
        total += _mlp_bytes(
            c,
            i,
            f"{p}.{c.names.shared_experts}",
            moe.shared_intermediate_size,
            gated=True,
            bias=False,
        )
        total += h * c.dtype_bytes if moe.shared_expert_gate else 0
    return total


def _layer_bytes(c: _Ctx, i: int) -> int:
    s = c.spec
    total = c.vec(s.norms_per_layer * s.hidden_size)
    if not s.layer_attention or s.layer_attention[i] != "none" or s.state is None:
        total += _attention_bytes(c, i)
    if s.has_state(i):
        total += mixer_weight_bytes(s, c.tp, c.dtype_bytes)
    if not s.has_mlp(i):
        return total
    if s.moe is not None and s.layer_moe[i]:
        return total + _moe_bytes(c, i)
    return total + _mlp_bytes(
        c, i, c.module(i, c.names.mlp), s.intermediate_size, gated=s.gated_mlp, bias=s.mlp_bias
    )


def _vocab_rows(spec: ModelSpec, tp: int) -> int:
    return round_up(spec.vocab_size, VOCAB_PADDING) // tp


def _lm_head_bytes(c: _Ctx, vocab: int | None = None) -> int:
    rows = round_up(vocab, VOCAB_PADDING) // c.tp if vocab else _vocab_rows(c.spec, c.tp)
    lm_head = c.quant is not None and c.quant.lm_head
    q = c.quant.scheme_for(c.names.lm_head, lm_head=True) if c.quant and lm_head else None
    if q is not None:
        return q.linear_bytes(c.spec.hidden_size, rows, c.dtype_bytes)
    return rows * c.spec.hidden_size * c.dtype_bytes


FLOAT32_ROPE_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
"""Architectures whose vLLM class builds its rotary cache in float32 whatever the model
dtype (``get_rope(..., dtype=torch.float32)`` in vLLM 0.32's ``gpt_oss.py``); measured by
the conformance test (a bf16 GPT-OSS holds a 131072 x 64 float32 cos/sin cache)."""


def _rope_cache_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    if spec.architecture in FLOAT32_ROPE_ARCHITECTURES:
        dtype_bytes = 4
    return spec.rope_caches * spec.rope_cache_positions * spec.rotary_dim * dtype_bytes


def _stage_bytes(c: _Ctx, layers: range, *, first: bool, last: bool) -> int:
    s = c.spec
    total = sum(_layer_bytes(c, i) for i in layers)
    if first:
        total += _vocab_rows(s, c.tp) * s.hidden_size * c.dtype_bytes
        total += s.learned_position_embeddings * s.hidden_size * c.dtype_bytes
        if c.opts.vision:
            shards = 1 if c.opts.vision_replicated else c.tp
            total += cdiv(s.vision_parameters, shards) * c.dtype_bytes
    if last:
        total += c.vec(s.hidden_size * (2 if s.model_type == "opt" else 1))
        if c.opts.lm_head and (not s.tie_word_embeddings or not first):
            total += _lm_head_bytes(c)
    return total + _rope_cache_bytes(s, c.dtype_bytes)


def layer_bytes(
    spec: ModelSpec, i: int, *, tp: int, dtype_bytes: int, quant: QuantSpec | None
) -> int:
    """One decoder layer's bytes on one TP rank (layer ``i``'s attention and MLP kind)."""
    return _layer_bytes(_Ctx.of(spec, tp, dtype_bytes, quant), i)


def lm_head_bytes(
    spec: ModelSpec, *, tp: int, dtype_bytes: int, quant: QuantSpec | None, vocab: int | None = None
) -> int:
    """The LM head's bytes on one TP rank (``vocab`` rows, padded to 64, default the model's)."""
    return _lm_head_bytes(_Ctx.of(spec, tp, dtype_bytes, quant), vocab)


def weight_plan(
    spec: ModelSpec,
    *,
    tp: int,
    pp: int,
    dtype_bytes: int,
    quant: QuantSpec | None,
    options: WeightOptions | None = None,
) -> WeightPlan:
    """Bytes of weights on each pipeline stage's ranks."""
    opts = options or WeightOptions()
    ctx = _Ctx.of(spec, tp, dtype_bytes, quant, opts)
    stages = pp_partition(spec.num_layers, pp)
    arch = tuple(
        _stage_bytes(ctx, layers, first=k == 0, last=k == pp - 1) for k, layers in enumerate(stages)
    )
    parts = (
        [[p for i in layers for p in _layer_parts(ctx, i)] for layers in stages]
        if opts.cpu_offload_bytes
        else [[] for _ in stages]
    )
    ckpt = spec.checkpoint
    if ckpt is None or (quant is not None and quant.source == "runtime"):
        return _offloaded(arch, parts, "architecture (config.json)", opts)
    if ckpt.tensors:
        totals, in_layers = _from_tensors(ctx, ckpt, stages)
        return _offloaded(totals, _rescaled(parts, in_layers), ckpt.source, opts)
    # Only the index's total_size: scale the architecture's split to the exact total.
    base = _Ctx.of(spec, 1, spec.dtype_bytes, spec.quantization)
    arch_total = _stage_bytes(base, range(spec.num_layers), first=True, last=True)
    extras = _rope_cache_bytes(spec, spec.dtype_bytes)
    factor = (ckpt.total_bytes + extras) / arch_total if arch_total else 1.0
    scaled = tuple(round(b * factor) for b in arch)
    in_layers = tuple(round(sum(p) * factor) for p in parts)
    return _offloaded(scaled, _rescaled(parts, in_layers), ckpt.source, opts)


def _layer_parts(c: _Ctx, i: int) -> list[int]:
    """Layer ``i``'s parameters in the order vLLM registers them (attention's qkv and o,
    the MLP's gate_up and down, or the experts' w13 and w2, then the norms); each fused
    linear is one parameter. They add up to ``_layer_bytes``."""
    s = c.spec
    h = s.hidden_size
    if s.state is not None:
        return [_layer_bytes(c, i)]  # hybrid layers: one part (at most a layer more moved)
    attention = _attention_bytes(c, i)
    parts = [attention]
    if s.mla is None:
        o_in = cdiv(s.num_attention_heads, c.tp) * s.value_head_dim
        o_proj = c.linear(c.module(i, f"{c.names.attention}.o_proj"), o_in, h)
        parts = [attention - o_proj, o_proj]
    mlp = _layer_bytes(c, i) - attention - c.vec(s.norms_per_layer * h)
    if s.moe is not None and s.layer_moe[i]:
        w13 = mlp * 2 // 3
        parts += [w13, mlp - w13]
    else:
        inter = cdiv(s.intermediate_size, c.tp)
        down = c.linear(c.module(i, f"{c.names.mlp}.down_proj"), inter, h)
        parts += [mlp - down, down]
    return [*parts, c.vec(s.norms_per_layer * h)]


def _rescaled(parts: list[list[int]], totals: tuple[int, ...]) -> list[list[int]]:
    """The architecture's parameter sizes scaled to the checkpoint's per-stage totals."""
    out = []
    for stage, total in zip(parts, totals, strict=True):
        arch = sum(stage)
        out.append([round(p * total / arch) for p in stage] if arch else stage)
    return out


def _offloaded(
    stage_bytes: tuple[int, ...], parts: list[list[int]], source: str, opts: WeightOptions
) -> WeightPlan:
    """``--cpu-offload-gb``: vLLM's UVA offloader walks each rank's decoder layers, first
    layers first, and moves whole parameters to host memory while it has moved less than
    the limit (``offloader/uva.py``), so it stops on the parameter that crosses it; the
    embedding, LM head and buffers stay on the GPU."""
    if not opts.cpu_offload_bytes:
        return WeightPlan(stage_bytes, source)
    off = []
    for stage in parts:
        moved = 0
        for size in stage:
            if moved >= opts.cpu_offload_bytes:
                break
            moved += size
        off.append(moved)
    kept = tuple(b - o for b, o in zip(stage_bytes, off, strict=True))
    return WeightPlan(kept, source, tuple(off))


_LAYER_RE = re.compile(r"(?:layers|h|blocks)\.(\d+)\.")
_FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "mlp.gate.weight", "router", "norm", "sinks")
_VISION = ("visual.", "vision_tower", "vision_model", "multi_modal_projector", "mm_projector")


def _tensor_rank_bytes(
    spec: ModelSpec, name: str, num_bytes: int, tp: int, opts: WeightOptions
) -> int:
    if len(name) and any(key in name for key in _REPLICATED):
        return num_bytes
    if opts.ep_size > 1 and ".experts." in name:
        return cdiv(num_bytes, opts.ep_size)  # whole experts, num_experts / ep of them
    if opts.vision_replicated and any(key in name for key in _VISION):
        return num_bytes
    if spec.mla is None and (".k_proj." in name or ".v_proj." in name):
        kv_rank = max(1, spec.num_kv_heads // tp)
        return num_bytes * kv_rank // spec.num_kv_heads
    if "embed_tokens" in name or "lm_head" in name or "wte" in name:
        padded = round_up(spec.vocab_size, VOCAB_PADDING)
        return num_bytes * padded // spec.vocab_size // tp
    return cdiv(num_bytes, tp)


def _loaded(spec: ModelSpec, name: str, layer: int | None, opts: WeightOptions) -> bool:
    """Whether vLLM loads the tensor: MTP layers (past ``num_layers``) only for MTP
    speculation (counted there), no LM head for pooling, no encoder when it is off."""
    if layer is not None and layer >= spec.num_layers:
        return False
    if not opts.lm_head and "lm_head" in name:
        return False
    return opts.vision or not any(key in name for key in _VISION)


def _from_tensors(
    ctx: _Ctx, ckpt: CheckpointWeights, stages: list[range]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(bytes per stage, of which in decoder layers) from the checkpoint's tensors."""
    spec, tp, dtype_bytes, quant, opts = ctx.spec, ctx.tp, ctx.dtype_bytes, ctx.quant, ctx.opts
    stage_of = {i: k for k, layers in enumerate(stages) for i in layers}
    totals = [0] * len(stages)
    in_layers = [0] * len(stages)
    has_lm_head = any("lm_head" in t.name for t in ckpt.tensors)
    for t in ckpt.tensors:
        num_bytes = t.num_bytes
        kept = quant.tensor_bytes(t.name, t.dtype, num_bytes) if quant is not None else None
        if kept is not None:
            num_bytes = kept
        elif t.dtype in _FLOAT_BYTES:
            num_bytes = num_bytes * dtype_bytes // _FLOAT_BYTES[t.dtype]
        if (
            quant is not None
            and quant.moe_intermediate_multiple > 1
            and ".experts." in t.name
            and spec.moe
        ):
            inter = spec.moe.expert_intermediate_size
            num_bytes = num_bytes * quant.expert_intermediate(inter) // inter
        match = _LAYER_RE.search(t.name)
        layer = int(match.group(1)) if match else None
        if not _loaded(spec, t.name, layer, opts):
            continue
        if layer is not None:
            stage = stage_of.get(layer, 0)
        else:
            stage = (
                len(stages) - 1 if ("lm_head" in t.name or t.name.endswith("norm.weight")) else 0
            )
        rank_bytes = _tensor_rank_bytes(spec, t.name, num_bytes, tp, opts)
        totals[stage] += rank_bytes
        if layer is not None:
            in_layers[stage] += rank_bytes
    if spec.tie_word_embeddings and not has_lm_head and len(stages) > 1 and opts.lm_head:
        totals[-1] += (
            round_up(spec.vocab_size, VOCAB_PADDING) // tp * spec.hidden_size * dtype_bytes
        )
    extras = _rope_cache_bytes(spec, dtype_bytes)
    for k, layers in enumerate(stages):
        totals[k] += sum(_mla_copies(ctx, i) for i in layers)
    return tuple(b + extras for b in totals), tuple(in_layers)


def parameter_count(spec: ModelSpec) -> int:
    """Parameters of the model: the published count when known, else from the architecture
    (unquantized, unsharded, without buffers; so without MLA's copies of a quantized
    ``kv_b_proj``)."""
    if spec.declared_parameters:
        return spec.declared_parameters
    ctx = _Ctx.of(spec, 1, 1, None)
    total = _stage_bytes(ctx, range(spec.num_layers), first=True, last=True)
    return total - _rope_cache_bytes(spec, 1)
