"""Weight bytes per GPU rank, sharded the way vLLM shards them.

Per rank: ``W = column/row-parallel linear shards + vocab shard of the embedding
(+ lm_head when untied) + replicated small parameters + buffers``, module by module in
``rank_weights`` (QKV, MLA, MLP, experts, LM head, rotary cache). Here, per pipeline
stage: tied embeddings share one tensor; the embedding lives on the first stage, lm_head
on the last; with a checkpoint at hand its tensors (safetensors headers) give the exact
bytes, or its index's ``total_size`` scales the architecture's split; ``--cpu-offload-gb``
moves whole decoder-layer parameters to host memory. The rotary cache is why vLLM reports
14.99 GiB for Llama 3.1's 8.03e9 parameters = 14.96 GiB.

Worked example: Llama-3.1-8B, bf16, TP=1: 8,030,261,248 params x 2 B + 32 MiB =
16,093,642,752 B = 14.99 GiB; TP=2: 7.51 GiB per rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gatekeeper.estimator.built_stages import built_stages
from gatekeeper.estimator.moe_backend import PLAIN_MXFP4
from gatekeeper.estimator.rank_weights import (
    VOCAB_PADDING,
    RankWeights,
    WeightOptions,
    attention_bytes,
    cross_attention_bytes,
    decoder_layer_bytes,
    dense_mlp_names,
    encoder_parts,
    experts_backend,
    head_bytes,
    head_scheme,
    mla_copy_bytes,
    o_proj_name,
    output_projection_part,
    per_layer_embedding_bytes,
    pooling_head_parts,
    rope_cache_bytes,
    rope_dtype,
    vocab_rows,
)
from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import CheckpointWeights, ModelSpec
from gatekeeper.units import cdiv, round_up

__all__ = [
    "TensorShare",
    "WeightPlan",
    "layer_bytes",
    "lm_head_bytes",
    "parameter_count",
    "pp_partition",
    "stage_parts",
    "tensor_shares",
    "weight_plan",
]


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


def stage_parts(c: RankWeights, *, first: bool, last: bool) -> list[tuple[str, str, int]]:
    """A stage's weights outside its decoder layers as (module group, format, bytes): the
    embedding (first stage), the vision encoder, the final norm, the LM head and a pooling
    model's heads (last stage), the rotary cache. Format ``""`` is the model dtype, else a scheme's method
    (the LM head's) or ``float32``."""
    s = c.spec
    parts = []
    if first:
        # Whisper's nn.Embedding: every row, unpadded, on every rank
        vocab = s.vocab_size if s.plain_embedding else vocab_rows(s, c.tp)
        embedding = vocab + s.learned_position_embeddings
        parts.append(("embedding", "", embedding * s.hidden_size * c.dtype_bytes))
        if s.per_layer_input_size:  # Gemma 4 E2B/E4B: per-layer embeddings
            parts.append(("embedding", "", per_layer_embedding_bytes(c)))
        if c.opts.vision and s.encoder is not None:  # Whisper's audio encoder
            parts += [("vision", fmt, size) for fmt, size in encoder_parts(c)]
        elif c.opts.vision or (s.vision is not None and s.vision.built_without_media):
            parts += _vision_parts(c)
    if last:
        biased = s.model_type in ("opt", "whisper")  # a LayerNorm: weight and bias
        parts.append(("other", "", c.vec(s.hidden_size * (2 if biased else 1))))
        if c.opts.lm_head and (not s.tie_word_embeddings or not first):
            scheme = head_scheme(c)
            parts.append(("lm_head", scheme.method if scheme else "", head_bytes(c)))
        if c.opts.pooling:  # the pooling class's own heads (pooler, classifier, MLM head)
            parts += [("other", fmt, size) for fmt, size in pooling_head_parts(c)]
        if s.output_projection:  # EmbeddingGemma2's embedding_projection
            parts.append(output_projection_part(c))
    rope = rope_dtype(s)
    return [*parts, ("other", rope, rope_cache_bytes(s, c.dtype_bytes, c.opts.max_model_len))]


def _vision_parts(c: RankWeights) -> list[tuple[str, str, int]]:
    """The vision encoder on a rank: its linears built with the quantization config
    (``VisionSpec.quantized_linears``, column-parallel) as their scheme holds them, the
    rest of its parameters in the model dtype; whole where vLLM replicates it."""
    s = c.spec
    whole = c.opts.vision_replicated or (s.vision is not None and s.vision.replicated)
    shards = 1 if whole else c.tp
    linears = s.vision.quantized_linears if s.vision is not None else ()
    rest = s.vision_parameters - sum(i * o for _, i, o in linears)
    out = [("vision", "", cdiv(rest, shards) * c.dtype_bytes)]
    for name, in_f, out_f in linears:
        q = c.quant.scheme_for(name) if c.quant is not None else None
        size = c.linear(name, in_f, out_f if c.opts.vision_replicated else cdiv(out_f, c.tp))
        out.append(("vision", q.method if q is not None else "", size))
    return out


def _stage_bytes(c: RankWeights, layers: range, *, first: bool, last: bool) -> int:
    total = sum(decoder_layer_bytes(c, i) for i in layers)
    return total + sum(size for _, _, size in stage_parts(c, first=first, last=last))


def layer_bytes(
    spec: ModelSpec, i: int, *, tp: int, dtype_bytes: int, quant: QuantSpec | None
) -> int:
    """One decoder layer's bytes on one TP rank (layer ``i``'s attention and MLP kind)."""
    return decoder_layer_bytes(RankWeights.of(spec, tp, dtype_bytes, quant), i)


def lm_head_bytes(
    spec: ModelSpec, *, tp: int, dtype_bytes: int, quant: QuantSpec | None, vocab: int | None = None
) -> int:
    """The LM head's bytes on one TP rank (``vocab`` rows, padded to 64, default the model's)."""
    return head_bytes(RankWeights.of(spec, tp, dtype_bytes, quant), vocab)


@lru_cache(maxsize=128)
def weight_plan(
    spec: ModelSpec,
    *,
    tp: int,
    pp: int,
    dtype_bytes: int,
    quant: QuantSpec | None,
    options: WeightOptions | None = None,
) -> WeightPlan:
    """Bytes of weights on each pipeline stage's ranks. Remembered for the last 128 calls
    (every argument is frozen): a webhook reviews the same workload's shape again and
    again, and the per-layer sum is most of a review's time."""
    opts = options or WeightOptions()
    ctx = RankWeights.of(spec, tp, dtype_bytes, quant, opts)
    stages = pp_partition(spec.num_layers, pp)
    arch = tuple(
        _stage_bytes(ctx, layers, first=k == 0, last=k == pp - 1) for k, layers in enumerate(stages)
    )
    parts = (
        [[p for i in layers for p in _layer_parts(ctx, i)] for layers in stages]
        if opts.cpu_offload_bytes
        else [[] for _ in stages]
    )
    built = spec.built
    if built is not None and built.tensor_parallel_size == tp and built.dtype_bytes == dtype_bytes:
        totals, built_parts = built_stages(ctx, built, stages)
        return _offloaded(totals, built_parts, built.source, opts)
    ckpt = spec.checkpoint
    if ckpt is None or (quant is not None and quant.source == "runtime"):
        return _offloaded(arch, parts, "architecture (config.json)", opts)
    if ckpt.tensors:
        totals, in_layers = _from_tensors(ctx, ckpt, stages)
        return _offloaded(totals, _rescaled(parts, in_layers), ckpt.source, opts)
    # Only the index's total_size: scale the architecture's split to the exact total.
    base = RankWeights.of(spec, 1, spec.dtype_bytes, spec.quantization)
    arch_total = _stage_bytes(base, range(spec.num_layers), first=True, last=True)
    extras = rope_cache_bytes(spec, spec.dtype_bytes)
    factor = (ckpt.total_bytes + extras) / arch_total if arch_total else 1.0
    scaled = tuple(round(b * factor) for b in arch)
    in_layers = tuple(round(sum(p) * factor) for p in parts)
    return _offloaded(scaled, _rescaled(parts, in_layers), ckpt.source, opts)


def _layer_parts(c: RankWeights, i: int) -> list[int]:
    """Layer ``i``'s parameters in the order vLLM registers them (attention's qkv and o,
    the MLP's gate_up and down, or the experts' w13 and w2, then the norms); each fused
    linear is one parameter. They add up to ``decoder_layer_bytes``."""
    s = c.spec
    h = s.hidden_size
    if s.state is not None:
        return [decoder_layer_bytes(c, i)]  # hybrid layers: one part (at most a layer more moved)
    attention = attention_bytes(c, i)
    parts = [attention]
    if s.mla is None:
        o_in = cdiv(s.num_attention_heads, c.tp) * s.value_head_dim
        o_proj = c.linear(o_proj_name(c, i), o_in, h)
        parts = [attention - o_proj, o_proj]
    cross = cross_attention_bytes(c, i) if s.encoder is not None else 0
    parts += [cross] if cross else []
    mlp = decoder_layer_bytes(c, i) - attention - cross - c.vec(s.norms_per_layer * h)
    if s.moe is not None and s.layer_moe[i]:
        w13 = mlp * 2 // 3
        parts += [w13, mlp - w13]
    else:
        inter = cdiv(s.intermediate_size, c.tp)
        down = c.linear(
            dense_mlp_names(c, i)[1] or c.module(i, f"{c.names.mlp}.down_proj"), inter, h
        )
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
_WHOLE_IN_ENCODER = ("encoder.conv1.", "encoder.conv2.", "embed_positions")
"""Whisper's torch modules (nn.Conv1d, nn.Embedding): whole on every rank."""


def _tensor_rank_bytes(
    spec: ModelSpec, name: str, num_bytes: int, tp: int, opts: WeightOptions
) -> int:
    if len(name) and any(key in name for key in _REPLICATED):
        return num_bytes
    if opts.ep_size > 1 and ".experts." in name:
        return cdiv(num_bytes, opts.ep_size)  # whole experts, num_experts / ep of them
    if opts.vision_replicated and any(key in name for key in _VISION):
        return num_bytes
    if spec.plain_embedding and "embed_tokens" in name:
        return num_bytes  # Whisper's nn.Embedding: whole on every rank
    if spec.encoder is not None and any(key in name for key in _WHOLE_IN_ENCODER):
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
    if spec.encoder is not None and not opts.vision and name.startswith("model.encoder."):
        return False  # Whisper's audio encoder, not built without audio
    return opts.vision or not any(key in name for key in _VISION)


@dataclass(frozen=True, slots=True)
class TensorShare:
    """One rank's share of a checkpoint tensor (or of what vLLM adds beside them)."""

    name: str
    stage: int
    rank_bytes: int
    layer: int | None
    form: str
    """``""``: held in the model dtype (a float tensor cast to it); ``stored``: as the
    checkpoint stores it (packed weights, scales); or a dtype (``float32``)."""


def _from_tensors(
    ctx: RankWeights, ckpt: CheckpointWeights, stages: list[range]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(bytes per stage, of which in decoder layers) from the checkpoint's tensors."""
    totals = [0] * len(stages)
    in_layers = [0] * len(stages)
    for share in tensor_shares(ctx, ckpt, stages):
        totals[share.stage] += share.rank_bytes
        if share.layer is not None:
            in_layers[share.stage] += share.rank_bytes
    return tuple(totals), tuple(in_layers)


def _padded_experts(ctx: RankWeights, num_bytes: int) -> int:
    """A checkpoint's MXFP4 expert tensor as the backend vLLM picks on the GPU holds it
    (``moe_backend``: padded, and re-laid out on Hopper), in proportion."""
    moe = ctx.spec.moe
    assert moe is not None
    h, inter = ctx.spec.hidden_size, moe.expert_intermediate_size
    rank = inter if ctx.opts.ep_size > 1 else cdiv(inter, ctx.tp)
    held = experts_backend(ctx).expert_bytes(h, rank, shards=2, bias_bytes=0)
    return num_bytes * held // PLAIN_MXFP4.expert_bytes(h, rank, shards=2, bias_bytes=0)


def tensor_shares(
    ctx: RankWeights, ckpt: CheckpointWeights, stages: list[range]
) -> list[TensorShare]:
    """Each loaded checkpoint tensor's bytes on one rank of its stage, then what vLLM
    holds beside them: a tied LM head on a later stage (``lm_head.weight``), MLA's copies
    of a quantized ``kv_b_proj`` (``...W_UK_T+W_UV``), the rotary cache (``rotary_emb``)."""
    spec, tp, dtype_bytes, quant, opts = ctx.spec, ctx.tp, ctx.dtype_bytes, ctx.quant, ctx.opts
    stage_of = {i: k for k, layers in enumerate(stages) for i in layers}
    out = []
    has_lm_head = any("lm_head" in t.name for t in ckpt.tensors)
    for t in ckpt.tensors:
        num_bytes = t.num_bytes
        kept = quant.tensor_bytes(t.name, t.dtype, num_bytes) if quant is not None else None
        if kept is not None:
            num_bytes = kept
        elif t.dtype in _FLOAT_BYTES:
            num_bytes = num_bytes * dtype_bytes // _FLOAT_BYTES[t.dtype]
        form = "" if kept is None and t.dtype in _FLOAT_BYTES else "stored"
        if quant is not None and quant.method == "mxfp4" and ".experts." in t.name and spec.moe:
            num_bytes = _padded_experts(ctx, num_bytes)
        match = _LAYER_RE.search(t.name)
        layer = int(match.group(1)) if match else None
        if spec.encoder is not None and t.name.startswith("model.encoder."):
            layer = None  # Whisper's encoder layers: the tower's, on the first stage
        if not _loaded(spec, t.name, layer, opts):
            continue
        if layer is not None:
            stage = stage_of.get(layer, 0)
        else:
            stage = (
                len(stages) - 1 if ("lm_head" in t.name or t.name.endswith("norm.weight")) else 0
            )
        rank_bytes = _tensor_rank_bytes(spec, t.name, num_bytes, tp, opts)
        out.append(TensorShare(t.name, stage, rank_bytes, layer, form))
    if spec.tie_word_embeddings and not has_lm_head and len(stages) > 1 and opts.lm_head:
        rows = round_up(spec.vocab_size, VOCAB_PADDING) // tp
        out.append(
            TensorShare(
                "lm_head.weight", len(stages) - 1, rows * spec.hidden_size * dtype_bytes, None, ""
            )
        )
    for k, layers in enumerate(stages):
        for i in layers:
            if copies := mla_copy_bytes(ctx, i):
                name = ctx.module(i, f"{ctx.names.attention}.W_UK_T+W_UV")
                out.append(TensorShare(name, k, copies, None, ""))
    rope = rope_cache_bytes(spec, dtype_bytes, opts.max_model_len)
    form = rope_dtype(spec)
    out += [
        TensorShare("rotary_emb.cos_sin_cache", k, rope, None, form) for k in range(len(stages))
    ]
    return out


def parameter_count(spec: ModelSpec) -> int:
    """Parameters of the model: the published count when known, else from the architecture
    (unquantized, unsharded, without buffers; so without MLA's copies of a quantized
    ``kv_b_proj``)."""
    if spec.declared_parameters:
        return spec.declared_parameters
    ctx = RankWeights.of(spec, 1, 1, None)
    total = _stage_bytes(ctx, range(spec.num_layers), first=True, last=True)
    return total - rope_cache_bytes(spec, 1)
