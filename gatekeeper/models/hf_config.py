"""Turn a Hugging Face ``config.json`` (already parsed) into a ``ModelSpec``.

No file or network access. The config is first filled with the defaults of its
transformers config class, as vLLM's ``AutoConfig`` fills it (``config_defaults``; the
catalog's configs are written out whole and read as they are). Multimodal configs nest
the language model in ``text_config``; the vision tower's parameters are counted from
``vision_config``. What vLLM's model class builds (gated MLP, biases, norms) comes from
``architecture``, what each decoder layer is (attention kind, MoE, MLA) from
``layer_kinds``. A missing or invalid field raises ``ModelSpecError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.architecture import architecture_facts
from gatekeeper.models.catalog import find_in_catalog
from gatekeeper.models.config_defaults import ClassDefaults, class_defaults
from gatekeeper.models.config_fields import (
    bad_field,
    check_shapes,
    field_value,
    layer_count,
    normalize,
    positive,
)
from gatekeeper.models.encoder_decoder import decoder_view, with_encoder
from gatekeeper.models.hybrid import ATTENTION_FREE_TYPES, hybrid_layout
from gatekeeper.models.layer_kinds import (
    attention_kinds,
    layer_shapes,
    mla_spec,
    moe_layers,
    mtp_layers,
    per_layer_inputs,
    recurrence_kv_caches,
    sparse_indexer,
)
from gatekeeper.models.module_names import (
    output_projection,
    served_length_cap,
    ties_always,
    ties_head,
)
from gatekeeper.models.pooling_heads import pooling_heads
from gatekeeper.models.quantization import QuantSpec, quant_from_config
from gatekeeper.models.rope import (
    DEFAULT_MAX_LEN,
    LENGTH_KEYS,
    derived_max_len,
    rope_cache,
    rope_widths,
)
from gatekeeper.models.sentence_transformers import PoolingFiles
from gatekeeper.models.spec import (
    DTYPE_BYTES,
    AttentionShape,
    CheckpointWeights,
    ModelSpec,
)
from gatekeeper.models.vision import vision_spec

__all__ = ["apply_overrides", "spec_from_config"]

_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}
_OUTPUT_GATED = frozenset(
    {
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "muse_glimmer_text",
        "hrm_text",
    }
)
"""Models whose attention gates its output by default (``qwen3_next.py``:
``getattr(config, "attn_output_gate", True)``; ``muse_glimmer.py``: ``use_attn_output_gate``,
None is True, an ``output_gate_proj`` of the same heads x head_dim rows; ``hrm_text.py``:
always, the gate merged with q, k and v into ``gqkv_proj``)."""

_FOUR_X_INNER = frozenset({"gpt2", "gpt_bigcode", "gptj", "falcon"})
"""No ``n_inner``: the MLP is 4 x hidden wide (vllm gpt2.py GPT2Block, gpt_j.py; falcon.py
FalconMLP, whatever FalconConfig's ``ffn_hidden_size`` says)."""


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_apply_dict_overrides``: a nested config (``text_config``,
    ``vision_config``: a mapping the config already holds) is updated key by key, any
    other field, dict-valued ones such as ``rope_scaling`` too, is replaced."""
    out = dict(config)
    for key, value in overrides.items():
        current = out.get(key)
        # a sub-config is updated; quantization_config is a plain dict to vLLM: replaced
        nested = key.endswith("_config") and key != "quantization_config"
        if nested and isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = apply_overrides(current, value)
        else:
            out[key] = value
    return out


_TENSOR_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def _dtype(
    top: Mapping[str, Any], text: Mapping[str, Any], checkpoint: CheckpointWeights | None
) -> str:
    """The checkpoint's dtype as vLLM reads it (``ModelArchConfigConvertorBase.get_torch_dtype``):
    the config's, its text or vision config's, else the safetensors tensors' (one dtype all
    cast to), else float32."""
    vision = top.get("vision_config") or {}
    raw = next(
        (c.get(k) for c in (top, text, vision) for k in ("dtype", "torch_dtype") if c.get(k)),
        None,
    )
    if raw is None:
        tensors = checkpoint.tensors if checkpoint else ()
        found = {d for t in tensors if (d := _TENSOR_DTYPES.get(t.dtype))}
        return found.pop() if len(found) == 1 else "float32"
    dtype = _DTYPE_ALIASES.get(str(raw).removeprefix("torch.").lower())
    if dtype is None:
        raise ModelSpecError(
            f"torch_dtype: config.json says {raw!r}; expected one of bfloat16, float16, float32",
            field="torch_dtype",
            value=raw,
        )
    return dtype


def _tied(
    top: Mapping[str, Any],
    text: Mapping[str, Any],
    checkpoint: CheckpointWeights | None,
    architecture: str = "",
) -> bool:
    """``tie_word_embeddings`` (with its class's default filled in; False without one):
    a multimodal wrapper's own, which vLLM copies into its language model's config
    (``VllmConfig.with_hf_config``); untied when the safetensors carry an ``lm_head``
    tensor (``ModelConfig.maybe_untie_word_embeddings``, ``checkpoint_has_lm_head``), or
    when vLLM's class builds a head of its own whatever the config says (the names
    table's ``ties_head``: DeepSeek-V2's ``ParallelLMHead``, Kimi K2.5's language model);
    tied whatever the config says where the class ties unconditionally (``ties_always``:
    Zamba2, Whisper)."""
    if architecture and ties_always(architecture):
        return True
    tied = next((bool(c["tie_word_embeddings"]) for c in (top, text)
                 if c.get("tie_word_embeddings") is not None), False)  # fmt: skip
    if tied and architecture and ties_head(architecture) is False:
        return False
    if tied and checkpoint is not None:
        return not any(t.name.endswith("lm_head.weight") for t in checkpoint.tensors)
    return tied


_HEAD_DTYPES = {"model": "model", "half": "float16", "float16": "float16",
                "float": "float32", "float32": "float32", "bfloat16": "bfloat16"}  # fmt: skip
"""``head_dtype`` as vLLM reads it (``_get_head_dtype``: ``model``, else a name of
``_STR_DTYPE_TO_TORCH_DTYPE``, any case)."""


def _head_dtype(config: Mapping[str, Any]) -> str:
    """The config's ``head_dtype`` (``--hf-overrides '{"head_dtype": "model"}'``), ""
    where it names none."""
    raw = config.get("head_dtype")
    if raw is None:
        return ""
    dtype = _HEAD_DTYPES.get(str(raw).removeprefix("torch.").lower())
    if dtype is None:
        raise bad_field("head_dtype", raw, "expected model, float32, float16 or bfloat16")
    return dtype


def _quant(top: Mapping[str, Any], text: Mapping[str, Any]) -> QuantSpec | None:
    raw = top.get("quantization_config") or text.get("quantization_config")
    if not raw:
        return None
    try:
        return quant_from_config(raw)
    except ValueError as e:
        raise ModelSpecError(
            f"quantization_config: {e}. Size it with an unquantized config and --quantization, "
            "or open an issue with the config",
            field="quantization_config",
            value=raw.get("quant_method"),
        ) from e


def spec_from_config(
    config: Mapping[str, Any],
    *,
    name: str,
    source: str = "",
    checkpoint: CheckpointWeights | None = None,
    declared_parameters: int | None = None,
    reference: str = "",
    overrides: Mapping[str, Any] | None = None,
    pooling: PoolingFiles | None = None,
) -> ModelSpec:
    """Build a ``ModelSpec`` from a parsed ``config.json``, read with its transformers
    config class's defaults, as vLLM reads it; ``overrides`` are ``--hf-overrides``;
    ``pooling`` the sentence-transformers files beside the config, when there are any."""
    if not isinstance(config, Mapping):
        raise ModelSpecError(f"config.json of {name}: expected a JSON object", field="config")
    if overrides:
        config = apply_overrides(config, overrides)
    check_shapes(config)  # before transformers builds per-layer lists from the counts
    filled = _with_defaults(config, name)
    language = _language_model(filled.config)
    language, encoder = decoder_view(language)  # Whisper: its decoder, and its encoder
    check_shapes(language)
    try:
        spec = _read(language, name=name, source=source, checkpoint=checkpoint, pooling=pooling)
    except ModelSpecError as e:
        if not filled.remote_code:
            raise
        raise ModelSpecError(
            f"{e.message}. The model defines its config in remote code ({filled.remote_code}, "
            "auto_map: vllm serve needs --trust-remote-code), which gatekeeper does not run: "
            "it reads such a config as plain JSON, and the remote code defines the field's "
            "default. Add the field to config.json with the value the remote code gives it",
            field=e.field,
            value=e.value,
        ) from e
    spec = with_encoder(spec, encoder) if encoder is not None else spec
    notes: tuple[str, ...] = (filled.note,) if filled.note else ()
    notes += _unsized_towers(filled.config)
    return replace(
        spec,
        declared_parameters=declared_parameters,
        reference=reference,
        notes=(*spec.notes, *notes),
    )


def _unsized_towers(config: Mapping[str, Any]) -> tuple[str, ...]:
    """What vLLM builds and gatekeeper does not size, said in the output: Gemma 4's audio
    tower (``audio_config``, E2B/E4B: ``gemma4_mm.py`` builds ``Gemma4AudioModel``)."""
    if config.get("model_type") == "gemma4" and config.get("audio_config"):
        return (
            "the audio tower (audio_config) is not counted in the weights; vLLM builds it "
            "unless --limit-mm-per-prompt gives audio 0",
        )
    return ()


def _language_model(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The config whose ``text_config`` is the language model vLLM builds, where it sits
    deeper: Qwen2.5-Omni's ``thinker_config`` (transformers' Qwen2_5OmniConfig.get_text_config
    returns the thinker's; vllm qwen2_5_omni_thinker.py builds the thinker, its towers and
    head from it), Bagel's ``llm_config`` (vllm bagel.py builds Qwen2 from it)."""
    if config.get("text_config") or any(config.get(k) for k in _LAYER_KEYS):
        return config
    thinker = config.get("thinker_config")
    if isinstance(thinker, Mapping) and isinstance(thinker.get("text_config"), Mapping):
        # the top level's own fields (architectures, model_type, quantization_config,
        # torch_dtype) over the thinker's; the thinker's Qwen2ForCausalLM ties its head as
        # text_config says, not as the thinker does
        top = {k: v for k, v in config.items() if not k.endswith("_config") or k in _TOP}
        inner = {k: v for k, v in thinker.items() if k != "tie_word_embeddings"}
        return {**inner, **top}
    llm = config.get("llm_config")
    if isinstance(llm, Mapping):
        return {**config, "text_config": llm}
    return config


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_TOP = ("quantization_config",)


def _output_gate(text: Mapping[str, Any], model_type: str) -> bool:
    for key in ("attn_output_gate", "use_attn_output_gate"):  # qwen3_next.py, muse_glimmer.py
        if text.get(key) is not None:
            return bool(text[key])
    return model_type in _OUTPUT_GATED


def _with_defaults(config: Mapping[str, Any], name: str) -> ClassDefaults:
    """The config with its class's defaults; a catalog config as it is, since the catalog
    writes its configs out whole (``tests/models/test_hf_config_defaults.py`` checks that
    the defaults change nothing in them), so that transformers is not imported for it;
    those it marks ``implicit_defaults`` are filled in too."""
    entry = find_in_catalog(name)
    whole = entry is not None and not entry.implicit_defaults and entry.config == config
    if whole and written_out(config):
        return ClassDefaults(dict(config))
    return class_defaults(config)


def written_out(config: Mapping[str, Any]) -> bool:
    """Whether a catalog config names the class defaults its reading depends on: tied
    embeddings, and Llama 4's chunked layers (``no_rope_layers``, which Llama4TextConfig
    derives from ``no_rope_layer_interval``). The catalog leaves no other implicit."""
    text = config.get("text_config") or config
    if "tie_word_embeddings" not in config and "tie_word_embeddings" not in text:
        return False
    return not text.get("attention_chunk_size") or bool(text.get("no_rope_layers"))


def _read(
    config: Mapping[str, Any],
    *,
    name: str,
    source: str,
    checkpoint: CheckpointWeights | None,
    pooling: PoolingFiles | None = None,
) -> ModelSpec:
    text: Mapping[str, Any] = config.get("text_config") or config
    layers = layer_count(text)
    text = normalize(text, layers)
    hidden = positive(
        "hidden_size", field_value(text, "hidden_size", "hidden_size", "n_embd", "d_model")
    )
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    attention_free = model_type in ATTENTION_FREE_TYPES  # Mamba: no heads to read
    heads = positive(
        "num_attention_heads",
        1
        if attention_free
        else field_value(text, "attention heads", "num_attention_heads", "n_head"),
    )
    kv_heads = positive("num_key_value_heads", text.get("num_key_value_heads") or heads)
    mla = mla_spec(text, layers)
    # MLA sizes attention from its own fields; DeepseekV3Config's head_dim is the rotary
    # part (qk_rope_head_dim, read through mla), so the stand-in stays hidden / heads.
    written_head_dim = None if mla else text.get("head_dim")
    head_dim = positive("head_dim", written_head_dim or hidden // heads)
    shapes = () if mla else layer_shapes(text, layers, AttentionShape(head_dim, kv_heads, head_dim))
    # the position tables (rotary cache, learned positions) take the model's own length
    # key, the first of vLLM's length keys present (Whisper's decoder: max_target_positions);
    # the served length is vLLM's smallest of them (derived_max_len)
    declared = field_value(text, "max_position_embeddings", *LENGTH_KEYS, required=False)
    # vLLM: no length key at all means 2048, or --max-model-len as given (Mamba2 configs)
    max_pos = positive(
        "max_position_embeddings", declared if declared is not None else DEFAULT_MAX_LEN
    )
    longest, served_len, len_declared = derived_max_len(
        text, model_type, pooling.max_seq_length if pooling else None
    )
    architecture = (config.get("architectures") or [model_type or "unknown"])[0]
    cap = served_length_cap(str(architecture))  # EmbeddingGemma2: 8,192 (models/config.py)
    served_len = min(served_len, cap) if cap else served_len
    moe, layer_moe = moe_layers(text, layers)
    facts = architecture_facts(text, model_type, max_pos)
    rotary, rope_positions, rope_caches = rope_cache(text, head_dim, mla, max_pos)
    widths = rope_widths(text, shapes, 0 if mla else head_dim)
    if facts.learned_positions:
        rotary, rope_positions, rope_caches = 0, 0, 0  # absolute positions, no rotary cache
    hybrid = hybrid_layout(text, layers, model_type)
    if hybrid is not None and not hybrid.rotary:
        rope_positions = 0  # no rotary cache: these attention layers use no positions
    if hybrid is not None and hybrid.moe is not None and moe is not None:
        layer_moe = hybrid.moe
    dense_inter = (
        text.get("intermediate_size_mlp")
        or (text.get("dense_intermediate_size") if model_type == "minimax_m3_text" else None)
        or text.get("intermediate_size")
        or text.get("ffn_dim")
    )
    if attention_free:
        dense_inter = 0  # Mamba blocks: the mixer only, no MLP
    if dense_inter is None and moe is None:
        dense_inter = text.get("n_inner") or (4 * hidden if model_type in _FOUR_X_INNER else None)
        dense_inter = dense_inter or field_value(
            text, "intermediate_size", "intermediate_size", "ffn_dim"
        )
    head_tensors, head_notes = pooling_heads(config, str(architecture))
    return ModelSpec(
        max_position_declared=len_declared,
        sentence_transformers=pooling is not None and pooling.pooling,
        pooling_max_model_len=pooling.pooling_cap(config, longest) if pooling else None,
        attention_output_gate=_output_gate(text, model_type),
        name=name,
        architecture=str(architecture),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=1 if mla else kv_heads,
        head_dim=head_dim,
        layer_shapes=shapes,
        intermediate_size=int(dense_inter or 0),
        vocab_size=positive(
            "vocab_size",
            field_value(text, "vocab_size", "vocab_size")
            if "vocab_size" in text
            else config.get("vocab_size"),
        ),
        max_position_embeddings=longest,
        served_max_model_len=served_len if served_len != longest else None,
        torch_dtype=_dtype(config, text, checkpoint),
        tie_word_embeddings=_tied(config, text, checkpoint, str(architecture)),
        layer_attention=attention_kinds(text, layers, max_pos, hybrid),
        layer_moe=layer_moe,
        sliding_window=int(text["sliding_window"]) if text.get("sliding_window") else None,
        attention_chunk_size=int(text["attention_chunk_size"])
        if text.get("attention_chunk_size")
        else None,
        mla=mla,
        moe=moe,
        quantization=_quant(config, text),
        gated_mlp=facts.gated_mlp,
        attention_bias=facts.qkv_bias,
        output_bias=facts.output_bias,
        mlp_bias=facts.mlp_bias,
        qk_norm=facts.qk_norm,
        attention_sinks=model_type == "gpt_oss",
        norms_per_layer=facts.norm_vectors,
        rotary_dim=rotary,
        rope_cache_positions=rope_positions,
        rope_caches=rope_caches,
        rope_widths=widths if rope_positions else (),
        **per_layer_inputs(text, model_type, layers),
        # embedding_gemma2.py: ReplicatedLinear(hidden_size, embedding_dim) after the norm
        output_projection=positive("embedding_dim", text.get("embedding_dim"))
        if output_projection(str(architecture))
        else 0,
        **sparse_indexer(text, layers),
        learned_position_embeddings=facts.learned_positions,
        vision=vision_spec(config.get("vision_config"), config, hidden),
        pooling_heads=head_tensors,
        head_dtype=_head_dtype(config),
        notes=head_notes,
        mtp_layers=mtp_layers(text),
        layer_state=hybrid.stateful if hybrid else (),
        layer_mlp=hybrid.mlp if hybrid else (),
        state=hybrid.state if hybrid else None,
        shared_blocks=hybrid.shared if hybrid else None,
        layer_kv_caches=recurrence_kv_caches(text, model_type, layers),
        draft_vocab_size=int(text["draft_vocab_size"]) if text.get("draft_vocab_size") else None,
        checkpoint=checkpoint,
        source=source,
    )


assert set(_DTYPE_ALIASES.values()) <= set(DTYPE_BYTES)
