"""The shape of each ``config.json`` field gatekeeper reads, checked before it is read.

A config is any JSON: a field can hold a string where a number belongs, a list where a
scalar was, ``null``, zero, a negative or an absurd number. transformers' config classes
refuse most such values (their strict dataclass validation: ``num_hidden_layers: "12"``,
``rope_scaling: "linear"``, ``mlp_only_layers: "1,2"``), and so then does vLLM, which
builds its config with them. ``check_shapes`` holds the reading to the same line before
any arithmetic: every field in ``FIELDS`` has one JSON shape, and a value of another shape
is a ``ModelSpecError`` naming the field, the value and what to do. ``null`` is the
field's absence, as transformers and vLLM (``getattr(config, key, None)``) read it.

The shapes transformers or vLLM read beyond a field's plain one are turned into it first
(``normalize``), each with the file that reads it so:

- ``sliding_window`` as a per-layer list (``None`` for a full layer): the window and
  ``layer_types``, as ``vllm/transformers_utils/configs/mistral.py``'s
  ``_remap_mistral_sliding_window`` reads it;
- ``layers_block_type`` (transformers 5's Nemotron-H, ``configuration_nemotron_h.py``):
  the ``hybrid_override_pattern`` it replaces (``_list_to_pattern``);
- ``moe_layer_freq`` as a per-layer list of 0/1 (``vllm/transformers_utils/configs/
  minimax_m3.py``): kept, and read per layer (``layer_kinds``);
- Zamba2's ``attention_head_dim`` (``configuration_zamba2.py``'s ``attribute_map``: it is
  ``head_dim``) and HRM-Text's and Zamba2's KV heads, which their vLLM classes take to be
  the attention heads (``hrm_text.py``, ``zamba2.py``).

``field_value`` (the first of a field's keys present) and ``positive`` read the checked
fields for ``hf_config`` and ``layer_kinds``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.rope import LENGTH_KEYS

__all__ = [
    "FIELDS",
    "MAX_COUNT",
    "MAX_SIZE",
    "bad_field",
    "check_shapes",
    "field_value",
    "layer_count",
    "normalize",
    "positive",
]

MAX_COUNT = 1 << 16
"""Layers, heads, experts: no model has more (DeepSeek V3: 61 layers, 256 experts);
per-layer tables are built from them, so a count of 10^30 must stop at the door."""
MAX_SIZE = 1 << 40
"""Widths, vocabularies, positions: far above any model's, below float precision."""

FIX = "Fix config.json (or --hf-overrides), or use a catalog model (gatekeeper models)"


def bad_field(field: str, value: Any, expected: str, todo: str = FIX) -> ModelSpecError:
    """The three-part error: which field, what value, what to do instead."""
    shown = value if isinstance(value, str | int | float | bool) or value is None else repr(value)
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return ModelSpecError(
        f"{field}: config.json says {text}; {expected}. {todo}", field=field, value=shown
    )


def field_value(cfg: Mapping[str, Any], name: str, *keys: str, required: bool = True) -> Any:
    """The value of the first of ``keys`` the config has (not null); none of them: a
    ``ModelSpecError`` naming ``name`` when ``required``, else None."""
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


def positive(name: str, value: Any) -> int:
    """``value`` as a positive integer, or a ``ModelSpecError`` naming the field."""
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


def layer_count(text: Mapping[str, Any]) -> int:
    """The decoder layers: ``num_hidden_layers`` (``n_layer``, ``num_layers``); for
    Nemotron-H the length of its per-layer list, which transformers 5 writes instead
    (``NemotronHConfig.num_hidden_layers`` is ``len(layers_block_type)``, and a written
    ``num_hidden_layers`` is ignored; vLLM builds ``len(hybrid_override_pattern)``
    layers, the pattern transformers derives from that list); for Zamba2 the length of
    ``layers_block_type`` (vLLM's ``zamba2.py`` builds one layer per entry); for HRM-Text
    its two stacks of ``num_layers_per_stack`` (``hrm_text.py``: ``L_module`` and
    ``H_module``; ``num_hidden_layers`` counts the recurrence steps' attention calls, or,
    in a config without ``num_layers_per_stack``, one stack)."""
    blocks = text.get("layers_block_type")
    model_type = text.get("model_type")
    if model_type == "nemotron_h":
        if not isinstance(blocks, list):
            blocks = text.get("hybrid_override_pattern")  # before transformers 5
        if isinstance(blocks, list | str) and blocks:
            return positive("num_hidden_layers", len(blocks))
    if model_type == "zamba2" and isinstance(blocks, list) and blocks:
        return positive("num_hidden_layers", len(blocks))
    keys = ("num_hidden_layers", "n_layer", "num_layers")
    if model_type == "hrm_text":
        per_stack = text.get("num_layers_per_stack") or field_value(text, "layers", *keys)
        return 2 * positive("num_layers_per_stack", per_stack)
    return positive("num_hidden_layers", field_value(text, "layers", *keys))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(low: int, high: int) -> Callable[[str, Any], None]:
    def check(field: str, value: Any) -> None:
        if not _is_int(value) or not low <= value <= high:
            raise bad_field(field, value, f"expected a whole number from {low} to {high:,}")

    return check


def _number(low: float, high: float) -> Callable[[str, Any], None]:
    def check(field: str, value: Any) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not low < value <= high:
            raise bad_field(field, value, f"expected a number above {low} and at most {high}")

    return check


def _flag(field: str, value: Any) -> None:
    if not isinstance(value, bool) and value not in (0, 1):
        raise bad_field(field, value, "expected true or false")


def _text(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise bad_field(field, value, "expected a string")


def _mapping(field: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise bad_field(field, value, "expected a JSON object")


def _list_of(kind: str) -> Callable[[str, Any], None]:
    def check(field: str, value: Any) -> None:
        ok = isinstance(value, list) and all(
            isinstance(v, str) if kind == "string" else _is_int(v) and 0 <= v < MAX_SIZE
            for v in value
        )
        if not ok:
            raise bad_field(field, value, f"expected a list of {kind}s")

    return check


def _int_or_flags(field: str, value: Any) -> None:
    """``moe_layer_freq``: a period, or MiniMax-M3's per-layer 0/1 list."""
    if _is_int(value) and 1 <= value <= MAX_COUNT:
        return
    if isinstance(value, list) and all(v in (0, 1) for v in value):
        return
    raise bad_field(field, value, "expected a whole number (every n-th layer) or a 0/1 per layer")


def _size_or_pair(field: str, value: Any) -> None:
    """``image_size``, ``patch_size``: one side, or [height, width] (transformers'
    InternVLVisionConfig; vLLM's interns1_vit.py reads both sides)."""
    pair = isinstance(value, list) and len(value) == 2
    if all(_is_int(v) and 1 <= v <= MAX_SIZE for v in (value if pair else [value])):
        return
    raise bad_field(field, value, "expected a size in pixels, or [height, width]")


def _window(field: str, value: Any) -> None:
    """``sliding_window``: a size (0: none), or a per-layer list that ``normalize`` reads."""
    if isinstance(value, list) or (_is_int(value) and 0 <= value <= MAX_SIZE):
        return
    raise bad_field(field, value, "expected a window size in tokens (0 or null: no window)")


def _rank(field: str, value: Any) -> None:
    """Mamba's ``dt`` rank: a number, or "auto" (transformers' MambaConfig, JambaConfig:
    ``ceil(hidden / 16)``)."""
    if value != "auto" and not (_is_int(value) and 0 < value <= MAX_SIZE):
        raise bad_field(field, value, 'expected a whole number or "auto"')


_POSITIVE_COUNT = _count(1, MAX_COUNT)
_COUNT = _count(0, MAX_COUNT)
_POSITIVE_SIZE = _count(1, MAX_SIZE)
_SIZE = _count(0, MAX_SIZE)
_RATIO = _number(0.0, 1.0)
_FACTOR = _number(0.0, float(MAX_COUNT))

FIELDS: dict[str, Callable[[str, Any], None]] = {
    **dict.fromkeys(
        ("num_hidden_layers", "n_layer", "num_layers", "num_attention_heads", "n_head",
         "num_key_value_heads", "num_experts_per_tok", "experts_per_token", "top_k_experts",
         "sliding_window_pattern", "interleave_moe_layer_step", "decoder_sparse_step",
         "full_attention_interval", "attn_layer_period", "expert_layer_period",
         "mamba_n_heads", "mamba_num_heads", "mamba_n_groups", "n_groups",
         "linear_num_key_heads", "linear_num_value_heads", "spatial_merge_size",
         "temporal_patch_size", "num_channels", "in_chans", "max_num_tiles", "depth",
         "encoder_layers", "decoder_layers", "encoder_attention_heads",
         "decoder_attention_heads"),
        _POSITIVE_COUNT,
    ),
    **dict.fromkeys(
        ("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts",
         "first_k_dense_replace", "num_nextn_predict_layers", "mtp_num_hidden_layers",
         "num_mtp_layers", "attn_layer_offset", "expert_layer_offset", "num_global_layers"),
        _COUNT,
    ),
    **dict.fromkeys(
        ("hidden_size", "n_embd", "d_model", "head_dim", "vocab_size", *LENGTH_KEYS,
         "intermediate_size",
         "intermediate_size_mlp", "ffn_dim", "n_inner", "moe_intermediate_size",
         "expert_intermediate_size", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
         "v_head_dim", "original_max_position_embeddings", "mamba_d_state", "mamba_d_conv",
         "mamba_d_head", "mamba_head_dim", "mamba_expand", "mamba_d_ssm", "ssm_state_size",
         "state_size", "conv_kernel", "expand", "linear_key_head_dim", "linear_value_head_dim",
         "linear_conv_kernel_dim", "conv_dim", "conv_L_cache", "embed_dim", "out_hidden_size", "vision_output_dim", "draft_vocab_size",
         "mm_tokens_per_image", "encoder_ffn_dim", "decoder_ffn_dim", "num_mel_bins",
         "max_source_positions"),
        _POSITIVE_SIZE,
    ),
    **dict.fromkeys(
        ("attention_chunk_size", "q_lora_rank", "shared_expert_intermediate_size",
         "type_vocab_size"),
        _SIZE,
    ),
    **dict.fromkeys(("mamba_dt_rank", "time_step_rank"), _rank),
    **dict.fromkeys(("partial_rotary_factor", "pixel_shuffle_ratio"), _RATIO),
    **dict.fromkeys(
        ("tie_word_embeddings", "use_sliding_window", "attn_output_gate", "attention_bias",
         "mlp_bias", "qkv_bias", "bias", "enable_bias", "use_bias"),
        _flag,
    ),
    **dict.fromkeys(
        ("model_type", "torch_dtype", "dtype", "hidden_act", "position_embedding_type",
         "hybrid_override_pattern", "mamba_ssm_cache_dtype"),
        _text,
    ),
    **dict.fromkeys(("architectures", "layer_types", "layers_block_type"), _list_of("string")),
    **dict.fromkeys(("mlp_only_layers", "attn_type_list"), _list_of("whole number")),
    **dict.fromkeys(
        ("text_config", "vision_config", "rope_scaling", "quantization_config",
         "linear_attn_config"),
        _mapping,
    ),
    **dict.fromkeys(("patch_size", "image_size"), _size_or_pair),
    "moe_layer_freq": _int_or_flags,
    "sliding_window": _window,
    "no_rope_layers": _list_of("whole number"),
    "rope_parameters": _mapping,
}  # fmt: skip
"""Each field gatekeeper reads and the check of its one JSON shape."""

_ROPE_FIELDS: dict[str, Callable[[str, Any], None]] = {
    "factor": _FACTOR,
    "original_max_position_embeddings": _POSITIVE_SIZE,
    "partial_rotary_factor": _RATIO,
    "rope_type": _text,
    "type": _text,
}
_NESTED = ("text_config", "vision_config")


def check_shapes(config: Mapping[str, Any], prefix: str = "") -> None:
    """Raise ``ModelSpecError`` for the first field whose value has the wrong shape."""
    for key, value in config.items():
        check = FIELDS.get(key)
        if check is None or value is None:
            continue
        field = prefix + key
        check(field, value)
        if key in _NESTED:
            check_shapes(value, f"{field}.")
        elif key in ("rope_scaling", "rope_parameters"):
            _check_rope(field, value)
        elif key == "linear_attn_config":
            _check_linear(field, value)


def _check_rope(field: str, rope: Mapping[str, Any]) -> None:
    """A rope dict, or transformers 5's per-layer-type dict of them."""
    for key, value in rope.items():
        if value is not None and key in _ROPE_FIELDS:
            _ROPE_FIELDS[key](f"{field}.{key}", value)
        elif isinstance(value, Mapping):
            _check_rope(f"{field}.{key}", value)


def _check_linear(field: str, linear: Mapping[str, Any]) -> None:
    """Kimi-Linear's ``linear_attn_config``."""
    for key in ("num_heads", "head_dim", "short_conv_kernel_size"):
        if linear.get(key) is not None:
            _POSITIVE_SIZE(f"{field}.{key}", linear[key])
    for key in ("kda_layers", "full_attn_layers"):
        if linear.get(key) is not None:
            _list_of("whole number")(f"{field}.{key}", linear[key])


_BLOCK_LETTERS = {"linear_attention": "M", "mamba": "M", "moe": "E", "full_attention": "*",
                  "attention": "*", "mlp": "-"}  # fmt: skip
"""transformers 5's Nemotron-H block names (``configuration_nemotron_h.py``,
``_list_to_pattern``, and the legacy names ``remap_legacy_layer_types`` maps)."""


def normalize(text: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """``text`` with the alternative shapes transformers or vLLM read turned into the one
    ``hf_config`` reads (the module docstring lists them)."""
    out = dict(text)
    window = out.get("sliding_window")
    if isinstance(window, list):
        out.update(_remap_window(window, layers, out.get("layer_types")))
    blocks = out.get("layers_block_type")
    if out.get("model_type") == "nemotron_h" and not out.get("hybrid_override_pattern"):
        blocks = blocks if blocks is not None else out.get("layer_types")
        if isinstance(blocks, list):
            out["hybrid_override_pattern"] = _pattern(blocks)
    heads = out.get("num_attention_heads")
    if out.get("model_type") == "zamba2" and heads:
        # zamba2.py's attention: heads of attention_head_dim (transformers' attribute_map
        # head_dim, 2 x hidden / heads), K and V with every head (QKVParallelLinear
        # given no KV head count)
        width = out.get("attention_hidden_size") or 2 * int(out.get("hidden_size") or 0)
        out["head_dim"] = out.get("attention_head_dim") or int(width) // int(heads)
        out["num_key_value_heads"] = heads
    if out.get("model_type") == "hrm_text" and heads:
        out["num_key_value_heads"] = heads  # hrm_text.py: MHA, whatever the config says
    return out


def _remap_window(window: list[Any], layers: int, types: Any) -> dict[str, Any]:
    """vllm/transformers_utils/configs/mistral.py ``_remap_mistral_sliding_window``: the
    list repeats over the layers, ``None`` a full layer, one window size for the rest."""
    sizes = {w for w in window if w is not None}
    ok = bool(window) and layers % len(window) == 0 and len(sizes) <= 1
    ok = ok and all(_is_int(w) and 0 < w < MAX_SIZE for w in sizes)
    if not ok or types is not None:
        raise bad_field(
            "sliding_window",
            window,
            f"expected one window size, or a list whose length divides the {layers} layers "
            "with one size and null for full layers (and then no layer_types)",
        )
    per_layer = window * (layers // len(window))
    kinds = ["full_attention" if w is None else "sliding_attention" for w in per_layer]
    return {"sliding_window": next(iter(sizes), None), "layer_types": kinds}


def _pattern(blocks: list[Any]) -> str:
    unknown = sorted({str(b) for b in blocks} - set(_BLOCK_LETTERS))
    if unknown:
        raise bad_field(
            "layers_block_type",
            blocks,
            f"{', '.join(unknown)} is not a Nemotron-H block; expected "
            "full_attention, linear_attention, moe or mlp per layer",
        )
    return "".join(_BLOCK_LETTERS[b] for b in blocks)
