"""One TP rank's weight bytes, module by module, as vLLM's model classes register them.

``RankWeights`` names each module as vLLM does and asks the quantization config for its
scheme; ``decoder_layer_bytes`` adds up one decoder layer (attention or MLA, the MLP or
the experts, norms), ``head_bytes`` the LM head, ``rope_cache_bytes`` the rotary cache.
``weights`` puts them together per pipeline stage.

- QKV: ``(q_heads/tp + 2*max(1, kv_heads/tp)) * head_dim`` output rows per rank, so KV
  heads replicate (and cost extra) when ``kv_heads < tp``.
- Embedding and lm_head: ``round_up(vocab, 64) / tp`` rows.
- MoE: every rank holds all experts with the intermediate split by TP (whole experts,
  ``experts / ep`` of them, under expert parallelism); the router is replicated.
- MLA: ``q_a_proj`` and ``kv_a_proj_with_mqa`` are replicated; when ``kv_b_proj`` is
  quantized vLLM also keeps dequantized ``W_UK_T``/``W_UV`` copies of it in the model
  dtype (unquantized, they are views of it).
- Buffers: the rotary cos/sin cache, ``positions x rotary_dim`` in the model dtype
  (Llama 3.1: 131072 x 128 x 2 B = 32 MiB); one per layer type where the types' widths
  differ (Gemma 4 31B: 262144 x (256 + 512) x 2 B = 384 MiB).
- Layers with their own heads (``ModelSpec.attention_shape``: Gemma 4's global layers,
  ``global_head_dim`` and their own KV heads) size QKV, o_proj and the q/k norms by them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gatekeeper.estimator.moe_backend import (
    ExpertsBackend,
    mxfp4_experts_backend,
    wna16_experts,
)
from gatekeeper.estimator.state import mixer_linears, mixer_weight_bytes
from gatekeeper.models.module_names import (
    EncoderNames,
    ModuleNames,
    mla_attention,
    module_names,
    output_projection,
    rope_follows_max_model_len,
)
from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec
from gatekeeper.units import cdiv, round_up

__all__ = [
    "VOCAB_PADDING",
    "LayerPart",
    "RankWeights",
    "WeightOptions",
    "attention_bytes",
    "cross_attention_bytes",
    "decoder_layer_bytes",
    "dense_mlp_names",
    "encoder_parts",
    "experts_backend",
    "head_bytes",
    "head_scheme",
    "layer_parts",
    "mla_copy_bytes",
    "moe_prefix",
    "o_proj_name",
    "output_projection_part",
    "per_layer_embedding_bytes",
    "pooling_head_parts",
    "rope_cache_bytes",
    "rope_dtype",
    "vocab_rows",
]

VOCAB_PADDING = 64


@dataclass(frozen=True, slots=True)
class WeightOptions:
    """Serving flags that change which weights a rank holds.

    - ``ep_size``: expert parallelism (``--enable-expert-parallel``) over ``dp x tp``
      ranks: each rank holds ``experts / ep_size`` whole experts instead of every
      expert's ``intermediate / tp`` slice;
    - ``lm_head``: False for pooling runners, which load no LM head (but for a pooling
      class that keeps its causal LM's: ``pooling_heads.pooling_lm_head``);
    - ``pooling``: a pooling run: the class's own heads (``ModelSpec.pooling_heads``)
      on the last stage;
    - ``vision``: False when ``--limit-mm-per-prompt`` allows no item of any modality
      (vLLM then builds no encoder); ``vision_replicated`` for
      ``--mm-encoder-tp-mode data`` (the encoder whole on every rank);
    - ``cpu_offload_bytes``: ``--cpu-offload-gb`` x 2^30: vLLM's UVA offloader moves
      decoder-layer parameters, first layers first, to host memory until that many
      bytes are off the GPU (``model_executor/offloader/uva.py``).
    """

    ep_size: int = 1
    lm_head: bool = True
    pooling: bool = False
    vision: bool = True
    vision_replicated: bool = False
    cpu_offload_bytes: int = 0
    compute_capability: tuple[int, int] | None = None
    """The GPU's, when known: MXFP4 experts are padded as the backend vLLM picks on it
    pads them (``moe_backend``)."""
    max_model_len: int = 0
    """The length served (``--max-model-len`` or the model's default), for a class that
    sizes its rotary cache by it (``rope_cache_bytes``); 0: unknown."""


def _names(spec: ModelSpec) -> ModuleNames:
    return module_names(spec.architecture, q_lora_rank=spec.mla.q_lora_rank if spec.mla else None)


@dataclass(frozen=True, slots=True)
class RankWeights:
    """One rank's sizing context. Modules are named as vLLM's model class names them
    (``model.layers.0.self_attn.qkv_proj``, ``...mlp.gate_up_proj``, ``...mlp.experts``),
    which is how vLLM asks the quantization config (``get_quant_method(layer, prefix)``)."""

    spec: ModelSpec
    tp: int
    dtype_bytes: int
    quant: QuantSpec | None
    names: ModuleNames
    opts: WeightOptions = WeightOptions()
    layer_prefix: str = ""
    """When set, the name of every layer this context sizes (an MTP drafter's layer,
    ``mtp.layers.0``, sized with the shape of the target's last layer)."""

    @classmethod
    def of(
        cls,
        spec: ModelSpec,
        tp: int,
        dtype_bytes: int,
        quant: QuantSpec | None,
        opts: WeightOptions | None = None,
    ) -> RankWeights:
        names = _names(spec)
        quant = quant.for_model(names) if quant is not None else None
        return cls(spec, tp, dtype_bytes, quant, names, opts or WeightOptions())

    def module(self, i: int, name: str) -> str:
        """Module ``name`` of layer ``i`` as vLLM asks about it (``""``: the layer)."""
        layer = self.layer_prefix or self.names.layer(i, self.spec.num_layers)
        return f"{layer}.{name}" if name else layer

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


def attention_bytes(c: RankWeights, i: int) -> int:
    s, tp, p = c.spec, c.tp, c.module(i, c.names.attention)
    h = s.hidden_size
    if s.mla is not None:
        return _mla_bytes(c, i)
    shape = s.attention_shape(i)  # the layer's own heads (Gemma 4's global layers)
    q_rank = cdiv(s.num_attention_heads, tp) * shape.head_dim
    kv_heads = max(1, shape.num_kv_heads // tp)
    k_rank = kv_heads * shape.head_dim
    v_rank = kv_heads * shape.v_head_dim
    o_in = cdiv(s.num_attention_heads, tp) * shape.v_head_dim
    if s.attention_output_gate:
        q_rank *= 2  # the gate's rows ride in q_proj (qwen3_next.py: heads x (1 + gate))
    shared = s.reads_shared_kv(i)
    if shared:  # K and V come from an earlier layer's cache: q_proj only, no k_norm
        k_rank = v_rank = 0
        qkv = c.linear(f"{p}.q_proj", h, q_rank)
    else:  # QKVParallelLinear (MiniMax-M3's indexed layers: q, k, v, index_q, index_k)
        outs = (q_rank, k_rank, v_rank, *_indexer_outs(c, i, kv_heads))
        qkv = c.fused(c.module(i, c.names.qkv) if c.names.qkv else f"{p}.qkv_proj", h, outs)
    total = qkv + c.linear(o_proj_name(c, i), o_in, h)
    if s.attention_bias:
        total += c.vec(q_rank + k_rank + v_rank)
    if s.output_bias:
        total += c.vec(h)
    if s.qk_norm:
        total += c.vec((1 if shared else 2) * shape.head_dim)
    if s.attention_sinks:
        total += cdiv(s.num_attention_heads, tp) * 4
    if _indexer_outs(c, i, kv_heads):
        total += c.vec(2 * s.indexer_head_dim)  # index_q_norm, index_k_norm
    return total


def o_proj_name(c: RankWeights, i: int) -> str:
    """Attention's output linear in layer ``i`` (the table's, OPT's ``out_proj``)."""
    return c.module(i, c.names.o_proj or f"{c.names.attention}.o_proj")


def _indexer_outs(c: RankWeights, i: int, kv_heads: int) -> tuple[int, ...]:
    """The lightning indexer's shards of MiniMax-M3's ``qkv_proj`` on a rank
    (``MinimaxM3QKVParallelLinearWithIndexer``): index_q, a head per KV head sharded as
    K and V are, and index_k, one head on every rank."""
    s = c.spec
    if not s.layer_indexer or not s.layer_indexer[i]:
        return ()
    return (kv_heads * s.indexer_head_dim, s.indexer_head_dim)


def _mla_bytes(c: RankWeights, i: int) -> int:
    s, tp, p = c.spec, c.tp, c.module(i, c.names.attention)
    m = s.mla
    assert m is not None
    h = s.hidden_size
    heads = cdiv(s.num_attention_heads, tp)
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    # deepseek_v2.py: q_a_proj and kv_a_proj_with_mqa are one fused_qkv_a_proj with q_lora;
    # a class that packs none builds them apart (minicpm3.py: two ReplicatedLinears)
    kv_a_rows = m.kv_lora_rank + m.qk_rope_head_dim
    fused = not c.names.known or any(k == "fused_qkv_a_proj" for k, _ in c.names.packed)
    if m.q_lora_rank and fused:
        total = c.fused(f"{p}.fused_qkv_a_proj", h, (m.q_lora_rank, kv_a_rows))
        total += c.vec(m.q_lora_rank) + c.linear(f"{p}.q_b_proj", m.q_lora_rank, heads * qk)
    elif m.q_lora_rank:
        total = c.linear(_asked(c, i, "q_a_proj"), h, m.q_lora_rank)
        total += c.linear(_asked(c, i, "kv_a_proj_with_mqa"), h, kv_a_rows)
        total += c.vec(m.q_lora_rank) + c.linear(f"{p}.q_b_proj", m.q_lora_rank, heads * qk)
    else:
        total = c.linear(f"{p}.q_proj", h, heads * qk)
        total += c.linear(f"{p}.kv_a_proj_with_mqa", h, kv_a_rows)
    total += c.vec(m.kv_lora_rank)
    total += c.linear(f"{p}.kv_b_proj", m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim))
    total += c.linear(f"{p}.o_proj", heads * m.v_head_dim, h)
    return total + mla_copy_bytes(c, i)


def _asked(c: RankWeights, i: int, linear: str) -> str:
    """The name attention's ``linear`` asks the quantization config with: its path, or
    the one vLLM built it with where that is not its layer's (the names table's
    ``unlayered_linears``: MiniCPM3's ``q_a_proj``, a ``ReplicatedLinear`` given no
    prefix, asks as ``""``)."""
    rel = f"{c.names.attention}.{linear}"
    unlayered = (c.names.extra.get("built") or {}).get("unlayered_linears") or {}
    return str(unlayered[rel]) if rel in unlayered else c.module(i, rel)


def mla_copy_bytes(c: RankWeights, i: int) -> int:
    """W_UK_T and W_UV, which vLLM's MLA layers derive from ``kv_b_proj`` after loading
    (``split_kv_b_proj``): dequantized copies in the model dtype when ``kv_b_proj`` is
    quantized; when it is not, ``get_and_maybe_dequant_weights`` returns the weight itself
    and both are views of it, no memory of their own (measured by the conformance test on
    bf16 DeepSeek-V2/V3: every W_UK_T/W_UV storage is ``kv_b_proj``'s). None where the
    class runs a plain ``Attention`` on MLA's projections (MiniCPM3: the names table's
    ``mla_attention`` False), which derives nothing."""
    m, quant = c.spec.mla, c.quant
    name = c.module(i, f"{c.names.attention}.kv_b_proj")
    if m is None or quant is None or quant.scheme_for(name) is None:
        return 0
    if mla_attention(c.spec.architecture) is False:
        return 0
    heads = cdiv(c.spec.num_attention_heads, c.tp)
    return heads * m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim) * c.dtype_bytes


def _mlp_bytes(
    c: RankWeights,
    i: int,
    prefix: str,
    inter: int,
    *,
    gated: bool,
    bias: bool,
    names: tuple[str, str] = ("", ""),
) -> int:
    """An MLP's up (gate/up) and down linears under ``prefix``, or named ``names``
    (the table's up and down linears of a dense layer: OPT's ``fc1``/``fc2``)."""
    h = c.spec.hidden_size
    inter_rank = cdiv(inter, c.tp)
    up = names[0] or f"{prefix}.{'gate_up_proj' if gated else 'fc1'}"
    # gated: MergedColumnParallelLinear gate_up_proj, one scheme for both shards
    total = c.fused(up, h, (inter_rank,) * (2 if gated else 1))
    total += c.linear(names[1] or f"{prefix}.down_proj", inter_rank, h)
    if bias:
        total += c.vec(inter_rank * (2 if gated else 1) + h)
    return total


def experts_backend(c: RankWeights) -> ExpertsBackend:
    """The backend vLLM runs MXFP4 experts with on this GPU (gpt-oss' own choice for
    ``GptOssMxfp4Config``, every other MXFP4 MoE's otherwise)."""
    gpt_oss = c.spec.model_type == "gpt_oss"
    return mxfp4_experts_backend(c.opts.compute_capability, gpt_oss=gpt_oss)


def moe_prefix(c: RankWeights, i: int) -> str:
    """Layer ``i``'s module holding the routed experts and their router, as vLLM asks the
    quantization config about it (``model.layers.3.mlp``; Gemma 4's ``...layers.3``, whose
    experts sit on the layer beside its dense ``mlp``)."""
    return c.module(i, c.names.moe_module)


def _moe_bytes(c: RankWeights, i: int) -> int:
    s, moe, p = c.spec, c.spec.moe, moe_prefix(c, i)
    assert moe is not None
    h = s.hidden_size
    router = c.linear(
        f"{p}.{c.names.router_path}", h, moe.num_experts, quantizable=c.names.quantized_router
    )
    if moe.router_float32:  # float32 weight and routing bias (MiniMax-M3)
        router = (h + 1) * moe.num_experts * 4
    total = router + (c.vec(moe.num_experts) if moe.router_bias else 0)
    if moe.router_scales:  # Gemma 4's router.scale and router.per_expert_scale
        total += c.vec(h + moe.num_experts)
    ep = c.opts.ep_size
    # expert parallel: whole experts, num_experts / ep of them; else every expert TP-split
    inter = moe.expert_intermediate_size if ep > 1 else cdiv(moe.expert_intermediate_size, c.tp)
    local_experts = cdiv(moe.num_experts, ep)
    width = moe.latent_size or h  # latent MoE: the experts run between two projections
    if moe.latent_size:
        total += c.linear(f"{p}.fc1_latent_proj", h, width)
        total += c.linear(f"{p}.fc2_latent_proj", width, h)
        total += c.vec(width + h) if s.mlp_bias else 0
    # RoutedExperts: one module for every expert's projections; w13 is gate and up merged
    # (up alone where the MLP is not gated: Nemotron-H's relu2 experts)
    shards = 2 if s.gated_mlp else 1
    q = c.quant.scheme_for(f"{p}.experts", experts=True) if c.quant else None
    if q is not None:  # GPTQ/AWQ experts Marlin cannot run: MoE-WNA16's layout
        q = wna16_experts(q, width, inter)
    # MoeWNA16Method.create_weights registers no expert biases
    bias = c.dtype_bytes if moe.expert_bias and (q is None or q.method != "moe_wna16") else 0
    if q is not None and q.method == "mxfp4":  # as the backend vLLM picks holds them
        backend = experts_backend(c)
        per_expert = backend.expert_bytes(width, inter, shards=shards, bias_bytes=bias)
    elif q is not None:
        w13 = q.module_bytes(width, (inter,) * shards, c.dtype_bytes)
        per_expert = w13 + q.linear_bytes(inter, width, c.dtype_bytes)
        per_expert += (shards * inter + width) * bias
    else:
        per_expert = (shards + 1) * width * inter * c.dtype_bytes
        per_expert += (shards * inter + width) * bias
    total += local_experts * per_expert
    if moe.shared_intermediate_size:
        total += _mlp_bytes(
            c,
            i,
            f"{p}.{c.names.shared_experts}",
            moe.shared_intermediate_size,
            gated=s.gated_mlp,
            bias=False,
        )
        total += h * c.dtype_bytes if moe.shared_expert_gate else 0
    return total


LayerPart = tuple[str, Callable[[RankWeights, int], int]]
"""One part of a decoder layer: its module group (``weight_groups.GROUPS``) and the
function that sizes it on a rank."""


def _norms_bytes(c: RankWeights, i: int) -> int:
    s = c.spec
    moe_norms = s.moe.norms if s.moe is not None and s.layer_moe[i] else 0
    return c.vec((s.norms_per_layer + moe_norms) * s.hidden_size)


_BA_REPLICATED_METHODS = ("awq", "gptq", "inc")
"""Configs under which vLLM replicates Qwen3.5's ``in_proj_ba`` (``maybe_disable_tp``:
``AutoAWQConfig``, ``AutoGPTQConfig``, ``INCConfig``, on CUDA)."""


def _mixer_bytes(c: RankWeights, i: int) -> int:
    """The state mixer's weights: its linears as the quantization config says
    (``state.mixer_linears``, named ``<layer>.<mixer>.<linear>`` as vLLM builds them,
    fused shards matched through the class's ``packed_modules_mapping``), the rest in
    the model dtype."""
    plain = mixer_linears(c.spec, c.tp)
    total = mixer_weight_bytes(c.spec, c.tp, c.dtype_bytes)
    if not plain or c.names.mixer is None:  # no name to ask the config with: model dtype
        return total
    total -= sum(m.in_features * sum(m.outs) for m in plain) * c.dtype_bytes
    method = c.quant.method.split(":")[0] if c.quant is not None else ""
    shared = c.spec.shared_blocks is not None  # Zamba2's mixer asks as <prefix>.mixer
    prefix = f"{_zamba2_prefix(c, i)}.mixer" if shared else c.module(i, c.names.mixer)
    for m in mixer_linears(c.spec, c.tp, replicated_ba=method in _BA_REPLICATED_METHODS):
        total += c.fused(f"{prefix}.{m.name}", m.in_features, m.outs)
    return total


def _dense_mlp_bytes(c: RankWeights, i: int) -> int:
    s = c.spec
    wide = 2 if s.double_wide_mlp and s.reads_shared_kv(i) else 1  # Gemma 4's KV-shared layers
    inter = s.intermediate_size * wide
    name = c.names.dense_mlp or c.names.mlp  # MiniMax-M3: mlp apart from block_sparse_moe
    return _mlp_bytes(
        c,
        i,
        c.module(i, name),
        inter,
        gated=s.gated_mlp,
        bias=s.mlp_bias,
        names=dense_mlp_names(c, i),
    )


def dense_mlp_names(c: RankWeights, i: int) -> tuple[str, str]:
    """A dense layer's up and down linears as the table names them (empty: the MLP's
    ``gate_up_proj``/``fc1`` and ``down_proj``)."""
    up, down = c.names.up, c.names.down
    return (c.module(i, up) if up else "", c.module(i, down) if down else "")


def _per_layer_input_bytes(c: RankWeights, i: int) -> int:
    """A layer's per-layer-embedding gate and projection (replicated linears) and norm."""
    h, size, block = c.spec.hidden_size, c.spec.per_layer_input_size, _ple_block(c)
    gate = c.linear(c.module(i, f"{block}per_layer_input_gate"), h, size)
    return gate + c.linear(c.module(i, f"{block}per_layer_projection"), size, h) + c.vec(h)


def _ple_block(c: RankWeights) -> str:
    """The module holding a layer's per-layer-input gate and projection, relative to the
    layer and with its dot: none where they sit on the layer (Gemma 4), ``ple_block.``
    (EmbeddingGemma2), as the names table's build found them."""
    built = c.names.extra.get("built") or {}
    mlps: dict[str, list[list[object]]] = (built.get("linears") or {}).get("mlp") or {}
    holds = (a for a, rows in mlps.items() if any(r[0] == "per_layer_input_gate" for r in rows))
    return next((f"{a}." for a in holds), "")


def _ple_projection(c: RankWeights) -> str:
    """The model's per-layer projection as vLLM names it (EmbeddingGemma2's
    ``language_model.ple.per_layer_model_projection``: the table's ``outside_linears``),
    else Gemma 4's, on the decoder."""
    outside = (c.names.extra.get("built") or {}).get("outside_linears") or ()
    found = (str(n) for n in outside if str(n).endswith(".per_layer_model_projection"))
    return next(found, f"{c.names.model}.per_layer_model_projection")


def per_layer_embedding_bytes(c: RankWeights) -> int:
    """The first stage's per-layer embeddings (Gemma 4 E2B/E4B): the table, vocabulary
    rows padded and split like the embedding's, ``layers x size`` wide; the projection
    from the hidden state (column-parallel) and its norm. 0 without them."""
    s = c.spec
    size = s.per_layer_input_size
    if not size:
        return 0
    width = s.num_layers * size
    table = round_up(s.per_layer_input_vocab, VOCAB_PADDING) // c.tp * width * c.dtype_bytes
    projection = c.linear(_ple_projection(c), s.hidden_size, cdiv(width, c.tp))
    return table + projection + c.vec(size)


def _dense_beside_experts_bytes(c: RankWeights, i: int) -> int:
    """The dense MLP an MoE layer runs beside its experts (Gemma 4's ``mlp``)."""
    moe = c.spec.moe
    assert moe is not None
    inter = moe.dense_intermediate_size
    return _mlp_bytes(c, i, c.module(i, c.names.mlp), inter, gated=True, bias=c.spec.mlp_bias)


def _zamba2_prefix(c: RankWeights, i: int) -> str:
    """The prefix vLLM builds Zamba2's layer ``i`` with, and so asks the quantization
    config with: ``str(hybrid layers + i)`` (``zamba2.py``, ``Zamba2Model.__init__``), its
    ``linear`` and its mixer (``<prefix>.mixer``) under it."""
    return str(sum(kind != "none" for kind in c.spec.layer_attention) + i)


def _hybrid_index(c: RankWeights, i: int) -> int:
    """Layer ``i``'s place among Zamba2's hybrid layers (its ``block_idx``)."""
    return sum(kind != "none" for kind in c.spec.layer_attention[:i])


def _runs_a_new_block(c: RankWeights, i: int) -> bool:
    """Layer ``i`` is the first to run its shared block (they take the blocks in turn), so
    the block's weights are counted with it."""
    shared = c.spec.shared_blocks
    return shared is not None and _hybrid_index(c, i) < shared.blocks


def _shared_norms_bytes(c: RankWeights, i: int) -> int:
    """A shared block's ``input_layernorm`` (over the hidden state and the embeddings side
    by side) and ``pre_ff_layernorm``."""
    shared = c.spec.shared_blocks
    assert shared is not None
    return c.vec(shared.input_size + c.spec.hidden_size) if _runs_a_new_block(c, i) else 0


def _shared_attention_bytes(c: RankWeights, i: int) -> int:
    """A Zamba2 hybrid layer's part of the shared attention (``Zamba2Attention``): the
    block's ``qkv_proj`` (``input_size`` -> q, k and v of every head) and ``o_proj`` at the
    layer that runs the block first; its own q, k and v adapters (``Zamba2LoRA``: A
    ``input_size`` -> rank, B rank -> ``input_size``, both column-parallel) with
    ``attention_adapters``. The blocks are built with the model's prefix, and ask with it
    (``model.qkv_proj``, ``model.linear_q_adapter.A``)."""
    s, shared, p = c.spec, c.spec.shared_blocks, c.names.model
    assert shared is not None
    total = 0
    heads = cdiv(s.num_attention_heads, c.tp) * s.head_dim
    if _runs_a_new_block(c, i):
        total += c.fused(f"{p}.qkv_proj", shared.input_size, (heads, heads, heads))
        total += c.linear(f"{p}.o_proj", heads, s.hidden_size)
    if shared.attention_adapters:
        rank, width = cdiv(shared.adapter_rank, c.tp), cdiv(shared.input_size, c.tp)
        for x in "qkv":
            total += c.linear(f"{p}.linear_{x}_adapter.A", shared.input_size, rank)
            total += c.linear(f"{p}.linear_{x}_adapter.B", shared.adapter_rank, width)
    return total


def _shared_mlp_bytes(c: RankWeights, i: int) -> int:
    """A Zamba2 hybrid layer's part of the shared MLP (``Zamba2MLP``, gated): the block's
    ``gate_up_proj`` and ``down_proj`` at the layer that runs the block first; its own
    ``gate_up_proj_adapter_list.<hybrid index>`` (A hidden -> rank, B rank -> gate and up)."""
    s, shared = c.spec, c.spec.shared_blocks
    assert shared is not None
    p = f"{c.names.model}.feed_forward"
    total = 0
    if _runs_a_new_block(c, i):
        total += _mlp_bytes(c, i, p, s.intermediate_size, gated=True, bias=s.mlp_bias)
    adapter = f"{p}.gate_up_proj_adapter_list.{_hybrid_index(c, i)}"
    inter = cdiv(s.intermediate_size, c.tp)
    total += c.linear(f"{adapter}.A", s.hidden_size, cdiv(shared.adapter_rank, c.tp))
    return total + c.fused(f"{adapter}.B", shared.adapter_rank, (inter, inter))


def _hybrid_linear_bytes(c: RankWeights, i: int) -> int:
    """A Zamba2 hybrid layer's ``linear`` (hidden -> hidden after the shared block, a
    ``ReplicatedLinear``: whole on every rank)."""
    h = c.spec.hidden_size
    return c.linear(f"{_zamba2_prefix(c, i)}.linear", h, h)


_SHARED_BLOCK_PARTS: list[LayerPart] = [
    ("other", _shared_norms_bytes),
    ("attention", _shared_attention_bytes),
    ("mlp", _shared_mlp_bytes),
    ("other", _hybrid_linear_bytes),
]
"""What a Zamba2 hybrid layer (one that attends) adds to its Mamba decoder layer."""


def cross_attention_bytes(c: RankWeights, i: int) -> int:
    """An encoder-decoder layer's cross-attention (whisper.py ``WhisperCrossAttention``,
    ``encoder_attn``): ``q_proj`` (column-parallel) and ``kv_proj`` (K and V merged,
    column-parallel) from the hidden width, ``out_proj`` (row-parallel) back, each with a
    bias (``out_proj``'s whole on every rank); asked as ``<layer>.encoder_attn.q_proj``."""
    s = c.spec
    h = s.hidden_size
    rows = cdiv(s.num_attention_heads, c.tp) * s.head_dim
    p = c.module(i, (c.names.encoder or EncoderNames()).cross_attention)
    total = c.linear(f"{p}.q_proj", h, rows) + c.fused(f"{p}.kv_proj", h, (rows, rows))
    total += c.linear(f"{p}.out_proj", rows, h)
    return total + c.vec(3 * rows + h)


def encoder_parts(c: RankWeights) -> list[tuple[str, int]]:
    """An encoder-decoder's encoder on a rank (whisper.py ``WhisperEncoder``), as (format,
    bytes): ``conv1`` and ``conv2`` (kernel 3, biased), the position table of
    ``max_source_positions`` rows and the LayerNorms in the model dtype, whole on every
    rank (torch modules); each layer's ``qkv_proj``, ``out_proj``, ``fc1`` and ``fc2``
    (biased) split as the decoder's are, each in the scheme the quantization config gives
    it, asked as vLLM asks (``.encoder.layers.N.layers.self_attn.qkv_proj``: the table's
    ``encoder``, named as the decoder's layers name theirs). Format ``""`` is the model
    dtype."""
    s, e = c.spec, c.spec.encoder
    assert e is not None
    h, tp = s.hidden_size, c.tp
    names = c.names.encoder or EncoderNames()
    head_dim = h // e.num_attention_heads
    q = cdiv(e.num_attention_heads, tp) * head_dim
    kv = max(1, e.num_attention_heads // tp) * head_dim
    inter = cdiv(e.intermediate_size, tp)
    roles = (
        (c.names.qkv or "self_attn.qkv_proj", h, (q, kv, kv)),
        (c.names.o_proj or "self_attn.out_proj", q, (h,)),
        (c.names.up or "mlp.fc1", h, (inter,)),
        (c.names.down or "mlp.fc2", inter, (h,)),
    )
    out: dict[str, int] = {}
    for i in range(e.num_layers):
        for rel, in_f, outs in roles:
            name = f"{names.layer(i)}.{rel}"
            scheme = c.quant.scheme_for(name) if c.quant is not None else None
            fmt = scheme.method if scheme is not None else ""
            out[fmt] = out.get(fmt, 0) + c.fused(name, in_f, outs)
    biases = e.num_layers * (q + 2 * kv + h + inter + h)
    norms = (4 * e.num_layers + 2) * h
    convs = 3 * e.num_mel_bins * h + h + 3 * h * h + h
    plain = biases + norms + convs + e.max_source_positions * h
    out[""] = out.get("", 0) + plain * c.dtype_bytes
    return list(out.items())


def layer_parts(c: RankWeights, i: int) -> list[LayerPart]:
    """Layer ``i``'s parts, each with its module group: the norms, attention (a Zamba2
    hybrid layer's part of the shared blocks instead), the state mixer, the MLP or the
    experts (whose shared experts ``weight_groups`` counts as MLP by their names).
    ``decoder_layer_bytes`` is their sum."""
    s = c.spec
    parts: list[LayerPart] = [("other", _norms_bytes)]
    attends = not s.layer_attention or s.layer_attention[i] != "none" or s.state is None
    if s.shared_blocks is not None:
        parts += _SHARED_BLOCK_PARTS if attends else []
    elif attends:
        parts.append(("attention", attention_bytes))
    if s.encoder is not None:  # whisper.py: encoder_attn after self_attn
        parts.append(("attention", cross_attention_bytes))
    if s.has_state(i):
        parts.append(("mixer", _mixer_bytes))
    if s.per_layer_input_size:
        parts.append(("other", _per_layer_input_bytes))
    if not s.has_mlp(i):
        return parts
    if s.moe is not None and s.layer_moe[i]:
        if s.moe.dense_intermediate_size:
            parts.append(("mlp", _dense_beside_experts_bytes))
        return [*parts, ("experts", _moe_bytes)]
    return [*parts, ("mlp", _dense_mlp_bytes)]


def decoder_layer_bytes(c: RankWeights, i: int) -> int:
    return sum(size(c, i) for _, size in layer_parts(c, i))


def vocab_rows(spec: ModelSpec, tp: int) -> int:
    return round_up(spec.vocab_size, VOCAB_PADDING) // tp


def head_scheme(c: RankWeights) -> QuantSpec | None:
    """The LM head's scheme, or None for the model dtype."""
    lm_head = c.quant is not None and c.quant.lm_head
    return c.quant.scheme_for(c.names.lm_head, lm_head=True) if c.quant and lm_head else None


def head_bytes(c: RankWeights, vocab: int | None = None) -> int:
    rows = round_up(vocab, VOCAB_PADDING) // c.tp if vocab else vocab_rows(c.spec, c.tp)
    q = head_scheme(c)
    if q is not None:
        return q.linear_bytes(c.spec.hidden_size, rows, c.dtype_bytes)
    return rows * c.spec.hidden_size * c.dtype_bytes


def pooling_head_parts(c: RankWeights) -> list[tuple[str, int]]:
    """A pooling run's heads (``ModelSpec.pooling_heads``: pooler, classifier, an MLM or
    projection head), whole on every rank, as (format, bytes): the classifiers in vLLM's
    ``head_dtype`` (float32 unless the config's ``head_dtype`` says otherwise), the rest
    in the model dtype (format ``""``) or their own."""
    out: dict[str, int] = {}
    for t in c.spec.pooling_heads:
        dtype = (c.spec.head_dtype or "float32") if t.dtype == "head" else t.dtype
        fmt = "" if dtype == "model" else dtype
        out[fmt] = out.get(fmt, 0) + t.numel * (DTYPE_BYTES[fmt] if fmt else c.dtype_bytes)
    return list(out.items())


def output_projection_part(c: RankWeights) -> tuple[str, str, int]:
    """The projection of the final hidden state (``ModelSpec.output_projection``:
    EmbeddingGemma2's ``embedding_projection``, a ``ReplicatedLinear`` built with the
    quantization config, whole on every rank) as (module group, format, bytes)."""
    s = c.spec
    name = output_projection(s.architecture) or "embedding_projection"
    scheme = c.quant.scheme_for(name) if c.quant is not None else None
    size = c.linear(name, s.hidden_size, s.output_projection)
    return ("other", scheme.method if scheme is not None else "", size)


def rope_dtype(spec: ModelSpec) -> str:
    """The dtype vLLM keeps the decoder's rotary cache in where it is not the model's
    (gpt-oss and the privacy filter built on its attention: ``get_rope(...,
    dtype=torch.float32)``), as vLLM's own build of the class showed (the names table's
    ``rope_dtype``); "" for the model dtype."""
    built = module_names(spec.architecture).extra.get("built") or {}
    return str(built.get("rope_dtype") or "")


def rope_positions(spec: ModelSpec, max_model_len: int = 0) -> int:
    """The rotary cache's rows: the config's positions, or ``--max-model-len`` where the
    class caps them by it (EmbeddingGemma2's ``min(max_position_embeddings, max_model_len)``,
    embedding_gemma2.py; the names table's probe) and the length is known."""
    positions = spec.rope_cache_positions
    if max_model_len and positions and rope_follows_max_model_len(spec.architecture):
        return min(positions, max_model_len)
    return positions


def rope_cache_bytes(spec: ModelSpec, dtype_bytes: int, max_model_len: int = 0) -> int:
    dtype_bytes = DTYPE_BYTES.get(rope_dtype(spec), dtype_bytes)
    width = sum(spec.rope_widths) or spec.rope_caches * spec.rotary_dim
    return rope_positions(spec, max_model_len) * width * dtype_bytes
