"""KV cache layout, capacity and vLLM's max_model_len check, per GPU rank.

Page size per layer and token (``v1/kv_cache_interface.py``):

- full / sliding / chunked attention: ``kv_heads_rank * (head_dim + v_head_dim) * b_kv``
  with ``kv_heads_rank = max(1, kv_heads // tp)`` (heads replicate past ``tp = kv_heads``);
- MLA: ``(kv_lora_rank + qk_rope_head_dim) * b_kv`` on every rank (not divided by TP);
  ``fp8_ds_mla`` packs a token into 656 bytes. vLLM V0 aligned each MLA entry to 256 bytes.
  A class that sizes MLA's projections around a plain ``Attention`` (MiniCPM3) keeps K and
  V of every head instead: ``heads_rank * 2 * (qk_nope_head_dim + qk_rope_head_dim) * b_kv``
  (V zero-padded to K's width, ``minicpm3.py``).

Layers with their own heads (``ModelSpec.attention_shape``: Gemma 4's global layers) have
their own page. Where pages differ, vLLM's hybrid allocator makes them equal
(``unify_kv_cache_spec_page_size``): a layer whose page divides the largest holds that many
times more tokens per block (``KvGroup.scale``), any other is padded to it; with one kind
of layer only (or the hybrid allocator off) the layers form one group whose block holds
every layer's page (``UniformTypeKVCacheSpecs``).

A layer that runs more than once per token with a cache per run (HRM-Text's recurrence
steps, ``ModelSpec.kv_caches``) counts as that many attention layers here.

Layers are grouped as vLLM's hybrid allocator does: identical layers form one group;
full and sliding-window layers with equal page sizes are bucketed and split into
groups of ``g`` layers, all groups sharing one pool of blocks. Then
``bytes_per_block = g * page * block_size``, ``num_blocks = floor(KV / bytes_per_block)``,
and one request of length L needs ``cdiv(L, bs)`` blocks per full group and
``cdiv(min(W - 1 + in_flight, L), bs) + 1`` per sliding group. vLLM refuses to start when
``bytes_per_block * blocks_per_request(L) > KV - bytes_per_block``.

Worked example: Llama-3.1-8B, bf16 KV, TP=1, bs=16: 32 layers x 2 x 8 x 128 x 2 B =
131,072 B/token, 2 MiB/block; 58.11 GiB of KV -> 29,751 blocks -> 476,016 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gatekeeper.estimator.options import KvDtype, latent_kv_cache
from gatekeeper.models.spec import AttentionKind, ModelSpec
from gatekeeper.units import cdiv, round_up

__all__ = [
    "KvGroup",
    "KvLayout",
    "KvOptions",
    "StatePages",
    "indexer_bytes_per_token",
    "kv_layout",
    "page_bytes_per_token",
]

FP8_DS_MLA_BYTES = 656
_PER_REQUEST = ("state", "cross")
"""Groups whose blocks a request holds whatever its length: recurrent state, and the
encoder positions of cross-attention."""
CacheKind = AttentionKind | Literal["cross"]


@dataclass(frozen=True, slots=True)
class KvGroup:
    kind: AttentionKind | Literal["state", "cross"]
    window: int | None
    """The window of sliding or chunked layers; for cross-attention, the encoder positions
    a request holds (``KvOptions.encoder_tokens``)."""
    scale: int = 1
    """Tokens per block as a multiple of the layout's block size: a layer whose page is
    smaller than the largest holds that many times more tokens in its block."""


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How one rank's KV cache is cut into blocks."""

    block_size: int
    layers_per_group: int
    page_bytes_per_token: int
    """Bytes one token takes in one layer."""
    groups: tuple[KvGroup, ...]
    extra_bytes_per_token: int = 0
    """A speculative drafter's layers (their pages per token, all layers), which join
    the blocks of the target's first group: one shared pool."""
    dcp: int = 1
    """Decode context parallelism: each rank of a DCP group holds every dcp-th token of
    full-attention layers (``cdiv(L, dcp)`` tokens per request)."""
    state_page_bytes: int = 0
    """A state layer's page when no layer attends (pure Mamba): one sequence's state."""
    state_blocks: int = 1
    """Blocks one request holds in each state group: 1 (+ draft tokens), or 2 (+ draft
    tokens) when prefix caching keeps an aligned copy (``mamba_cache_mode`` align)."""
    state_bytes_per_sequence: int = 0
    """The recurrent state one sequence holds on this rank, every state layer (unpadded)."""

    @property
    def bytes_per_block(self) -> int:
        if not self.page_bytes_per_token:
            return self.layers_per_group * self.state_page_bytes
        per_token = self.layers_per_group * self.page_bytes_per_token + self.extra_bytes_per_token
        return per_token * self.block_size

    @property
    def bytes_per_token_all_layers(self) -> int:
        """Bytes one token takes across the rank's attention layers (state layers keep a
        fixed state per sequence instead)."""
        page, g = self.page_bytes_per_token, self.layers_per_group
        groups = sum(
            g * page // group.scale for group in self.groups if group.kind not in _PER_REQUEST
        )
        return groups + self.extra_bytes_per_token

    def blocks_per_request(self, length: int, in_flight_tokens: int) -> int:
        total = 0
        for group in self.groups:
            bs = self.block_size * group.scale
            if group.kind == "state":
                total += self.state_blocks
            elif group.kind == "cross":  # the encoder's positions, whatever the length
                total += cdiv(group.window or 0, bs)
            elif group.kind == "sliding" and group.window:
                total += cdiv(min(group.window - 1 + in_flight_tokens, length), bs) + 1
            elif group.kind == "chunked" and group.window:
                total += cdiv(min(group.window + in_flight_tokens, length), bs)
            else:
                total += cdiv(cdiv(length, self.dcp), bs)
        return total

    def num_blocks(self, kv_bytes: int) -> int:
        return max(0, kv_bytes // self.bytes_per_block) if self.groups else 0

    def fits(self, kv_bytes: int, length: int, in_flight_tokens: int) -> bool:
        check = kv_bytes - self.bytes_per_block
        return self.bytes_per_block * self.blocks_per_request(length, in_flight_tokens) <= check

    def max_length(self, kv_bytes: int, limit: int, in_flight_tokens: int) -> int:
        """Largest length in [0, limit] whose request fits (vLLM's binary search)."""
        if not self.groups:
            return limit
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fits(kv_bytes, mid, in_flight_tokens):
                lo = mid
            else:
                hi = mid - 1
        return lo


def page_bytes_per_token(
    spec: ModelSpec, tp: int, kv: KvDtype, *, mla_align: int = 0, layer: int | None = None
) -> int:
    """Bytes of KV one token takes in one attention layer (``layer``'s own heads when given)
    on one rank."""
    if spec.mla is not None and latent_kv_cache(spec):
        if kv.name == "fp8_ds_mla":
            return FP8_DS_MLA_BYTES
        width = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
        raw = width * kv.numerator // kv.denominator + kv.per_head_extra_bytes
        return round_up(raw, mla_align) if mla_align else raw
    if spec.mla is not None:  # minicpm3.py: Attention(heads, qk_head_dim, num_kv_heads=heads)
        heads = max(1, spec.num_attention_heads // tp)
        width = 2 * (spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim)
        return heads * (width * kv.numerator // kv.denominator + kv.per_head_extra_bytes)
    shape = spec.attention_shape(layer) if layer is not None else None
    kv_heads = shape.num_kv_heads if shape else spec.num_kv_heads
    heads = max(1, kv_heads // tp)
    width = shape.head_dim + shape.v_head_dim if shape else spec.head_dim + spec.value_head_dim
    return heads * (width * kv.numerator // kv.denominator + kv.per_head_extra_bytes)


def _group_size(bucket_sizes: list[int]) -> int:
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < 1.5 * smallest else smallest


@dataclass(frozen=True, slots=True)
class StatePages:
    """What the state layers of a hybrid or attention-free model put in the KV pool."""

    bytes_per_sequence: int
    """One state layer's state for one sequence on one rank (``estimate.state``)."""
    blocks_per_request: int
    """1 + draft tokens; 2 + draft tokens with prefix caching (``mamba_cache_mode`` align)."""
    max_model_len: int
    """Tokens a state block stands for when no layer attends (vLLM's mamba_block_size)."""


@dataclass(frozen=True, slots=True)
class KvOptions:
    """What shapes one rank's KV cache besides the model: the serving options and the
    vLLM release's rules, as ``kv_layout`` reads them."""

    tp: int
    kv: KvDtype
    block_size: int
    hybrid: bool
    """vLLM's hybrid allocator is on: layers of different kinds form separate groups."""
    mla_align: int = 0
    """MLA entries aligned to this many bytes (vLLM V0: 256); 0, unaligned."""
    extra_bytes_per_token: int = 0
    """A speculative drafter's pages per token (``KvLayout.extra_bytes_per_token``)."""
    dcp: int = 1
    state: StatePages | None = None
    """The state layers' pages, for a model with recurrent state; None, attention only."""
    encoder_tokens: int = 0
    """Encoder positions each request's cross-attention holds in vLLM's accounting
    (``CrossAttentionSpec.max_memory_usage_bytes``: ``max_num_encoder_input_tokens``, which
    ``SchedulerConfig`` sets to ``max_num_batched_tokens``); 0 without cross-attention."""
    chunked_hybrid: bool = False
    """The hybrid allocator stays on for chunked-local attention (vLLM 0.32 on); else
    chunked layers turn it off."""


def kv_layout(spec: ModelSpec, layers: range, options: KvOptions) -> KvLayout:
    """Group the attention (and recurrent-state) layers of one pipeline stage the way
    vLLM does."""
    state = options.state
    states = [i for i in layers if spec.has_state(i)] if state is not None else []
    if states and state is not None:
        layout = _hybrid(spec, layers, len(states), options, state)
    else:
        layout = _grouped(spec, layers, options)
    extra = options.extra_bytes_per_token
    if not layout.groups and extra:
        layout = KvLayout(
            options.block_size, 0, layout.page_bytes_per_token, (KvGroup("full", None),)
        )
    return replace(layout, extra_bytes_per_token=extra, dcp=options.dcp)


KERNEL_BLOCK_ALIGNMENT = 16
"""The attention backends' smallest kernel block (FlashAttention: multiples of 16)."""
MLA_HYBRID_ALIGNMENT = 128


def _hybrid(
    spec: ModelSpec, layers: range, n_state: int, options: KvOptions, state: StatePages
) -> KvLayout:
    """vLLM's hybrid layout (``platforms/interface.py::_align_hybrid_block_size``): the
    attention block grows until one attention page holds a state page, the state page is
    padded to it, and state layers form groups like any other kind; with no attention
    layer at all, each sequence's state is one block of max_model_len tokens."""
    block_size = options.block_size
    page = page_bytes_per_token(spec, options.tp, options.kv, mla_align=options.mla_align)
    kinds = [
        spec.layer_attention[i]
        for i in layers
        if spec.layer_attention[i] != "none"
        for _ in range(spec.kv_caches(i))
    ]
    per_sequence = n_state * state.bytes_per_sequence
    if not kinds:
        return KvLayout(
            state.max_model_len, n_state, 0, (KvGroup("state", None),),
            state_page_bytes=state.bytes_per_sequence, state_blocks=state.blocks_per_request,
            state_bytes_per_sequence=per_sequence,
        )  # fmt: skip
    align = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    if latent_kv_cache(spec):
        align = max(align, MLA_HYBRID_ALIGNMENT)
    aligned = align * cdiv(state.bytes_per_sequence, align * page)
    aligned = KERNEL_BLOCK_ALIGNMENT * cdiv(aligned, KERNEL_BLOCK_ALIGNMENT)
    bs = max(block_size, aligned)
    windows = {"sliding": spec.sliding_window, "chunked": spec.attention_chunk_size, "full": None}
    buckets: dict[str, int] = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
    buckets["state"] = n_state
    g = _group_size(list(buckets.values()))
    groups = tuple(
        KvGroup(kind, windows.get(kind))  # type: ignore[arg-type]
        for kind, n in buckets.items()
        for _ in range(cdiv(n, g))
    )
    return KvLayout(
        bs, g, page, groups, state_blocks=state.blocks_per_request,
        state_bytes_per_sequence=per_sequence,
    )  # fmt: skip


def _grouped(spec: ModelSpec, layers: range, options: KvOptions) -> KvLayout:
    block_size = options.block_size
    page = page_bytes_per_token(spec, options.tp, options.kv, mla_align=options.mla_align)
    # a layer reading an earlier layer's KV keeps no cache of its own (vLLM gives it no
    # KV-cache spec: gpu_model_runner's shared_kv_cache_layers)
    # HRM-Text's layers keep a cache per recurrence step they run at (``kv_caches``)
    attending = [
        i
        for i in layers
        if spec.layer_attention[i] != "none" and not spec.reads_shared_kv(i)
        for _ in range(spec.kv_caches(i))
    ]
    if not attending:
        return KvLayout(block_size, 0, page, ())
    kinds: list[CacheKind] = [spec.layer_attention[i] for i in attending]
    pages = [_layer_page(spec, options, i) for i in attending]
    if spec.encoder is not None:  # whisper.py: each layer's encoder_attn, a CrossAttentionSpec
        cross: list[CacheKind] = ["cross"] * len(kinds)
        kinds, pages = kinds + cross, pages + pages
    windows = {"sliding": spec.sliding_window, "chunked": spec.attention_chunk_size, "full": None}
    windows["cross"] = options.encoder_tokens
    distinct = sorted(set(kinds))
    # Before 0.32 vLLM turned the hybrid allocator off for chunked-local attention.
    chunked_off = "chunked" in distinct and not options.chunked_hybrid
    if len(distinct) == 1 or not options.hybrid or chunked_off:
        kind = distinct[0] if len(distinct) == 1 else "full"
        group = (KvGroup(kind, windows.get(kind)),)
        if len(set(pages)) == 1:
            return KvLayout(block_size, len(kinds), pages[0], group)
        return KvLayout(block_size, 1, sum(pages), group)  # one block: every layer's page
    buckets: dict[tuple[CacheKind, int], int] = {}
    for key in zip(kinds, pages, strict=True):
        buckets[key] = buckets.get(key, 0) + 1
    top = max(pages)
    g = _group_size(list(buckets.values()))
    groups = tuple(
        KvGroup(kind, windows.get(kind), top // p if top % p == 0 else 1)
        for (kind, p), n in sorted(buckets.items())
        for _ in range(cdiv(n, g))
    )
    return KvLayout(block_size, g, top, groups)


def _layer_page(spec: ModelSpec, options: KvOptions, i: int) -> int:
    kv, align = options.kv, options.mla_align
    page = page_bytes_per_token(spec, options.tp, kv, mla_align=align, layer=i)
    return page + indexer_bytes_per_token(spec, i)


INDEXER_QUANT_BLOCK = 128
"""The lightning indexer's FP8 keys carry a float32 scale per this many values
(deepseek_v2.py ``Indexer.quant_block_size``)."""


def indexer_bytes_per_token(spec: ModelSpec, layer: int) -> int:
    """Bytes of the lightning indexer's key cache one token takes in ``layer``, on every
    rank (DeepSeek V3.2, GLM-5: ``DeepseekV32IndexerCache``, an ``MLAAttentionSpec`` of one
    head of ``index_head_dim`` FP8 values and their scales, uint8, whatever
    ``--kv-cache-dtype`` says); 0 in a layer without one. A multi-token-prediction layer
    (``layer`` past the decoder's) always builds one (deepseek_v2.py: ``is_mtp_layer``).
    vLLM holds it beside the latent cache in the same KV-cache group
    (``UniformTypeKVCacheSpecs``: a block is every layer's pages), so it adds to the
    layer's page."""
    mla = spec.mla
    if mla is None or not mla.indexer_head_dim:
        return 0
    if layer < spec.num_layers and layer not in mla.indexer_layers:
        return 0
    d = mla.indexer_head_dim
    return d + d // INDEXER_QUANT_BLOCK * 4
