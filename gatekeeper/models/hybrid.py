"""Hybrid and attention-free layer layouts from a config: which layers attend, which keep
a recurrent state, which have an MLP, and the state mixer's shape.

Pure: a parsed ``config.json`` (its text part) in, a ``HybridLayout`` (or None for a pure
attention model) out. Each family is read with the fields vLLM's model class reads in
``get_mamba_state_shape_from_config`` (``model_executor/models/<family>.py``):

- Jamba: attention where ``i % attn_layer_period == attn_layer_offset``, else Mamba-1
  (``mamba_expand x hidden``, ``mamba_d_state``, ``mamba_d_conv``, ``mamba_dt_rank``);
- Granite 4.0-H (``granitemoehybrid``): ``layer_types`` "mamba"/"attention", Mamba-2
  (``mamba_n_heads``, ``mamba_d_head``, ``mamba_n_groups``, ``mamba_d_state``);
- Falcon-H1: attention and Mamba-2 side by side in every layer (``mamba_d_ssm``);
- Nemotron-H: ``hybrid_override_pattern``, M = Mamba-2, * = attention, - = MLP,
  E = MoE, one block per layer; its SSM state is float32 unless the config says
  otherwise (``models/config.py::NemotronHForCausalLMConfig``);
- Mamba and Mamba2: every layer a mixer, no attention, no MLP;
- Qwen3-Next and Qwen3.5: ``layer_types`` "linear_attention" (gated delta net:
  ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
  ``linear_value_head_dim``, ``linear_conv_kernel_dim``) or "full_attention";
- LFM2: ``layer_types`` "conv" (short convolution of ``conv_dim`` channels,
  ``conv_L_cache``) or "full_attention";
- MiniMax-Text-01: ``attn_type_list`` 0 = lightning linear attention (a
  ``heads x head_dim x head_dim`` state), 1 = softmax attention;
- Kimi-Linear: ``linear_attn_config``' ``kda_layers`` and ``full_attn_layers`` (1-based);
- Zamba2: ``layers_block_type``, a Mamba-2 mixer in every layer (``n_mamba_heads``,
  ``mamba_headdim``, ``mamba_ngroups``, ``mamba_d_state``; ``mamba_expand x hidden``) and,
  in the "hybrid" layers, one of the ``num_mem_blocks`` shared transformer blocks
  (``SharedBlocks``); no MLP of a layer's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.spec import AttentionKind, SharedBlocks, StateSpec

__all__ = ["ATTENTION_FREE_TYPES", "HybridLayout", "hybrid_layout"]

ATTENTION_FREE_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba"})
"""Model types with no attention layer at all (their configs may name no heads)."""


@dataclass(frozen=True, slots=True)
class HybridLayout:
    state: StateSpec
    attention: tuple[bool, ...]
    """Layers with (full) attention."""
    stateful: tuple[bool, ...]
    mlp: tuple[bool, ...]
    moe: tuple[bool, ...] | None = None
    """Layers with an MoE block, when the layout decides it (Jamba, Nemotron-H)."""
    rotary: bool = True
    """The attention layers use rotary positions (Jamba, Nemotron-H, Granite 4.0-H with
    ``position_embedding_type: nope``, Zamba2 without ``use_mem_rope`` and Mamba do not:
    no rotary cache)."""
    shared: SharedBlocks | None = None
    """Zamba2's shared transformer blocks, which its attending layers run."""

    def attention_kinds(self, given: Sequence[AttentionKind]) -> tuple[AttentionKind, ...]:
        """The per-layer attention kinds: ``given`` where a layer attends, else none."""
        kinds: list[AttentionKind] = []
        for i, attends in enumerate(self.attention):
            kind = given[i] if i < len(given) else "full"
            kinds.append((kind if kind != "none" else "full") if attends else "none")
        return tuple(kinds)


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return int(value)
    if default is not None:
        return default
    raise ModelSpecError(
        f"{keys[0]}: the config has none of {', '.join(keys)}, which vLLM reads to size "
        "the recurrent state",
        field=keys[0],
    )


def _mamba2(cfg: Mapping[str, Any], prefix: str, inter: int) -> StateSpec:
    return StateSpec(
        kind="mamba2",
        intermediate_size=inter,
        state_size=_int(cfg, f"{prefix}d_state", "ssm_state_size", "state_size"),
        conv_kernel=_int(cfg, f"{prefix}d_conv", "conv_kernel", default=4),
        num_heads=_int(cfg, f"{prefix}n_heads", "mamba_num_heads", "num_heads"),
        head_dim=_int(cfg, f"{prefix}d_head", "mamba_head_dim", "head_dim"),
        n_groups=_int(cfg, f"{prefix}n_groups", "n_groups", default=1),
    )


def _mamba1(cfg: Mapping[str, Any], inter: int, prefix: str = "mamba_") -> StateSpec:
    hidden = _int(cfg, "hidden_size")
    state = _int(cfg, f"{prefix}d_state", "state_size", default=16)
    rank = cfg.get(f"{prefix}dt_rank", cfg.get("time_step_rank"))
    return StateSpec(
        kind="mamba1",
        intermediate_size=inter,
        state_size=state,
        conv_kernel=_int(cfg, f"{prefix}d_conv", "conv_kernel", default=4),
        dt_rank=int(rank) if isinstance(rank, int) else -(-hidden // 16),
    )


def _gdn(cfg: Mapping[str, Any], model_type: str) -> StateSpec:
    return StateSpec(
        kind="gdn",
        gqa_interleaved=model_type == "qwen3_next",  # qwen3_next.py; qwen3_5.py: False
        num_heads=_int(cfg, "linear_num_value_heads"),
        head_dim=_int(cfg, "linear_value_head_dim"),
        num_k_heads=_int(cfg, "linear_num_key_heads"),
        head_k_dim=_int(cfg, "linear_key_head_dim"),
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", default=4),
    )


def _all(n: int, value: bool) -> tuple[bool, ...]:
    return (value,) * n


def _typed_layers(
    cfg: Mapping[str, Any], layers: int, stateful: str, interval_key: str | None = None
) -> tuple[bool, ...]:
    """Which layers are ``stateful`` per ``layer_types`` (or, without it, every layer but
    each ``interval_key``-th, as Qwen3-Next's config class derives it)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return tuple(t == stateful for t in types)
    if interval_key is not None:
        interval = _int(cfg, interval_key, default=4)
        return tuple((i + 1) % interval != 0 for i in range(layers))
    raise ModelSpecError(
        f"layer_types: the config lists no layer types for its {layers} layers; vLLM reads "
        "them to tell state layers from attention layers",
        field="layer_types",
    )


def _nemotron_h(cfg: Mapping[str, Any], layers: int) -> HybridLayout:
    pattern = str(cfg.get("hybrid_override_pattern") or "")
    if len(pattern) != layers:
        raise ModelSpecError(
            f"hybrid_override_pattern: {pattern!r} must have one letter per layer ({layers})",
            field="hybrid_override_pattern",
            value=pattern,
        )
    inter = _int(cfg, "mamba_num_heads") * _int(cfg, "mamba_head_dim")
    state = _mamba2(cfg, "mamba_", inter)
    ssm = cfg.get("mamba_ssm_cache_dtype") or "float32"
    return HybridLayout(
        state=StateSpec(**{**_fields(state), "ssm_dtype": str(ssm)}),
        attention=tuple(c == "*" for c in pattern),
        stateful=tuple(c == "M" for c in pattern),
        mlp=tuple(c in "-E" for c in pattern),
        moe=tuple(c == "E" for c in pattern),
        rotary=False,
    )


def _fields(state: StateSpec) -> dict[str, Any]:
    return {name: getattr(state, name) for name in StateSpec.__slots__}


def _kimi(cfg: Mapping[str, Any], layers: int) -> HybridLayout:
    linear = cfg.get("linear_attn_config") or {}
    kda = {int(i) - 1 for i in linear.get("kda_layers") or []}
    state = StateSpec(
        kind="kda",
        num_heads=_int(linear, "num_heads"),
        head_dim=_int(linear, "head_dim"),
        conv_kernel=_int(linear, "short_conv_kernel_size", default=4),
    )
    stateful = tuple(i in kda for i in range(layers))
    return HybridLayout(state, tuple(not s for s in stateful), stateful, _all(layers, True))


def _zamba2(cfg: Mapping[str, Any], layers: int) -> HybridLayout:
    """vLLM ``zamba2.py``: every layer a ``Zamba2MambaDecoderLayer`` (``MambaMixer2`` of
    ``mamba_expand x hidden``), the "hybrid" ones with a shared block in front; the state
    as ``get_mamba_state_shape_from_config`` reads it (``mamba_headdim`` per head)."""
    types = cfg.get("layers_block_type")
    if not isinstance(types, list) or len(types) != layers:
        raise ModelSpecError(
            f"layers_block_type: the config must list one block type per layer ({layers}); "
            "vLLM builds a shared transformer block in front of the 'hybrid' ones",
            field="layers_block_type",
            value=types,
        )
    hybrid = tuple(t == "hybrid" for t in types)
    hidden = _int(cfg, "hidden_size")
    inter = _int(cfg, "mamba_expand", default=2) * hidden
    heads = _int(cfg, "n_mamba_heads", default=8)
    state = StateSpec(
        kind="mamba2",
        intermediate_size=inter,
        state_size=_int(cfg, "mamba_d_state", default=64),
        conv_kernel=_int(cfg, "mamba_d_conv", default=4),
        num_heads=heads,
        head_dim=_int(cfg, "mamba_headdim", default=inter // heads),
        n_groups=_int(cfg, "mamba_ngroups", default=1),
    )
    # the blocks the hybrid layers take in turn (itertools.cycle): one never taken is not
    # part of the model
    shared = SharedBlocks(
        blocks=min(_int(cfg, "num_mem_blocks", default=1), sum(hybrid)),
        input_size=_int(cfg, "attention_hidden_size", default=2 * hidden),
        adapter_rank=_int(cfg, "adapter_rank", default=128),
        attention_adapters=bool(cfg.get("use_shared_attention_adapter")),
    )
    return HybridLayout(
        state,
        hybrid,
        _all(layers, True),
        _all(layers, False),
        rotary=bool(cfg.get("use_mem_rope")),
        shared=shared,
    )


def hybrid_layout(cfg: Mapping[str, Any], layers: int, model_type: str) -> HybridLayout | None:
    """The layout of a hybrid or attention-free model, or None for pure attention."""
    hidden = cfg.get("hidden_size") or cfg.get("d_model") or 0
    if model_type == "jamba":
        period = _int(cfg, "attn_layer_period", default=8)
        offset = int(cfg.get("attn_layer_offset") or 0)
        attention = tuple(i % period == offset for i in range(layers))
        e_period = _int(cfg, "expert_layer_period", default=2)
        e_offset = int(cfg.get("expert_layer_offset") or 0)
        experts = int(cfg.get("num_experts") or 1) > 1
        moe = tuple(experts and i % e_period == e_offset for i in range(layers))
        state = _mamba1(cfg, _int(cfg, "mamba_expand", default=2) * int(hidden))
        stateful = tuple(not a for a in attention)
        return HybridLayout(state, attention, stateful, _all(layers, True), moe, rotary=False)
    if model_type == "granitemoehybrid":
        # published configs say "mamba"/"attention"; transformers 5 (and vLLM 0.32's
        # decoder-layer table) "linear_attention"/"full_attention"
        mamba, linear = (_typed_layers(cfg, layers, t) for t in ("mamba", "linear_attention"))
        stateful = tuple(m or lin for m, lin in zip(mamba, linear, strict=True))
        state = _mamba2(cfg, "mamba_", _int(cfg, "mamba_expand", default=2) * int(hidden))
        rotary = cfg.get("position_embedding_type", "rope") != "nope"
        attention = tuple(not s for s in stateful)
        return HybridLayout(state, attention, stateful, _all(layers, True), rotary=rotary)
    if model_type == "falcon_h1":
        d_ssm = cfg.get("mamba_d_ssm")
        inter = int(d_ssm) if d_ssm else int(_int(cfg, "mamba_expand", default=2) * int(hidden))
        state = _mamba2(cfg, "mamba_", inter)
        return HybridLayout(state, _all(layers, True), _all(layers, True), _all(layers, True))
    if model_type == "nemotron_h":
        return _nemotron_h(cfg, layers)
    if model_type in ("mamba", "falcon_mamba"):
        inter = _int(cfg, "intermediate_size", default=2 * int(hidden))
        state = _mamba1(cfg, inter, prefix="")
        no = _all(layers, False)
        return HybridLayout(state, no, _all(layers, True), no, rotary=False)
    if model_type == "mamba2":
        state = _mamba2(cfg, "", _int(cfg, "expand", default=2) * int(hidden))
        no = _all(layers, False)
        return HybridLayout(state, no, _all(layers, True), no, rotary=False)
    if model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"):
        stateful = _typed_layers(cfg, layers, "linear_attention", "full_attention_interval")
        state = _gdn(cfg, model_type)
        return HybridLayout(state, tuple(not s for s in stateful), stateful, _all(layers, True))
    if model_type in ("lfm2", "lfm2_moe"):
        stateful = _typed_layers(cfg, layers, "conv")
        state = StateSpec(
            kind="short_conv",
            intermediate_size=_int(cfg, "conv_dim", default=int(hidden)),
            conv_kernel=_int(cfg, "conv_L_cache", default=3),
        )
        return HybridLayout(state, tuple(not s for s in stateful), stateful, _all(layers, True))
    if model_type in ("minimax", "minimax_text_01"):
        kinds = cfg.get("attn_type_list") or []
        stateful = tuple(i < len(kinds) and kinds[i] == 0 for i in range(layers))
        heads = _int(cfg, "num_attention_heads")
        state = StateSpec(
            kind="linear_attention",
            num_heads=heads,
            head_dim=_int(cfg, "head_dim", default=int(hidden) // heads),
        )
        return HybridLayout(state, tuple(not s for s in stateful), stateful, _all(layers, True))
    if model_type == "kimi_linear":
        return _kimi(cfg, layers)
    if model_type == "zamba2":
        return _zamba2(cfg, layers)
    return None
