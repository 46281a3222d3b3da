"""Architecture facts of a model: what the estimator needs, nothing it does not.

A ``ModelSpec`` is built from a Hugging Face ``config.json`` (``hf_config``), from the
embedded catalog (``catalog``) or from the hub (``hub``); it is pure data. Layers are
described one by one (``layer_attention``, ``layer_moe``) because models mix full and
sliding-window attention, dense and MoE MLPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from gatekeeper.models.built_weights import BuiltWeights
from gatekeeper.models.quantization import QuantSpec

__all__ = [
    "DTYPE_BYTES",
    "AttentionKind",
    "AttentionShape",
    "CheckpointTensor",
    "CheckpointWeights",
    "EncoderSpec",
    "HeadTensor",
    "MixerKind",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "SharedBlocks",
    "StateSpec",
    "VisionSpec",
]

AttentionKind = Literal["full", "sliding", "chunked", "none"]
"""Per-layer attention: full causal, sliding window, chunked local (Llama 4), or none
(layers that keep no per-token KV cache)."""

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

MixerKind = Literal["mamba1", "mamba2", "gdn", "short_conv", "linear_attention", "kda"]
"""Sequence mixers that keep a recurrent state per sequence instead of per-token KV:
Mamba-1 (Jamba, Mamba), Mamba-2 (Granite 4.0-H, Falcon-H1, Nemotron-H, Mamba2), gated
delta net (Qwen3-Next, Qwen3.5), short convolution (LFM2), lightning linear attention
(MiniMax-Text-01) and Kimi delta attention (Kimi-Linear)."""


@dataclass(frozen=True, slots=True)
class StateSpec:
    """The recurrent-state mixer of a hybrid or attention-free model (one kind per model),
    with the config fields vLLM's ``MambaStateShapeCalculator`` reads."""

    kind: MixerKind
    intermediate_size: int = 0
    """Mamba's inner width (``expand x hidden``), a short conv's channels."""
    state_size: int = 0
    """Mamba's ``d_state``."""
    conv_kernel: int = 4
    num_heads: int = 0
    """Mamba-2 heads; GDN value heads; linear-attention and KDA heads."""
    head_dim: int = 0
    """Mamba-2 head width; GDN value head width; linear-attention and KDA head width."""
    n_groups: int = 1
    """Mamba-2's B/C groups."""
    num_k_heads: int = 0
    head_k_dim: int = 0
    dt_rank: int = 0
    """Mamba-1's ``dt`` projection rank."""
    ssm_dtype: str | None = None
    """The temporal state's dtype when the model's config sets it (Nemotron-H: float32)."""
    gqa_interleaved: bool = False
    """A gated delta net whose checkpoint fuses ``in_proj_qkvz`` and ``in_proj_ba``,
    interleaved by key-head group (Qwen3-Next: vLLM builds each as one output shard,
    ``gqa_interleaved_layout=True``); Qwen3.5/3.6 ship them apart (four and two shards)."""


@dataclass(frozen=True, slots=True)
class SharedBlocks:
    """Zamba2's shared transformer blocks (vLLM ``zamba2.py``): ``blocks`` attention + MLP
    blocks (``num_mem_blocks``), built once each and run in turn by the hybrid layers (the
    layers that attend), each of which adds its own ``linear`` (hidden -> hidden,
    replicated) and, inside its block, its own LoRA-style adapters of ``adapter_rank``:
    on the MLP's gate/up, and on q, k and v with ``attention_adapters``. A block's
    attention reads the hidden state and the embeddings side by side (``input_size``,
    ``attention_hidden_size``: 2 x hidden); its KV heads are its heads."""

    blocks: int
    input_size: int
    adapter_rank: int
    attention_adapters: bool = False


@dataclass(frozen=True, slots=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek V2/V3): one compressed KV "head" per token."""

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    indexer_head_dim: int = 0
    """The lightning indexer's key width (DeepSeek V3.2, GLM-5: ``index_head_dim``, with
    ``index_topk``); 0 without an indexer."""
    indexer_layers: tuple[int, ...] = ()
    """The layers that build an indexer (every one, but those IndexCache skips:
    ``index_topk_freq``/``index_topk_pattern``, deepseek_v2.py)."""


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One attention layer's heads: what its QKV, its norms and its KV cache are sized by."""

    head_dim: int
    num_kv_heads: int
    v_head_dim: int


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """Mixture of experts: routed experts, optional shared experts, a router."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    """Total intermediate width of the always-on shared expert(s), 0 when none."""
    shared_expert_gate: bool = False
    expert_bias: bool = False
    router_bias: bool = False
    dense_intermediate_size: int = 0
    """A dense MLP each MoE layer runs beside its experts, this wide; 0 when none (Gemma 4:
    ``mlp`` of ``intermediate_size`` beside ``experts`` of ``moe_intermediate_size``)."""
    router_scales: bool = False
    """The router scales its input per dimension and its output per expert (Gemma 4's
    ``router.scale`` and ``router.per_expert_scale``): ``hidden + experts`` more elements."""
    norms: int = 0
    """Norm vectors of hidden width the MoE block adds to its layer (Gemma 4: three)."""
    router_float32: bool = False
    """The router's weight is float32 and it has a float32 routing bias
    (``e_score_correction_bias``) whatever the model dtype (MiniMax-M3's ``GateLinear(...,
    params_dtype=float32)``)."""
    latent_size: int = 0
    """Latent MoE (Nemotron-3 Super's ``moe_latent_size``): the routed experts run this
    wide, between ``fc1_latent_proj`` (hidden -> latent) and ``fc2_latent_proj``
    (latent -> hidden), both replicated; 0 when the experts take the hidden width."""


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """A multimodal model's vision tower and the largest item vLLM profiles with."""

    parameters: int
    """Parameters of the tower and its projector (sharded by TP, on PP stage 0)."""
    hidden_size: int
    intermediate_size: int
    gated: bool
    patches_per_item: int
    """Patches the encoder runs for the largest image the processor accepts."""
    tokens_per_item: int
    """Tokens the language model receives for that image."""
    output_dim: int
    """Width of the encoder features handed to the projector."""
    cross_attention: bool = False
    """The features feed cross-attention layers (Mllama) instead of the context."""
    modalities: tuple[str, ...] = ("image",)
    """What the tower encodes; vLLM builds no tower only when ``--limit-mm-per-prompt``
    gives 0 to every one of them."""
    replicated: bool = False
    """vLLM builds the tower whole on every TP rank, whatever ``--mm-encoder-tp-mode``
    (Gemma 4: transformers' module with every ``nn.Linear`` made a ``ReplicatedLinear``,
    ``recursive_replace_linear``, and a replicated embedder)."""
    built_without_media: bool = False
    """vLLM builds it even when ``--limit-mm-per-prompt`` allows no item of any modality
    (Gemma 4 unified's vision embedder and modality embedders: built outside
    ``_mark_tower_model``, so ``language_model_only`` keeps them)."""
    quantized_linears: tuple[tuple[str, int, int], ...] = ()
    """(vLLM's name, in, out) of its linears built with the quantization config, part of
    ``parameters`` (column-parallel: ``out`` split by TP unless it is whole); the rest
    stays in the model dtype."""


@dataclass(frozen=True, slots=True)
class EncoderSpec:
    """The encoder of an encoder-decoder model (Whisper's audio encoder, vLLM ``whisper.py``
    ``WhisperEncoder``): its layers, built beside the decoder, and the positions it hands
    each decoder layer's cross-attention (``encoder_attn``)."""

    num_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_mel_bins: int
    """Input channels of its first convolution (``conv1``: mel bins -> hidden, kernel 3)."""
    max_source_positions: int
    """Positions it outputs per item (Whisper: 1,500 frames for 30 s of audio), the rows
    of its position table."""


@dataclass(frozen=True, slots=True)
class HeadTensor:
    """One parameter of the heads a pooling class builds beside its encoder (BERT's pooler
    and classifier, an MLM head, SigLIP's text head), whole on every rank."""

    name: str
    """vLLM's name (``bert.pooler.dense.weight``)."""
    numel: int
    dtype: str
    """``head``: vLLM's ``ModelConfig.head_dtype`` (``ModelSpec.head_dtype``); ``model``:
    the model dtype; else a dtype of ``DTYPE_BYTES``."""


@dataclass(frozen=True, slots=True)
class CheckpointTensor:
    """One tensor as a safetensors header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    num_bytes: int


@dataclass(frozen=True, slots=True)
class CheckpointWeights:
    """What the checkpoint files say about the weights.

    ``tensors`` is filled from safetensors headers (exact); when only
    ``model.safetensors.index.json`` is at hand, ``total_bytes`` alone is known.
    """

    total_bytes: int
    tensors: tuple[CheckpointTensor, ...] = ()
    source: str = ""

    def bytes_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.num_bytes
        return out


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything about a model that decides its memory under vLLM."""

    name: str
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    """The longest ``--max-model-len`` vLLM accepts, as it derives it from the config
    (``models/rope.py``: the smallest length key, RoPE scaling, a sentence-transformers
    ``max_seq_length``); also the length it serves at by default, unless
    ``served_max_model_len`` says otherwise."""
    torch_dtype: str
    tie_word_embeddings: bool = False
    served_max_model_len: int | None = None
    """The length vLLM serves at without ``--max-model-len`` where it is below
    ``max_position_embeddings`` (LongRoPE: ``original_max_position_embeddings``)."""
    pooling_max_model_len: int | None = None
    """The tokenizer's ``model_max_length`` where it caps the length of this model run as
    a pooling model (absolute positions; ``sentence_transformers.PoolingFiles.pooling_cap``);
    ``for_runner`` applies it."""
    sentence_transformers: bool = False
    """A ``modules.json`` beside the config names a sentence-transformers Pooling module:
    vLLM's auto runner then serves even a ``*ForCausalLM`` as a pooling model, without
    its LM head (``ModelConfig._get_default_runner_type``, ``get_pooling_config``)."""
    v_head_dim: int | None = None
    layer_shapes: tuple[AttentionShape, ...] = ()
    """Each layer's heads where layers differ (transformers' ``per_layer_config``: Gemma 4's
    global layers have ``global_head_dim`` and ``num_global_key_value_heads``); empty when
    every layer has ``head_dim`` and ``num_kv_heads``. ``attention_shape(i)`` reads it."""
    layer_attention: tuple[AttentionKind, ...] = ()
    layer_moe: tuple[bool, ...] = ()
    layer_state: tuple[bool, ...] = ()
    """Layers with a recurrent-state mixer (``state``); empty for pure attention models. A
    layer can have both attention and a state (Falcon-H1's parallel hybrid)."""
    layer_mlp: tuple[bool, ...] = ()
    """Layers with an MLP or MoE block; empty means every layer (Mamba blocks and
    Nemotron-H's M and * layers have none)."""
    state: StateSpec | None = None
    shared_blocks: SharedBlocks | None = None
    """Zamba2's shared transformer blocks, run by the layers that attend; None elsewhere."""
    layer_kv_caches: tuple[int, ...] = ()
    """KV caches each layer keeps where it is not one per attending layer: HRM-Text runs
    its layers once per recurrence step, each step with a cache of its own (``hrm_text.py``
    ``attn_per_step``); empty: one."""
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    quantization: QuantSpec | None = None
    gated_mlp: bool = True
    attention_bias: bool = False
    output_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attention_output_gate: bool = False
    """q_proj also projects a per-head output gate (Qwen3-Next, Qwen3.5): twice q's rows."""
    max_position_declared: bool = True
    """The config names a maximum length; when it does not, vLLM assumes 2048 unless
    ``--max-model-len`` is given, which it then takes as it is."""
    attention_sinks: bool = False
    indexer_head_dim: int = 0
    """MiniMax-M3's block-sparse attention: ``qkv_proj`` also projects the lightning
    indexer's q (one head of this width per KV head, sharded like K and V) and k (one
    head, replicated), each with a norm, in the layers of ``layer_indexer``."""
    layer_indexer: tuple[bool, ...] = ()
    norms_per_layer: int = 2
    rotary_dim: int = 0
    rope_cache_positions: int = 0
    rope_caches: int = 1
    per_layer_input_size: int = 0
    """Per-layer embeddings (Gemma 4's ``hidden_size_per_layer_input``, E2B/E4B): a
    ``per_layer_input_vocab x (layers x size)`` table and its projection from the hidden
    state, and in every layer a gate and a projection of this width; 0 when none."""
    per_layer_input_vocab: int = 0
    output_projection: int = 0
    """The width the class projects the final hidden state to after the norm, where it
    does (EmbeddingGemma2's ``embedding_projection``, hidden -> ``embedding_dim``: a
    replicated linear on the last stage); 0 when none."""
    kv_shared_layers: int = 0
    """The last layers that read an earlier layer's KV instead of their own (Gemma 4's
    ``num_kv_shared_layers``): attention of q_proj and o_proj only, no KV cache."""
    double_wide_mlp: bool = False
    """Those KV-shared layers' MLP is twice ``intermediate_size`` (``use_double_wide_mlp``)."""
    rope_widths: tuple[int, ...] = ()
    """Each rotary cache's width where the caches differ (Gemma 4: the sliding layers'
    ``head_dim``, the global layers' ``global_head_dim``); empty: ``rope_caches`` caches of
    ``rotary_dim``."""
    learned_position_embeddings: int = 0
    """Rows of a learned absolute position table (OPT, GPT-2), 0 for rotary models."""
    vision: VisionSpec | None = None
    encoder: EncoderSpec | None = None
    """An encoder-decoder's encoder (Whisper); every decoder layer then has a cross-attention
    reading it. None for decoder-only models."""
    plain_embedding: bool = False
    """The token embedding is a torch ``nn.Embedding`` (Whisper's decoder): the vocabulary
    unpadded and whole on every TP rank, and the tied head shares it."""
    pooling_heads: tuple[HeadTensor, ...] = ()
    """The heads vLLM's pooling class builds beside the encoder and its LM head, when it
    is one (``models/pooling_heads.py``); held on the last stage of a pooling run."""
    head_dtype: str = ""
    """The config's ``head_dtype`` (``model`` or a dtype), where it names one; vLLM
    holds a pooling model's head in float32 otherwise."""
    mtp_layers: int = 0
    """Multi-token-prediction layers the checkpoint ships (``num_nextn_predict_layers``):
    loaded only when ``--speculative-config`` asks for MTP."""
    draft_vocab_size: int | None = None
    """An EAGLE-3 head's own, smaller vocabulary (its lm_head rows), when it has one."""
    checkpoint: CheckpointWeights | None = None
    built: BuiltWeights | None = None
    """The weights as an installed vLLM built this model (``--weights-from vllm``); used
    where its TP size, dtype and quantization are the estimate's."""
    config_path: str = ""
    """The ``config.json`` this spec was read from, when it was read from a file (a local
    checkpoint or a cache snapshot; empty for the catalog and the hub's memory)."""
    declared_parameters: int | None = None
    source: str = ""
    reference: str = ""
    """What ``vllm serve`` is given for this model: a checkpoint directory's absolute path,
    or the repo id (``name``) when empty."""
    notes: tuple[str, ...] = field(default=())

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.torch_dtype]

    def for_runner(self, pooling: bool) -> ModelSpec:
        """The spec as vLLM sees it under the resolved runner: a pooling run takes the
        tokenizer's cap (``ModelConfig.get_and_verify_max_len``), a generating one not."""
        cap = self.pooling_max_model_len
        if not pooling or cap is None:
            return self
        served = self.served_max_model_len
        return replace(
            self,
            max_position_embeddings=cap,
            served_max_model_len=served if served is not None and served < cap else None,
        )

    @property
    def default_max_model_len(self) -> int:
        """The length vLLM serves at when ``--max-model-len`` is not given."""
        return self.served_max_model_len or self.max_position_embeddings

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    @property
    def serve_reference(self) -> str:
        return self.reference or self.name

    def attention_shape(self, i: int) -> AttentionShape:
        """Layer ``i``'s heads (the model's own unless ``layer_shapes`` says otherwise)."""
        if self.layer_shapes:
            return self.layer_shapes[i]
        return AttentionShape(self.head_dim, self.num_kv_heads, self.value_head_dim)

    def reads_shared_kv(self, i: int) -> bool:
        """Layer ``i`` reads an earlier layer's KV (``kv_shared_layers``)."""
        return self.kv_shared_layers > 0 and i >= self.num_layers - self.kv_shared_layers

    def has_state(self, i: int) -> bool:
        return bool(self.layer_state) and self.layer_state[i]

    def kv_caches(self, i: int) -> int:
        """KV caches layer ``i`` keeps when it attends (``layer_kv_caches``)."""
        return self.layer_kv_caches[i] if self.layer_kv_caches else 1

    def has_mlp(self, i: int) -> bool:
        return not self.layer_mlp or self.layer_mlp[i]

    @property
    def vision_parameters(self) -> int:
        return self.vision.parameters if self.vision is not None else 0
