"""Readers of the ``quantization_config`` each vLLM method loads, into a ``QuantSpec``.

Shapes are those of the method's ``create_weights`` in vLLM 0.32
(``model_executor/layers/quantization/``); bitsandbytes from vLLM's last release with it
(``bitsandbytes.py``, ``model_loader/bitsandbytes_loader.py``). docs/quantization.md
lists every method with its bytes per weight and what stays unquantized.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gatekeeper.models.quant_spec import QuantSpec

__all__ = ["READERS"]

Config = Mapping[str, Any]


def _int(config: Config, key: str, default: int) -> int:
    value = config.get(key, default)
    return default if value is None else int(value)


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return ()


_SKIP_KEYS = (
    "modules_to_not_convert",
    "ignored_layers",
    "ignore",
    "llm_int8_skip_modules",
    "exclude_modules",
    "exclude",
)


def _skip_list(config: Config, keys: tuple[str, ...] = _SKIP_KEYS) -> tuple[str, ...]:
    """The names listed under ``keys``, in order (each config class reads its own)."""
    return tuple(p for key in keys for p in _names(config.get(key)))


def _awq(config: Config) -> QuantSpec:
    bits = _int(config, "bits", _int(config, "w_bit", 4))
    group = _int(config, "group_size", _int(config, "q_group_size", 128))
    zero = bool(config.get("zero_point", True))
    return QuantSpec(
        method="awq",
        weight_bits=bits,
        group_size=group,
        scale_bytes=0,
        zero_bits=bits if zero else 0,
        lm_head=bool(config.get("lm_head", False)),
        skip_patterns=_skip_list(config, ("modules_to_not_convert",)),
        match="substring",  # auto_awq.py: is_layer_skipped(..., match_mode="substring")
    )


def _gptq(config: Config) -> QuantSpec:
    """``AutoGPTQConfig``: ``dynamic`` rules (``-:regex`` leaves a module unquantized,
    ``+:regex`` or a bare regex overrides bits/group_size/desc_act for it, first match
    first), ``modules_in_block_to_quantize`` (what is quantized: substrings, fused shards
    expanded), and ``modules_to_not_convert`` (vLLM reads the unquantized layers from the
    checkpoint's tensors; the config's list stands for them)."""
    bits = _int(config, "bits", 4)
    group = _int(config, "group_size", 128)
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
    return replace(
        base,
        skip_patterns=negatives + _skip_list(config, ("modules_to_not_convert",)),
        overrides=positives,
        quantized_only=_flat_names(config.get("modules_in_block_to_quantize")),
    )


def _gptq_override(base: QuantSpec, rule: Config) -> QuantSpec:
    bits = _int(rule, "bits", base.weight_bits)
    group = _int(rule, "group_size", base.group_size or -1)
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
        skip_patterns=_skip_list(config, ("modules_to_not_convert",)),
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
        skip_patterns=_skip_list(config, ("ignored_layers",))
        or _skip_list(config, ("modules_to_not_convert",)),
    )


def _fbgemm_fp8(config: Config) -> QuantSpec:
    return QuantSpec(
        method="fbgemm_fp8",
        weight_bits=8,
        group_size=0,
        scale_bytes=4,
        skip_patterns=_skip_list(config, ("modules_to_not_convert",)),
        maps_names=False,
    )


def _mxfp4(config: Config) -> QuantSpec:
    return QuantSpec(
        method="mxfp4",
        weight_bits=4,
        group_size=32,
        scale_bytes=1,
        experts_only=True,
        moe_intermediate_multiple=256,
        skip_patterns=_skip_list(config, ("ignored_layers",)),
        maps_names=False,
    )


def _bitsandbytes(config: Config) -> QuantSpec:
    """``BitsAndBytesLinearMethod``: linears only (no embedding, no LM head); MoE experts
    through ``BitsAndBytesMoEMethod`` in 4-bit."""
    eight = bool(config.get("load_in_8bit", False))
    return QuantSpec(
        method="bitsandbytes",
        weight_bits=8 if eight else 4,
        double_quant=bool(config.get("bnb_4bit_use_double_quant", False)),
        skip_patterns=_skip_list(config, ("llm_int8_skip_modules",)),
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
        return QuantSpec(**{**_fields(scheme), "group_size": group_size})
    return scheme


def _fields(spec: QuantSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in QuantSpec.__dataclass_fields__}


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
    skips = _skip_list(body, ("exclude_modules",) if inner is not None else ("ignore",))
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


# --- compressed-tensors (compressed_tensors.py, schemes/*.py) ---


def _ct_scheme(weights: Config, acts: Config | None) -> QuantSpec:
    bits = int(weights.get("num_bits", 8))
    kind = str(weights.get("type", "int"))
    strategy = str(weights.get("strategy") or "tensor")
    group = int(weights.get("group_size") or 0)
    static_acts = acts is not None and not bool(acts.get("dynamic", True))
    if kind == "float" and bits == 4:
        # NVFP4 (tensor_group, 16): uint8 [out, in/2], fp8 scales per 16, fp32 global scales
        # MXFP4 (group, 32): uint8 [out, in/2], e8m0 scales per 32
        nv = strategy == "tensor_group" or group == 16
        return QuantSpec(
            method="compressed-tensors:nvfp4" if nv else "compressed-tensors:mxfp4",
            weight_bits=4,
            group_size=group or (16 if nv else 32),
            scale_bytes=1,
            tensor_scale_bytes=(4 + (4 if acts is not None else 0)) if nv else 0,
        )
    if kind == "float":
        # W8A8/W8A16 FP8: fp8 [out, in]; fp32 scale per tensor, per row or per block
        block = weights.get("block_structure") if strategy == "block" else None
        return QuantSpec(
            method="compressed-tensors:fp8" + ("-block" if block else ""),
            weight_bits=8,
            group_size=-1 if strategy == "tensor" else (group if strategy == "group" else 0),
            scale_bytes=1 if strategy == "group" and group == 32 else 4,
            block=(int(block[0]), int(block[1])) if block else None,
            tensor_scale_bytes=4 if static_acts else 0,
        )
    if acts is not None and int(acts.get("num_bits", 16)) == 8:
        # W8A8 int8: int8 [out, in], fp32 scale per row or per tensor, static input scale
        return QuantSpec(
            method=f"compressed-tensors:w{bits}a8",
            weight_bits=bits,
            group_size=-1 if strategy == "tensor" else 0,
            scale_bytes=4,
            tensor_scale_bytes=(4 + (0 if acts.get("symmetric", True) else 1))
            if static_acts
            else 0,
        )
    # WNA16: int32-packed [out, in*b/32]; model-dtype scales [out, in/g] (channel: [out, 1]);
    # int32-packed zeros [out*b/32, in/g] when asymmetric; an int64 weight_shape[2]
    return QuantSpec(
        method=f"compressed-tensors:w{bits}a16",
        weight_bits=bits,
        group_size=group if strategy == "group" else 0,
        scale_bytes=0,
        zero_bits=0 if weights.get("symmetric", True) else bits,
        tensor_scale_bytes=16,
    )


def _is_class_target(target: str) -> bool:
    # vLLM matches a class name by containment: "Linear" in "QKVParallelLinear"
    return not target.startswith("re:") and "." not in target and "linear" in target.lower()


def _compressed_tensors(config: Config) -> QuantSpec:
    groups = config.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors config has no config_groups")
    default: QuantSpec | None = None
    named: list[tuple[str, QuantSpec]] = []
    for group in groups.values():
        weights = group.get("weights")
        if not isinstance(weights, Mapping):
            continue  # activation- or KV-only groups quantize no weight
        scheme = _ct_scheme(weights, group.get("input_activations"))
        for target in _names(group.get("targets")):
            if _is_class_target(target):
                default = default or scheme
            else:
                named.append((target, scheme))
    base = default or (named[0][1] if named else None)
    if base is None:
        raise ValueError("compressed-tensors config quantizes no weights")
    lm_head = any(t == "lm_head" or (t.startswith("re:") and "lm_head" in t) for t, _ in named)
    return QuantSpec(
        **{
            **_fields(base),
            "overrides": tuple(named),
            "linear": default is not None,
            "lm_head": lm_head,
            "skip_patterns": _skip_list(config, ("ignore",)),
            "match": "compressed-tensors",
        },
    )


# --- Quark (quark.py, schemes/quark_*.py) ---


def _quark_scheme(layer: Config) -> QuantSpec:
    weight = layer.get("weight")
    if isinstance(weight, list):  # W4A8 and friends list one dict per stage
        weight = weight[0] if weight else None
    if not isinstance(weight, Mapping):
        raise ValueError("Quark layer config has no weight quantization")
    dtype = str(weight.get("dtype", "")).lower()
    qscheme = str(weight.get("qscheme", "per_tensor"))
    group = _int(weight, "group_size", 0)
    acts = layer.get("input_tensors")
    static = isinstance(acts, Mapping) and not bool(acts.get("is_dynamic", True))
    if dtype.startswith("fp8"):
        return QuantSpec(
            method="quark:fp8",
            weight_bits=8,
            group_size=-1 if qscheme == "per_tensor" else 0,
            scale_bytes=4,
            tensor_scale_bytes=4 if static else 0,
        )
    if dtype == "int8":
        return QuantSpec(
            method="quark:int8",
            weight_bits=8,
            group_size=-1 if qscheme == "per_tensor" else 0,
            scale_bytes=4,
            # quark_w8a8_int8.py: fp32 input_scale, and an int8 input_zero_point kept after
            # loading when the input is asymmetric (the weight zero points are freed)
            tensor_scale_bytes=(4 + _asymmetric(acts)) if static else 0,
        )
    if dtype.startswith("fp4"):  # OCP MX: uint8 [out, in/2] + e8m0 per 32
        return QuantSpec(method="quark:mxfp4", weight_bits=4, group_size=group or 32, scale_bytes=1)
    if dtype in ("int4", "uint4"):  # W4A16: int32-packed, int32 zeros, model-dtype scales
        return QuantSpec(
            method="quark:w4a16", weight_bits=4, group_size=group, scale_bytes=0, zero_bits=4
        )
    raise ValueError(f"Quark weight dtype {dtype!r} is not supported (fp8, int8, fp4, int4)")


def _asymmetric(acts: object) -> int:
    return 1 if isinstance(acts, Mapping) and acts.get("symmetric") is False else 0


def _quark(config: Config) -> QuantSpec:
    base = _quark_scheme(config.get("global_quant_config") or {})
    per_layer = config.get("layer_quant_config") or {}
    overrides = tuple((str(k), _quark_scheme(v)) for k, v in per_layer.items())
    return QuantSpec(
        **{
            **_fields(base),
            "overrides": overrides,
            "skip_patterns": _skip_list(config, ("exclude",)),
            "match": "quark",
        }
    )


def _fp_quant(config: Config) -> QuantSpec:
    """``FPQuantLinearMethod`` (fp_quant.py): uint8 [out, in/2], uint8 scales per 32
    (mxfp4) or 16 (nvfp4), fp32 weight and activation global scales, and a
    ``hadamard_group_size``-square Hadamard matrix in the model dtype (2 B assumed) per
    linear; ``modules_to_not_convert`` matched by ``endswith``."""
    hadamard = _int(config, "hadamard_group_size", 32)
    nv = str(config.get("forward_dtype", "mxfp4")) == "nvfp4"
    return QuantSpec(
        method="fp_quant",
        weight_bits=4,
        group_size=16 if nv else 32,
        scale_bytes=1,
        module_scale_bytes=8 + hadamard * hadamard * 2,
        skip_patterns=_skip_list(config, ("modules_to_not_convert",)),
        match="endswith",
        maps_names=False,
    )


READERS: dict[str, Callable[[Config], QuantSpec]] = {
    "awq": _awq,
    "awq_marlin": _awq,
    "auto_awq": _awq,
    "gptq": _gptq,
    "gptq_marlin": _gptq,
    "auto_gptq": _gptq,
    "moe_wna16": _moe_wna16,
    "fp8": _fp8,
    "fbgemm_fp8": _fbgemm_fp8,
    "mxfp4": _mxfp4,
    "gpt_oss_mxfp4": _mxfp4,
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
    "compressed_tensors": _compressed_tensors,
    "modelopt": _modelopt,
    "modelopt_fp4": _modelopt,
    "modelopt_mxfp8": _modelopt,
    "modelopt_mixed": _modelopt,
    "mxfp8": _modelopt,
    "quark": _quark,
    "fp_quant": _fp_quant,
}
