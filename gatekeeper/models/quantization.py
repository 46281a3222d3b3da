"""Quantization formats and the bytes a quantized linear layer takes on a GPU.

``QuantSpec`` is built from a checkpoint's ``quantization_config`` or from a runtime
``--quantization`` flag. ``linear_bytes(in, out, dtype_bytes)`` gives the exact
rank-local bytes vLLM allocates for one linear layer, scales and zeros included:

- AWQ 4-bit, group g: qweight int32 ``[in, out/8]``, qzeros int32 ``[in/g, out/8]``,
  scales ``[in/g, out]`` in the model dtype: ``4 + 20/g`` bits per weight (4.16 at g=128).
- GPTQ b-bit, group g: ``b + (16 + b)/g`` bits (qzeros are stored even when symmetric);
  act-order adds an int32 ``g_idx[in]``.
- FP8: 1 byte per weight plus fp32 scales per tensor, per output channel or per
  128x128 block.
- MXFP4 (gpt-oss): 4 bits plus one e8m0 byte per 32 weights (4.25 bits), experts only.
- bitsandbytes 4-bit: 4 bits plus an fp32 absmax per 64 weights (4.5 bits), or with
  double quantization an int8 absmax plus an fp32 per 256 blocks (~4.13 bits).

Embeddings, lm_head (unless the config says it is quantized), norms and routers stay
in the model dtype; ``skips(name)`` applies the config's ``modules_to_not_convert`` /
``ignore`` lists.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.units import cdiv, round_up

__all__ = ["RUNTIME_METHODS", "QuantSpec", "quant_from_config", "quant_from_flag"]


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """How the linear weights are stored on the GPU."""

    method: str
    weight_bits: int
    group_size: int = 0
    """Weights per scale along the input dimension; 0 = one scale per output channel,
    -1 = one scale per tensor."""
    scale_bytes: int = 2
    zero_bits: int = 0
    """Bits of a packed zero point per group (AWQ/GPTQ store 4-bit zeros in int32)."""
    block: tuple[int, int] | None = None
    """Block quantization (rows, cols) with one scale per block (FP8 128x128)."""
    act_order: bool = False
    double_quant: bool = False
    experts_only: bool = False
    """Only MoE experts are quantized (MXFP4); every other linear stays in the model dtype."""
    lm_head: bool = False
    moe_intermediate_multiple: int = 1
    """Kernels that pad each expert's intermediate size to a multiple (MXFP4: 256)."""
    skip_patterns: tuple[str, ...] = ()
    source: str = "checkpoint"

    @property
    def label(self) -> str:
        return f"{self.method} ({self.source})"

    def skips(self, module_name: str) -> bool:
        """True when ``module_name`` (HF naming) is listed as not converted."""
        for pattern in self.skip_patterns:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module_name):
                    return True
            elif "*" in pattern:
                if fnmatch.fnmatchcase(module_name, pattern) or fnmatch.fnmatchcase(
                    module_name, pattern + ".*"
                ):
                    return True
            elif (
                module_name == pattern
                or module_name.startswith(pattern + ".")
                or (pattern in module_name and not pattern.startswith("model.layers."))
            ):
                return True
        return False

    def linear_bytes(self, in_features: int, out_features: int, dtype_bytes: int) -> int:
        """Bytes of one rank-local linear weight ``[out, in]`` in this format."""
        weights = in_features * out_features * self.weight_bits // 8
        return weights + self._scale_bytes(in_features, out_features, dtype_bytes)

    def _scale_bytes(self, in_features: int, out_features: int, dtype_bytes: int) -> int:
        if self.method == "bitsandbytes":
            return self._bnb_scale_bytes(in_features * out_features, out_features)
        scale = self.scale_bytes if self.scale_bytes > 0 else dtype_bytes
        extra = in_features * 4 if self.act_order else 0
        if self.block is not None:
            rows, cols = self.block
            return cdiv(out_features, rows) * cdiv(in_features, cols) * scale + extra
        if self.group_size < 0:
            return scale + extra
        groups = 1 if self.group_size == 0 else cdiv(in_features, self.group_size)
        scales = groups * out_features * scale
        zeros = groups * out_features * self.zero_bits // 8
        return scales + zeros + extra

    def _bnb_scale_bytes(self, numel: int, out_features: int) -> int:
        if self.weight_bits == 8:
            return out_features * 4
        blocks = cdiv(numel, 64)
        if self.double_quant:
            return blocks + cdiv(blocks, 256) * 4
        return blocks * 4

    def expert_intermediate(self, intermediate_per_rank: int) -> int:
        return round_up(intermediate_per_rank, self.moe_intermediate_multiple)


def _int(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    return default if value is None else int(value)


def _skip_list(config: Mapping[str, Any]) -> tuple[str, ...]:
    for key in ("modules_to_not_convert", "ignored_layers", "ignore", "llm_int8_skip_modules"):
        value = config.get(key)
        if value:
            return tuple(str(v) for v in value)
    return ()


def _awq(config: Mapping[str, Any]) -> QuantSpec:
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
        skip_patterns=_skip_list(config),
    )


def _gptq(config: Mapping[str, Any]) -> QuantSpec:
    bits = _int(config, "bits", 4)
    group = _int(config, "group_size", 128)
    return QuantSpec(
        method="gptq",
        weight_bits=bits,
        group_size=0 if group == -1 else group,
        scale_bytes=0,
        zero_bits=bits,
        act_order=bool(config.get("desc_act", False)),
        lm_head=bool(config.get("lm_head", False)),
        skip_patterns=_skip_list(config),
    )


def _fp8(config: Mapping[str, Any]) -> QuantSpec:
    block = config.get("weight_block_size")
    return QuantSpec(
        method="fp8",
        weight_bits=8,
        group_size=-1 if not block else 0,
        scale_bytes=4,
        block=(int(block[0]), int(block[1])) if block else None,
        skip_patterns=_skip_list(config),
    )


def _fbgemm_fp8(config: Mapping[str, Any]) -> QuantSpec:
    return QuantSpec(
        method="fbgemm_fp8", weight_bits=8, group_size=0, scale_bytes=4,
        skip_patterns=_skip_list(config),
    )  # fmt: skip


def _mxfp4(config: Mapping[str, Any]) -> QuantSpec:
    return QuantSpec(
        method="mxfp4",
        weight_bits=4,
        group_size=32,
        scale_bytes=1,
        experts_only=True,
        moe_intermediate_multiple=256,
        skip_patterns=_skip_list(config),
    )


def _bitsandbytes(config: Mapping[str, Any]) -> QuantSpec:
    eight = bool(config.get("load_in_8bit", False))
    return QuantSpec(
        method="bitsandbytes",
        weight_bits=8 if eight else 4,
        double_quant=bool(config.get("bnb_4bit_use_double_quant", False)),
        skip_patterns=_skip_list(config),
    )


def _compressed_tensors(config: Mapping[str, Any]) -> QuantSpec:
    groups = config.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors config has no config_groups")
    weights = next(iter(groups.values())).get("weights") or {}
    bits = int(weights.get("num_bits", 8))
    strategy = str(weights.get("strategy", "tensor"))
    group = int(weights.get("group_size") or 0) if strategy == "group" else 0
    block = weights.get("block_structure") if strategy == "block" else None
    symmetric = bool(weights.get("symmetric", True))
    kind = "fp8" if weights.get("type") == "float" and bits == 8 else f"w{bits}"
    return QuantSpec(
        method=f"compressed-tensors:{kind}",
        weight_bits=bits,
        group_size=-1 if strategy == "tensor" else group,
        scale_bytes=4 if kind == "fp8" or strategy == "channel" else 2,
        zero_bits=0 if symmetric else 8,
        block=(int(block[0]), int(block[1])) if block else None,
        skip_patterns=_skip_list(config),
    )


_FROM_CONFIG = {
    "awq": _awq,
    "awq_marlin": _awq,
    "gptq": _gptq,
    "gptq_marlin": _gptq,
    "fp8": _fp8,
    "fbgemm_fp8": _fbgemm_fp8,
    "mxfp4": _mxfp4,
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
    "compressed_tensors": _compressed_tensors,
}


def quant_from_config(config: Mapping[str, Any]) -> QuantSpec:
    """Read a checkpoint's ``quantization_config``.

    Raises ``ValueError`` naming the method when it is not one we can size.
    """
    method = str(config.get("quant_method", "")).lower()
    if method == "auto-round" or method == "autoround":
        method = "gptq" if str(config.get("packing_format", "gptq")).startswith("auto_gptq") else ""
    reader = _FROM_CONFIG.get(method)
    if reader is None:
        known = ", ".join(sorted(_FROM_CONFIG))
        raise ValueError(f"quant_method {method!r} is not supported (known: {known})")
    return reader(config)


RUNTIME_METHODS: dict[str, QuantSpec] = {
    "fp8": QuantSpec(method="fp8", weight_bits=8, group_size=-1, scale_bytes=4, source="runtime"),
    "fp8_per_tensor": QuantSpec(
        method="fp8_per_tensor", weight_bits=8, group_size=-1, scale_bytes=4, source="runtime"
    ),
    "fp8_per_channel": QuantSpec(
        method="fp8_per_channel", weight_bits=8, group_size=0, scale_bytes=4, source="runtime"
    ),
    "fp8_per_block": QuantSpec(
        method="fp8_per_block", weight_bits=8, block=(128, 128), scale_bytes=4, source="runtime"
    ),
    "int8_per_channel_weight_only": QuantSpec(
        method="int8_per_channel_weight_only", weight_bits=8, scale_bytes=4, source="runtime"
    ),
    "mxfp8": QuantSpec(
        method="mxfp8", weight_bits=8, group_size=32, scale_bytes=1, source="runtime"
    ),
    "nvfp4_per_token": QuantSpec(
        method="nvfp4_per_token", weight_bits=4, group_size=16, scale_bytes=1, source="runtime"
    ),
    "bitsandbytes": QuantSpec(method="bitsandbytes", weight_bits=4, source="runtime"),
}

CHECKPOINT_METHODS = frozenset(_FROM_CONFIG)


def quant_from_flag(flag: str, checkpoint: QuantSpec | None) -> QuantSpec | None:
    """Resolve ``--quantization FLAG`` against the checkpoint's own quantization.

    A checkpoint method (awq, gptq, fp8 …) must match what the checkpoint carries;
    an online method quantizes an unquantized checkpoint at load time.
    """
    name = flag.lower().replace("-", "_") if flag != "compressed-tensors" else flag
    if name in ("none", "auto"):
        return checkpoint
    if checkpoint is not None:
        base = checkpoint.method.split(":")[0].replace("-", "_")
        if name.removesuffix("_marlin") in (base, base.removesuffix("_marlin")):
            return checkpoint
        raise ServeOptionsError(
            f"quantization: {flag!r} does not match the checkpoint, which is already "
            f"quantized with {checkpoint.method}; drop --quantization or pass {checkpoint.method}",
            field="quantization",
            value=flag,
        )
    if name in RUNTIME_METHODS:
        return RUNTIME_METHODS[name]
    if name in CHECKPOINT_METHODS:
        raise ServeOptionsError(
            f"quantization: {flag!r} needs a checkpoint quantized with {flag} (this one is not); "
            f"use an online method instead: {', '.join(sorted(RUNTIME_METHODS))}",
            field="quantization",
            value=flag,
        )
    known = ", ".join(sorted({*RUNTIME_METHODS, *CHECKPOINT_METHODS}))
    raise ServeOptionsError(
        f"quantization: {flag!r} is not a quantization method gatekeeper can size; use one of {known}",
        field="quantization",
        value=flag,
    )
