"""What each decoder layer of a config is: its attention kind (full, sliding, chunked or
none), MoE or dense, and the model's MLA ranks and multi-token-prediction layers.

Pure: the text part of a parsed (and normalized) ``config.json`` in, as vLLM's model
classes read it: ``layer_types`` first; else Llama 4's ``no_rope_layers`` (chunked),
Gemma 2's alternation, Gemma 3's ``sliding_window_pattern``, or one window for every
layer when it is shorter than the model's positions; MoE layers from
``moe_layer_freq``/``first_k_dense_replace``, ``interleave_moe_layer_step`` or
``decoder_sparse_step``/``mlp_only_layers``; each layer's heads where layers differ, from
transformers' ``per_layer_config`` (Gemma4TextConfig writes ``global_head_dim`` and
``num_global_key_value_heads`` into it for its full-attention layers). A field of the wrong
shape raises ``ModelSpecError`` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.config_fields import bad_field, field_value, positive
from gatekeeper.models.hybrid import HybridLayout
from gatekeeper.models.spec import AttentionKind, AttentionShape, MlaSpec, MoeSpec

__all__ = [
    "attention_kinds",
    "layer_shapes",
    "mla_spec",
    "moe_layers",
    "mtp_layers",
    "per_layer_inputs",
    "recurrence_kv_caches",
    "sparse_indexer",
]

PER_LAYER_INPUTS: dict[str, str] = {
    "gemma4_text": "vllm gemma4.py Gemma4Model (embed_tokens_per_layer, "
    "per_layer_model_projection) and Gemma4DecoderLayer (per_layer_input_gate, "
    "per_layer_projection; KV-shared layers: q_proj only, a double-wide MLP)",
    "embedding_gemma2_text": "vllm embedding_gemma2.py EmbeddingGemma2TextModel (ple: "
    "per_layer_model_projection from the token embedding, no table of its own) and "
    "EmbeddingGemma2DecoderLayer (ple_block: per_layer_input_gate, per_layer_projection)",
}
"""Model types whose config's per-layer inputs and KV-shared layers vLLM builds."""
NO_PER_LAYER_TABLE = frozenset({"embedding_gemma2_text"})
"""Of those, the types whose per-layer inputs are projected from the token embedding
alone, with no per-layer embedding table (``per_layer_input_vocab`` 0)."""

DENSE_BESIDE_EXPERTS: dict[str, str] = {
    "gemma4_text": "vllm gemma4.py Gemma4DecoderLayer: mlp (intermediate_size) runs in every "
    "layer, experts (moe_intermediate_size) and a router beside it, and three more norms",
}
"""Model types whose MoE layers keep a dense MLP beside the experts."""
MOE_BLOCK_NORMS = 3
"""Gemma 4's MoE block: post_feedforward_layernorm_1/_2 and pre_feedforward_layernorm_2."""


def layer_shapes(
    text: Mapping[str, Any], layers: int, base: AttentionShape
) -> tuple[AttentionShape, ...]:
    """Each layer's heads when ``per_layer_config`` (transformers' heterogeneous configs:
    ``{layer: {field: value}}``) gives some layers their own ``head_dim`` or
    ``num_key_value_heads``; () when every layer has ``base``."""
    overrides = text.get("per_layer_config")
    if not overrides:
        return ()
    if not isinstance(overrides, Mapping):
        raise bad_field("per_layer_config", overrides, "a mapping of layer index to fields")
    shapes = [base] * layers
    for key, fields in overrides.items():
        index = int(key) if str(key).isdigit() else -1
        if not 0 <= index < layers or not isinstance(fields, Mapping):
            raise bad_field(
                f"per_layer_config.{key}", fields, f"fields of a layer in 0..{layers - 1}"
            )
        head_dim = positive(
            f"per_layer_config.{key}.head_dim", fields.get("head_dim", base.head_dim)
        )
        kv = fields.get("num_key_value_heads", base.num_kv_heads)
        kv = positive(f"per_layer_config.{key}.num_key_value_heads", kv)
        # a layer's own head_dim sizes its values too (Gemma 4: K and V of one width)
        shapes[index] = AttentionShape(head_dim, kv, head_dim)
    return () if all(s == base for s in shapes) else tuple(shapes)


def sparse_indexer(text: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """``ModelSpec``'s lightning-indexer fields (MiniMax-M3, ``sparse_attention_config``:
    ``sparse_index_dim`` wide, in the layers ``sparse_attention_freq`` marks 1)."""
    sparse = text.get("sparse_attention_config")
    if str(text.get("model_type")) != "minimax_m3_text" or not isinstance(sparse, Mapping):
        return {}
    flags = sparse.get("sparse_attention_freq") or []
    if not sparse.get("use_sparse_attention", True) or len(flags) != layers:
        return {}
    dim = positive("sparse_attention_config.sparse_index_dim", sparse.get("sparse_index_dim"))
    return {"indexer_head_dim": dim, "layer_indexer": tuple(bool(f) for f in flags)}


def mtp_layers(text: Mapping[str, Any]) -> int:
    """Multi-token-prediction layers a checkpoint ships (DeepSeek V3, GLM-4.5, Qwen3-Next)."""
    keys = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
    value = field_value(text, "mtp_layers", *keys, required=False)
    return int(value) if isinstance(value, int) and value > 0 else 0


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
            # GLM-5 (transformers' GlmMoeDsaConfig default): MLA with the lightning
            # indexer, which vLLM builds in every layer with a KV cache of its own
            "indexed_attention": "full",
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


def attention_kinds(
    cfg: Mapping[str, Any], layers: int, max_pos: int, hybrid: HybridLayout | None
) -> tuple[AttentionKind, ...]:
    kinds = _layer_attention(cfg, layers, max_pos)
    return hybrid.attention_kinds(kinds) if hybrid is not None else kinds


def moe_layers(cfg: Mapping[str, Any], layers: int) -> tuple[MoeSpec | None, tuple[bool, ...]]:
    experts = field_value(
        cfg,
        "experts",
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "moe_num_experts",  # Ernie 4.5 MoE, Aria
        required=False,
    )
    if not experts:
        return None, tuple(False for _ in range(layers))
    keys = ("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_k", "moe_topk")
    per_token = field_value(cfg, "experts per token", *keys, required=False)  # moe_k: Ernie 4.5
    if per_token is None:
        raise _no_top_k(cfg, keys, experts)
    per_token = positive("num_experts_per_tok", per_token)
    inter = positive(
        "moe_intermediate_size",
        field_value(
            cfg,
            "expert size",
            "moe_intermediate_size",
            "expert_intermediate_size",
            "intermediate_size",
        ),
    )
    # Nemotron-H: n_shared_experts of moe_shared_expert_intermediate_size each
    shared_each = int(cfg.get("moe_shared_expert_intermediate_size") or inter)
    count = (
        cfg.get("n_shared_experts")
        or cfg.get("moe_num_shared_experts")  # Ernie 4.5, Aria
        or cfg.get("num_shared_experts")  # EXAONE MoE, Bailing, AFMoE, Sarvam (x expert size)
    )
    shared = int(count or 0) * shared_each
    shared = shared or int(cfg.get("shared_expert_intermediate_size") or 0)
    model_type = str(cfg.get("model_type", ""))
    if model_type.startswith("llama4"):
        shared = inter
    beside = model_type in DENSE_BESIDE_EXPERTS
    moe = MoeSpec(
        num_experts=positive("num_experts", experts),
        experts_per_token=per_token,
        expert_intermediate_size=inter,
        shared_intermediate_size=shared,
        shared_expert_gate=bool(cfg.get("shared_expert_intermediate_size")),
        expert_bias=model_type == "gpt_oss",
        router_bias=model_type == "gpt_oss",
        dense_intermediate_size=int(cfg.get("intermediate_size") or 0) if beside else 0,
        router_scales=beside,
        norms=MOE_BLOCK_NORMS if beside else 0,
        latent_size=int(cfg.get("moe_latent_size") or 0),
        router_float32=model_type == "minimax_m3_text" and bool(cfg.get("use_routing_bias")),
    )
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list) and len(freq) != layers:
        raise bad_field("moe_layer_freq", freq, f"expected a 0/1 for each of {layers} layers")
    return moe, tuple(_is_moe_layer(cfg, i) for i in range(layers))


def _no_top_k(cfg: Mapping[str, Any], keys: tuple[str, ...], experts: Any) -> ModelSpecError:
    """No experts per token: DeepseekV2Config (and Kimi-VL's text config) default
    ``num_experts_per_tok`` to null; vLLM builds the experts with it as the router's
    ``top_k`` (deepseek_v2.py), so it builds the weights but cannot route a token, and the
    MoE activations gatekeeper sizes depend on it. Published checkpoints set it."""
    said = "sets it to null" if "num_experts_per_tok" in cfg else f"has none of {', '.join(keys)}"
    return ModelSpecError(
        f"num_experts_per_tok: config.json {said} for its {experts} experts: vLLM routes "
        "each token to that many experts (the router's top_k) and serves nothing without it. "
        "Set it as the published checkpoint does, in config.json or with "
        """--hf-overrides '{"num_experts_per_tok": N}' (under "text_config" where the """
        "config has one)",
        field="num_experts_per_tok",
    )


def _is_moe_layer(cfg: Mapping[str, Any], i: int) -> bool:
    kinds = cfg.get("mlp_layer_types")  # Laguna: "dense" or "sparse" per layer
    if isinstance(kinds, list) and i < len(kinds):
        return bool(kinds[i] == "sparse")
    start, end = cfg.get("moe_layer_start_index"), cfg.get("moe_layer_end_index")
    if isinstance(start, int) or isinstance(end, int):  # vllm ernie45_moe.py Ernie4_5_MoeModel
        step = int(cfg.get("moe_layer_interval") or 1)
        last = end if isinstance(end, int) else i
        return (i + 1) % step == 0 and int(start or 0) <= i <= last
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


def mla_spec(cfg: Mapping[str, Any], layers: int) -> MlaSpec | None:
    if not cfg.get("kv_lora_rank"):
        return None
    indexer = "index_topk" in cfg  # deepseek_v2.py: is_v32 = hasattr(config, "index_topk")
    return MlaSpec(
        kv_lora_rank=positive("kv_lora_rank", cfg["kv_lora_rank"]),
        q_lora_rank=int(cfg["q_lora_rank"]) if cfg.get("q_lora_rank") else None,
        qk_nope_head_dim=positive("qk_nope_head_dim", cfg.get("qk_nope_head_dim")),
        qk_rope_head_dim=positive("qk_rope_head_dim", cfg.get("qk_rope_head_dim")),
        v_head_dim=positive("v_head_dim", cfg.get("v_head_dim")),
        indexer_head_dim=positive("index_head_dim", cfg.get("index_head_dim")) if indexer else 0,
        indexer_layers=tuple(i for i in range(layers) if indexer and _builds_indexer(cfg, i)),
    )


def _builds_indexer(cfg: Mapping[str, Any], i: int) -> bool:
    """Whether layer ``i`` builds its lightning indexer (IndexCache, deepseek_v2.py
    ``DeepseekV2MLAAttention``): all do, but the layers ``index_topk_pattern`` marks
    ``S``, or, without a pattern, those off ``index_topk_freq`` counted from
    ``index_skip_topk_offset``."""
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        return not (0 <= i < len(pattern) and pattern[i] == "S")
    freq = int(cfg.get("index_topk_freq") or 1)
    offset = int(cfg.get("index_skip_topk_offset", 2))
    return max(i - offset + 1, 0) % freq == 0


def per_layer_inputs(text: Mapping[str, Any], model_type: str, layers: int) -> dict[str, Any]:
    """``ModelSpec``'s per-layer embedding and KV-sharing fields (``PER_LAYER_INPUTS``):
    ``hidden_size_per_layer_input`` (None or 0: none), ``vocab_size_per_layer_input``,
    ``num_kv_shared_layers``, ``use_double_wide_mlp``."""
    if model_type not in PER_LAYER_INPUTS:
        return {}
    size = int(text.get("hidden_size_per_layer_input") or 0)
    shared = int(text.get("num_kv_shared_layers") or 0)
    if not 0 <= shared < layers:
        raise bad_field("num_kv_shared_layers", shared, f"a count below {layers} layers")
    vocab = text.get("vocab_size_per_layer_input") or text.get("vocab_size")
    table = size and model_type not in NO_PER_LAYER_TABLE
    return {
        "per_layer_input_size": size,
        "per_layer_input_vocab": positive("vocab_size_per_layer_input", vocab) if table else 0,
        "kv_shared_layers": shared,
        "double_wide_mlp": bool(text.get("use_double_wide_mlp")) and shared > 0,
    }


def recurrence_kv_caches(text: Mapping[str, Any], model_type: str, layers: int) -> tuple[int, ...]:
    """KV caches per layer of a model that runs its layers more than once per token
    (``ModelSpec.layer_kv_caches``); empty elsewhere. HRM-Text (vllm ``hrm_text.py``):
    ``H_cycles`` high-level cycles of ``L_cycles`` runs of the low stack (``L_module``,
    the first ``num_layers_per_stack`` layers) and one of the high stack (``H_module``);
    each layer keeps a cache per step it runs at (``attn_per_step``): ``H_cycles x
    L_cycles`` in the low stack, ``H_cycles`` in the high one. (Its layers and stack norms
    have no weight; its ``z_L_init`` is one hidden-wide vector, the size of the final norm
    counted for every model.)"""
    if model_type != "hrm_text":
        return ()
    high = positive("H_cycles", text.get("H_cycles") or 2)
    low = positive("L_cycles", text.get("L_cycles") or 3)
    per_stack = layers // 2
    return (high * low,) * per_stack + (high,) * (layers - per_stack)
