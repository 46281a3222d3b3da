"""Readers of the configs that give modules schemes of their own: compressed-tensors
(``config_groups`` by target), Quark (``layer_quant_config``) and fp_quant; shapes from
each vLLM 0.32 scheme's ``create_weights`` (``model_executor/layers/quantization/``).
``quant_formats.FORMATS`` holds them with the others."""

from __future__ import annotations

from collections.abc import Mapping

from gatekeeper.models.quant_fields import Config, config_int, listed_names, skip_list, spec_fields
from gatekeeper.models.quant_spec import QuantSpec

__all__ = ["compressed_tensors", "fp_quant", "quark"]


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


def compressed_tensors(config: Config) -> QuantSpec:
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
        for target in listed_names(group.get("targets")):
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
            **spec_fields(base),
            "overrides": tuple(named),
            "linear": default is not None,
            "lm_head": lm_head,
            "skip_patterns": skip_list(config, ("ignore",)),
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
    group = config_int(weight, "group_size", 0)
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


def quark(config: Config) -> QuantSpec:
    base = _quark_scheme(config.get("global_quant_config") or {})
    per_layer = config.get("layer_quant_config") or {}
    overrides = tuple((str(k), _quark_scheme(v)) for k, v in per_layer.items())
    return QuantSpec(
        **{
            **spec_fields(base),
            "overrides": overrides,
            "skip_patterns": skip_list(config, ("exclude",)),
            "match": "quark",
        }
    )


def fp_quant(config: Config) -> QuantSpec:
    """``FPQuantLinearMethod`` (fp_quant.py): uint8 [out, in/2], uint8 scales per 32
    (mxfp4) or 16 (nvfp4), fp32 weight and activation global scales, and a
    ``hadamard_group_size``-square Hadamard matrix in the model dtype (2 B assumed) per
    linear; ``modules_to_not_convert`` matched by ``endswith``."""
    hadamard = config_int(config, "hadamard_group_size", 32)
    nv = str(config.get("forward_dtype", "mxfp4")) == "nvfp4"
    return QuantSpec(
        method="fp_quant",
        weight_bits=4,
        group_size=16 if nv else 32,
        scale_bytes=1,
        module_scale_bytes=8 + hadamard * hadamard * 2,
        skip_patterns=skip_list(config, ("modules_to_not_convert",)),
        match="endswith",
        maps_names=False,
    )
