"""Turn a Hugging Face ``config.json`` (already parsed) into a ``ModelSpec``.

No file or network access. The config is first filled with the defaults of its
transformers config class, as vLLM's ``AutoConfig`` fills it (``config_defaults``; the
catalog's configs are written out whole and read as they are). Multimodal configs nest
the language model in ``text_config``; the vision tower's parameters are counted from
``vision_config``. What vLLM's model class builds (gated MLP, biases, norms) comes from
``architecture``. A missing or invalid field raises ``ModelSpecError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.architecture import architecture_facts
from gatekeeper.models.catalog import find_in_catalog
from gatekeeper.models.config_defaults import ClassDefaults, class_defaults
from gatekeeper.models.config_fields import bad_field, check_shapes, normalize
from gatekeeper.models.hybrid import ATTENTION_FREE_TYPES, HybridLayout, hybrid_layout
from gatekeeper.models.quantization import QuantSpec, quant_from_config
from gatekeeper.models.rope import DEFAULT_MAX_LEN, LENGTH_KEYS, derived_max_len, rope_cache
from gatekeeper.models.sentence_transformers import PoolingFiles
from gatekeeper.models.spec import (
    DTYPE_BYTES,
    AttentionKind,
    CheckpointWeights,
    MlaSpec,
    ModelSpec,
    MoeSpec,
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
    {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
)
"""Models whose attention gates its output by default (``qwen3_next.py``:
``getattr(config, "attn_output_gate", True)``)."""

_FOUR_X_INNER = frozenset({"gpt2", "gpt_bigcode", "gptj"})
"""No ``n_inner``: the MLP is 4 x hidden wide (vllm gpt2.py GPT2Block, gpt_j.py)."""


def _get(cfg: Mapping[str, Any], name: str, *keys: str, required: bool = True) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    if required:
        raise ModelSpecError(
            f"{name}: config.json has none of {', '.join(keys)}; this field is needed to size "
            "the model. Give a complete config.json or a model from the catalog "
            "(gatekeeper models lists them)",
            field=keys[0],
        )
    return None


def _positive(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number <= 0 or isinstance(value, bool):
        raise ModelSpecError(
            f"{name}: config.json says {value!r}; it must be a positive integer. "
            "Fix the config or use a catalog model",
            field=name,
            value=value,
        )
    return number


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


def _mtp_layers(text: Mapping[str, Any]) -> int:
    """Multi-token-prediction layers a checkpoint ships (DeepSeek V3, GLM-4.5, Qwen3-Next)."""
    keys = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
    value = _get(text, "mtp_layers", *keys, required=False)
    return int(value) if isinstance(value, int) and value > 0 else 0


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


def _layer_attention(
    cfg: Mapping[str, Any], layers: int, max_pos: int
) -> tuple[AttentionKind, ...]:
    types = cfg.get("layer_types")
    if types and len(types) != layers:
        # transformers' layer_type_validation (configuration_utils.py) refuses it so
        raise bad_field("layer_types", types, f"expected one entry for each of {layers} layers")
    if types:
        mapping: dict[str, AttentionKind] = {
            "full_attention": "full",
            "sliding_attention": "sliding",
            "chunked_attention": "chunked",
        }
        return tuple(mapping.get(str(t), "none") for t in types)
    model_type = str(cfg.get("model_type", ""))
    window = cfg.get("sliding_window")
    if cfg.get("attention_chunk_size") and cfg.get("no_rope_layers"):
        flags = cfg["no_rope_layers"]
        if len(flags) < layers:
            raise bad_field("no_rope_layers", flags, f"expected a 0/1 for each of {layers} layers")
        return tuple("chunked" if flags[i] else "full" for i in range(layers))
    if model_type == "gemma2" and window:
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(layers))
    if model_type in ("gemma3", "gemma3_text") and window:
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers))
    uses_window = cfg.get("use_sliding_window", True) is not False
    if window and uses_window and int(window) < max_pos:
        return tuple("sliding" for _ in range(layers))
    return tuple("full" for _ in range(layers))


def _attention_kinds(
    cfg: Mapping[str, Any], layers: int, max_pos: int, hybrid: HybridLayout | None
) -> tuple[AttentionKind, ...]:
    kinds = _layer_attention(cfg, layers, max_pos)
    return hybrid.attention_kinds(kinds) if hybrid is not None else kinds


def _moe(cfg: Mapping[str, Any], layers: int) -> tuple[MoeSpec | None, tuple[bool, ...]]:
    experts = _get(
        cfg, "experts", "num_local_experts", "num_experts", "n_routed_experts", required=False
    )
    if not experts:
        return None, tuple(False for _ in range(layers))
    per_token = _positive(
        "num_experts_per_tok",
        _get(cfg, "experts per token", "num_experts_per_tok", "experts_per_token", "top_k_experts"),
    )
    inter = _positive(
        "moe_intermediate_size",
        _get(
            cfg,
            "expert size",
            "moe_intermediate_size",
            "expert_intermediate_size",
            "intermediate_size",
        ),
    )
    shared = int(cfg.get("n_shared_experts") or 0) * inter
    shared = shared or int(cfg.get("shared_expert_intermediate_size") or 0)
    model_type = str(cfg.get("model_type", ""))
    if model_type.startswith("llama4"):
        shared = inter
    moe = MoeSpec(
        num_experts=_positive("num_experts", experts),
        experts_per_token=per_token,
        expert_intermediate_size=inter,
        shared_intermediate_size=shared,
        shared_expert_gate=bool(cfg.get("shared_expert_intermediate_size")),
        expert_bias=model_type == "gpt_oss",
        router_bias=model_type == "gpt_oss",
    )
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list) and len(freq) != layers:
        raise bad_field("moe_layer_freq", freq, f"expected a 0/1 for each of {layers} layers")
    return moe, tuple(_is_moe_layer(cfg, i) for i in range(layers))


def _is_moe_layer(cfg: Mapping[str, Any], i: int) -> bool:
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list):  # per layer, 0/1 (vllm transformers_utils/configs/minimax_m3.py)
        return bool(freq[i])
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        first = int(cfg.get("first_k_dense_replace") or 0)
        return i >= first and i % int(freq or 1) == 0
    if "interleave_moe_layer_step" in cfg:
        return (i + 1) % int(cfg.get("interleave_moe_layer_step") or 1) == 0
    if "decoder_sparse_step" in cfg or "mlp_only_layers" in cfg:
        step = int(cfg.get("decoder_sparse_step") or 1)
        return i not in (cfg.get("mlp_only_layers") or []) and (i + 1) % step == 0
    return True


def _mla(cfg: Mapping[str, Any]) -> MlaSpec | None:
    if not cfg.get("kv_lora_rank"):
        return None
    return MlaSpec(
        kv_lora_rank=_positive("kv_lora_rank", cfg["kv_lora_rank"]),
        q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
        qk_nope_head_dim=_positive("qk_nope_head_dim", cfg.get("qk_nope_head_dim")),
        qk_rope_head_dim=_positive("qk_rope_head_dim", cfg.get("qk_rope_head_dim")),
        v_head_dim=_positive("v_head_dim", cfg.get("v_head_dim")),
    )


def _tied(
    top: Mapping[str, Any], text: Mapping[str, Any], checkpoint: CheckpointWeights | None
) -> bool:
    """``tie_word_embeddings`` (with its class's default filled in; False without one):
    a multimodal wrapper's own, which vLLM copies into its language model's config
    (``VllmConfig.with_hf_config``); untied when the safetensors carry an ``lm_head``
    tensor (``ModelConfig.maybe_untie_word_embeddings``, ``checkpoint_has_lm_head``)."""
    tied = next((bool(c["tie_word_embeddings"]) for c in (top, text)
                 if c.get("tie_word_embeddings") is not None), False)  # fmt: skip
    if tied and checkpoint is not None:
        return not any(t.name.endswith("lm_head.weight") for t in checkpoint.tensors)
    return tied


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
    check_shapes(filled.config)
    try:
        spec = _read(
            filled.config, name=name, source=source, checkpoint=checkpoint, pooling=pooling
        )
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
    notes = (filled.note,) if filled.note else ()
    return replace(
        spec,
        declared_parameters=declared_parameters,
        reference=reference,
        notes=(*spec.notes, *notes),
    )


def _with_defaults(config: Mapping[str, Any], name: str) -> ClassDefaults:
    """The config with its class's defaults; a catalog config as it is, since the catalog
    writes its configs out whole (``tests/models/test_hf_config_defaults.py`` checks that
    the defaults change nothing in them), so that transformers is not imported for it."""
    entry = find_in_catalog(name)
    if entry is not None and entry.config == config and written_out(config):
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
    layers = _positive(
        "num_hidden_layers", _get(text, "layers", "num_hidden_layers", "n_layer", "num_layers")
    )
    text = normalize(text, layers)
    hidden = _positive("hidden_size", _get(text, "hidden_size", "hidden_size", "n_embd", "d_model"))
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    attention_free = model_type in ATTENTION_FREE_TYPES  # Mamba: no heads to read
    heads = _positive(
        "num_attention_heads",
        1 if attention_free else _get(text, "attention heads", "num_attention_heads", "n_head"),
    )
    kv_heads = _positive("num_key_value_heads", text.get("num_key_value_heads") or heads)
    mla = _mla(text)
    # MLA sizes attention from its own fields; DeepseekV3Config's head_dim is the rotary
    # part (qk_rope_head_dim, read through mla), so the stand-in stays hidden / heads.
    written_head_dim = None if mla else text.get("head_dim")
    head_dim = _positive("head_dim", written_head_dim or hidden // heads)
    # the position tables (rotary cache, learned positions) take the model's own length
    # key, the first of vLLM's length keys present (Whisper's decoder: max_target_positions);
    # the served length is vLLM's smallest of them (derived_max_len)
    declared = _get(text, "max_position_embeddings", *LENGTH_KEYS, required=False)
    # vLLM: no length key at all means 2048, or --max-model-len as given (Mamba2 configs)
    max_pos = _positive(
        "max_position_embeddings", declared if declared is not None else DEFAULT_MAX_LEN
    )
    longest, served_len, len_declared = derived_max_len(
        text, model_type, pooling.max_seq_length if pooling else None
    )
    moe, layer_moe = _moe(text, layers)
    facts = architecture_facts(text, model_type, max_pos)
    rotary, rope_positions, rope_caches = rope_cache(text, head_dim, mla, max_pos)
    if facts.learned_positions:
        rotary, rope_positions, rope_caches = 0, 0, 0  # absolute positions, no rotary cache
    hybrid = hybrid_layout(text, layers, model_type)
    if hybrid is not None and not hybrid.rotary:
        rope_positions = 0  # no rotary cache: these attention layers use no positions
    if hybrid is not None and hybrid.moe is not None and moe is not None:
        layer_moe = hybrid.moe
    dense_inter = (
        text.get("intermediate_size_mlp") or text.get("intermediate_size") or text.get("ffn_dim")
    )
    if attention_free:
        dense_inter = 0  # Mamba blocks: the mixer only, no MLP
    if dense_inter is None and moe is None:
        dense_inter = text.get("n_inner") or (4 * hidden if model_type in _FOUR_X_INNER else None)
        dense_inter = dense_inter or _get(text, "intermediate_size", "intermediate_size", "ffn_dim")
    architecture = (config.get("architectures") or [model_type or "unknown"])[0]
    return ModelSpec(
        max_position_declared=len_declared,
        sentence_transformers=pooling is not None and pooling.pooling,
        pooling_max_model_len=pooling.pooling_cap(config, longest) if pooling else None,
        attention_output_gate=bool(text.get("attn_output_gate", model_type in _OUTPUT_GATED)),
        name=name,
        architecture=str(architecture),
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=1 if mla else kv_heads,
        head_dim=head_dim,
        intermediate_size=int(dense_inter or 0),
        vocab_size=_positive(
            "vocab_size",
            _get(text, "vocab_size", "vocab_size")
            if "vocab_size" in text
            else config.get("vocab_size"),
        ),
        max_position_embeddings=longest,
        served_max_model_len=served_len if served_len != longest else None,
        torch_dtype=_dtype(config, text, checkpoint),
        tie_word_embeddings=_tied(config, text, checkpoint),
        layer_attention=_attention_kinds(text, layers, max_pos, hybrid),
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
        learned_position_embeddings=facts.learned_positions,
        vision=vision_spec(config.get("vision_config"), config, hidden),
        mtp_layers=_mtp_layers(text),
        layer_state=hybrid.stateful if hybrid else (),
        layer_mlp=hybrid.mlp if hybrid else (),
        state=hybrid.state if hybrid else None,
        draft_vocab_size=int(text["draft_vocab_size"]) if text.get("draft_vocab_size") else None,
        checkpoint=checkpoint,
        source=source,
    )


assert set(_DTYPE_ALIASES.values()) <= set(DTYPE_BYTES)
