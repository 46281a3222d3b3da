"""Readers of the ``quantization_config`` each vLLM method loads, into a ``QuantSpec``.

Shapes are those of the method's ``create_weights`` in vLLM 0.32
(``model_executor/layers/quantization/``); bitsandbytes from vLLM's last release with it
(``bitsandbytes.py``, ``model_loader/bitsandbytes_loader.py``). docs/quantization.md
lists every method with its bytes per weight and what stays unquantized.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gatekeeper.models.quant_fields import (
    Config,
    config_int,
    skip_list,
    spec_fields,
)
from gatekeeper.models.quant_groups import compressed_tensors, fp_quant, quark
from gatekeeper.models.quant_spec import QuantSpec

__all__ = ["FORMATS", "Format", "Reader"]

Reader = Callable[[Config], QuantSpec]


def _awq(config: Config) -> QuantSpec:
    bits = config_int(config, "bits", config_int(config, "w_bit", 4))
    group = config_int(config, "group_size", config_int(config, "q_group_size", 128))
    zero = bool(config.get("zero_point", True))
    return QuantSpec(
        method="awq",
        weight_bits=bits,
        group_size=group,
        scale_bytes=0,
        zero_bits=bits if zero else 0,
        lm_head=bool(config.get("lm_head", False)),
        skip_patterns=skip_list(config, ("modules_to_not_convert",)),
        match="substring",  # auto_awq.py: is_layer_skipped(..., match_mode="substring")
    )


def _gptq(config: Config) -> QuantSpec:
    """``AutoGPTQConfig``: ``dynamic`` rules (``-:regex`` leaves a module unquantized,
    ``+:regex`` or a bare regex overrides bits/group_size/desc_act for it, first match
    first), ``modules_in_block_to_quantize`` (what is quantized: substrings, fused shards
    expanded), and ``modules_to_not_convert`` (vLLM reads the unquantized layers from the
    checkpoint's tensors; the config's list stands for them)."""
    bits = config_int(config, "bits", 4)
    group = config_int(config, "group_size", 128)
    base = QuantSpec(
        method="gptq",
        weight_bits=bits,
        group_size=0 if group == -1 else group,
        scale_bytes=0,
        zero_bits=bits,
        act_order=bool(config.get("desc_act", False)) and group != -1,
        lm_head=bool(config.get("lm_head", False)),
        match="gptq",
        symmetric=bool(config.get("sym", True)),
    )
    dynamic = config.get("dynamic") or {}
    rules = dynamic.items() if isinstance(dynamic, Mapping) else ()
    negatives = tuple(str(k) for k, _ in rules if str(k).startswith("-:"))
    positives = tuple(
        (str(k), _gptq_override(base, v))
        for k, v in rules
        if not str(k).startswith("-:") and isinstance(v, Mapping)
    )
    if base.act_order:
        # gptq_utils.normalize_and_validate_gptq_desc_act: vLLM 0.32 refuses group
        # activation ordering ("desc_act=True is no longer supported")
        base = replace(base, method="gptq:act-order", removed_in="0.32")
    return replace(
        base,
        skip_patterns=negatives + skip_list(config, ("modules_to_not_convert",)),
        overrides=positives,
        quantized_only=_flat_names(config.get("modules_in_block_to_quantize")),
    )


def _gptq_override(base: QuantSpec, rule: Config) -> QuantSpec:
    bits = config_int(rule, "bits", base.weight_bits)
    group = config_int(rule, "group_size", base.group_size or -1)
    return replace(
        base,
        weight_bits=bits,
        zero_bits=bits,
        group_size=0 if group == -1 else group,
        act_order=bool(rule.get("desc_act", base.act_order)) and group != -1,
    )


def _flat_names(value: object) -> tuple[str, ...]:
    if isinstance(value, list | tuple):
        return tuple(n for v in value for n in _flat_names(v))
    return (value,) if isinstance(value, str) else ()


def _moe_wna16(config: Config) -> QuantSpec:
    """``MoeWNA16Method``: experts as uint8-packed ``bits`` weights, model-dtype scales per
    group, uint8-packed zeros when asymmetric; linears through AWQ or GPTQ."""
    linear = (
        _awq(config)
        if str(config.get("linear_quant_method", "gptq")).startswith("awq")
        else _gptq(config)
    )
    zero = (
        not bool(config.get("sym", True))
        if "sym" in config
        else bool(config.get("zero_point", False))
    )
    bits = linear.weight_bits
    experts = QuantSpec(
        method="moe_wna16",
        weight_bits=bits,
        group_size=linear.group_size,
        scale_bytes=0,
        zero_bits=bits if zero else 0,
    )
    return QuantSpec(
        method="moe_wna16",
        weight_bits=bits,
        group_size=linear.group_size,
        scale_bytes=0,
        zero_bits=linear.zero_bits,
        act_order=linear.act_order,
        lm_head=linear.lm_head,
        skip_patterns=skip_list(config, ("modules_to_not_convert",)),
        experts_scheme=experts,
        match="contains",  # moe_wna16.py: is_layer_skipped_quant, no fused shards
        maps_names=False,
    )


def _fp8(config: Config) -> QuantSpec:
    block = config.get("weight_block_size")
    static = config.get("activation_scheme", "dynamic") == "static"
    return QuantSpec(
        method="fp8",
        weight_bits=8,
        group_size=-1 if not block else 0,
        scale_bytes=4,
        block=(int(block[0]), int(block[1])) if block else None,
        tensor_scale_bytes=4 if static and not block else 0,
        # fp8.py: ignored_layers, else modules_to_not_convert; matched exactly
        skip_patterns=skip_list(config, ("ignored_layers",))
        or skip_list(config, ("modules_to_not_convert",)),
    )


# the formats whose shape is fixed: only the list of modules left unquantized is read
_FBGEMM_FP8 = QuantSpec(
    method="fbgemm_fp8", weight_bits=8, group_size=0, scale_bytes=4, maps_names=False
)
_MXFP4 = QuantSpec(
    method="mxfp4",
    weight_bits=4,
    group_size=32,
    scale_bytes=1,
    experts_only=True,
    maps_names=False,
)


def _fixed(spec: QuantSpec, skip_key: str) -> Reader:
    """A reader of a fixed-shape format: ``spec`` with the modules listed under ``skip_key``."""
    return lambda config: replace(spec, skip_patterns=skip_list(config, (skip_key,)))


def _bitsandbytes(config: Config) -> QuantSpec:
    """``BitsAndBytesLinearMethod``: linears only (no embedding, no LM head); MoE experts
    through ``BitsAndBytesMoEMethod`` in 4-bit."""
    eight = bool(config.get("load_in_8bit", False))
    return QuantSpec(
        method="bitsandbytes",
        weight_bits=8 if eight else 4,
        double_quant=bool(config.get("bnb_4bit_use_double_quant", False)),
        skip_patterns=skip_list(config, ("llm_int8_skip_modules",)),
        match="bnb",
        removed_in="0.32",
    )


# --- ModelOpt (modelopt.py: resolve() and the QuantKeySchemes' create_weights) ---

_NVFP4 = QuantSpec(
    method="modelopt:nvfp4", weight_bits=4, group_size=16, scale_bytes=1, tensor_scale_bytes=8
)
_MODELOPT_ALGOS: dict[str, QuantSpec] = {
    # weight fp8 [out, in]; weight_scale and input_scale fp32 per logical shard
    "FP8": QuantSpec(
        method="modelopt:fp8", weight_bits=8, group_size=-1, scale_bytes=4, tensor_scale_bytes=4
    ),
    "FP8_PER_CHANNEL_PER_TOKEN": QuantSpec(
        method="modelopt:fp8_pcpt", weight_bits=8, group_size=0, scale_bytes=4
    ),
    "FP8_PB_WO": QuantSpec(
        method="modelopt:fp8_pb_wo", weight_bits=8, block=(128, 128), scale_bytes=4
    ),
    # weight uint8 [out, in/2]; weight_scale fp8 [out, in/16]; weight_scale_2, input_scale fp32
    "NVFP4": _NVFP4,
    "W4A16_NVFP4": QuantSpec(
        method="modelopt:w4a16_nvfp4",
        weight_bits=4,
        group_size=16,
        scale_bytes=1,
        tensor_scale_bytes=4,
    ),
    # weight fp8 [out, in]; weight_scale uint8 (e8m0) [out, in/32]
    "MXFP8": QuantSpec(method="modelopt:mxfp8", weight_bits=8, group_size=32, scale_bytes=1),
}
_MODELOPT_ALGOS["FP8_BLOCK_SCALES"] = _MODELOPT_ALGOS["FP8_PB_WO"]


_MODELOPT_DEFAULT_ALGO = {"modelopt_fp4": "NVFP4", "modelopt_mxfp8": "MXFP8", "mxfp8": "MXFP8"}


def _modelopt_algo(algo: str, group_size: int | None) -> QuantSpec:
    scheme = _MODELOPT_ALGOS.get(algo.upper())
    if scheme is None:
        known = ", ".join(sorted([*_MODELOPT_ALGOS, "MIXED_PRECISION"]))
        raise ValueError(f"ModelOpt quant_algo {algo!r} is not supported (known: {known})")
    if group_size and scheme.group_size == 16 and group_size != 16:
        return QuantSpec(**{**spec_fields(scheme), "group_size": group_size})
    return scheme


def _modelopt(config: Config) -> QuantSpec:
    """``hf_quant_config.json`` (``{"quantization": {"quant_algo", "exclude_modules"}}``)
    or ``config.json``'s ``quantization_config`` (``quant_algo``, ``ignore``)."""
    inner = config.get("quantization")
    body: Config = inner if isinstance(inner, Mapping) else config
    method = str(config.get("quant_method", "")).lower()
    algo = str(body.get("quant_algo") or _MODELOPT_DEFAULT_ALGO.get(method, ""))
    if not algo:
        raise ValueError("ModelOpt config has no quant_algo")
    group = body.get("group_size")
    group_size = int(group) if isinstance(group, int | str) and str(group).isdigit() else None
    # modelopt.py: exclude_modules (hf_quant_config.json) or ignore (config.json)
    skips = skip_list(body, ("exclude_modules",) if inner is not None else ("ignore",))
    if algo.upper() != "MIXED_PRECISION":
        scheme = _modelopt_algo(algo, group_size)
        return replace(scheme, skip_patterns=skips, match="modelopt", lm_head=True)
    layers = body.get("quantized_layers") or {}
    overrides = tuple(
        (str(name), _modelopt_algo(str(recipe.get("quant_algo", "")), _opt_int(recipe)))
        for name, recipe in layers.items()
        if isinstance(recipe, Mapping)
    )
    if not overrides:
        raise ValueError("ModelOpt MIXED_PRECISION config has no quantized_layers")
    return replace(
        overrides[0][1],
        method="modelopt:mixed",
        linear=False,
        overrides=overrides,
        skip_patterns=skips,
        match="modelopt",
        lm_head=True,
    )


def _opt_int(recipe: Config) -> int | None:
    value = recipe.get("group_size")
    return int(value) if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class Format:
    """One of vLLM's ``quant_method`` names: how its config is read, and the family (the
    first of vLLM's names for it) that a ``--quantization`` flag naming it must match."""

    read: Reader
    family: str


def _names(read: Reader, family: str, *aliases: str) -> dict[str, Format]:
    return {name: Format(read, family) for name in (family, *aliases)}


FORMATS: dict[str, Format] = {
    **_names(_awq, "awq", "awq_marlin", "auto_awq"),
    **_names(_gptq, "gptq", "gptq_marlin", "auto_gptq"),
    **_names(_moe_wna16, "moe_wna16"),
    **_names(_fp8, "fp8"),
    **_names(_fixed(_FBGEMM_FP8, "modules_to_not_convert"), "fbgemm_fp8"),
    **_names(_fixed(_MXFP4, "ignored_layers"), "mxfp4", "gpt_oss_mxfp4"),
    **_names(_bitsandbytes, "bitsandbytes"),
    **_names(compressed_tensors, "compressed-tensors", "compressed_tensors"),
    **_names(_modelopt, "modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed"),
    # a ModelOpt MXFP8 checkpoint; as a flag, vLLM's online MXFP8 (its own family)
    **_names(_modelopt, "mxfp8"),
    **_names(quark, "quark"),
    **_names(fp_quant, "fp_quant"),
}
