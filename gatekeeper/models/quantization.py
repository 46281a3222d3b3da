"""Quantization formats and the bytes a quantized layer takes on a GPU.

``QuantSpec`` (``quant_spec``) is built from a checkpoint's ``quantization_config`` (or
ModelOpt's ``hf_quant_config.json``) by ``quant_from_config``, through the readers of
``quant_formats``, or from a runtime ``--quantization`` flag by ``quant_from_flag``.
``QuantSpec.linear_bytes(in, out, dtype_bytes)`` gives the exact rank-local bytes vLLM
allocates for one projection, scales and zeros included, and
``for_model(names).scheme_for(name)`` the scheme a module gets (None: it stays in the
model dtype). Bits per weight:

- AWQ 4-bit, group g: ``4 + 20/g`` (4.16 at g=128); GPTQ b-bit: ``b + (16 + b)/g``
  (+ an int32 ``g_idx[in]`` with act-order);
- FP8 (fp8, ModelOpt FP8, compressed-tensors FP8, Quark FP8): 8 plus fp32 scales per
  tensor, per output channel or per 128x128 block; ModelOpt MXFP8: 8.25;
- NVFP4 (ModelOpt, compressed-tensors): 4 + 8/16 = 4.5 (an fp8 scale per 16);
  MXFP4 (gpt-oss, experts only): 4.25;
- bitsandbytes 4-bit: 4.5 with or without double quantization; 8-bit: 8 + an fp32 per row;
- experts_int8: experts 8 + an fp32 per row, linears 16.

Embeddings, lm_head (unless the config quantizes it), norms and routers stay in the
model dtype; so does every module the config lists as not converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.models.quant_formats import FORMATS
from gatekeeper.models.quant_spec import QuantSpec as QuantSpec  # where callers import it

__all__ = ["RUNTIME_METHODS", "quant_from_config", "quant_from_flag"]


def quant_from_config(config: Mapping[str, Any]) -> QuantSpec:
    """Read a checkpoint's ``quantization_config`` (or ``hf_quant_config.json``).

    Raises ``ValueError`` naming the method when it is not one we can size.
    """
    method = str(config.get("quant_method", "")).lower()
    if method in ("auto-round", "autoround", "inc"):
        # INC / AutoRound checkpoints in GPTQ packing: GPTQ's tensors (inc/inc.py)
        packing = str(config.get("packing_format", "auto_gptq")).removeprefix("auto_round:")
        method = "gptq" if packing.startswith("auto_gptq") else ""
    if not method and isinstance(config.get("quantization"), Mapping):
        method = "modelopt"  # hf_quant_config.json: {"producer": ..., "quantization": ...}
    form = FORMATS.get(method)
    if form is None:
        known = ", ".join(sorted(FORMATS))
        raise ValueError(f"quant_method {method!r} is not supported (known: {known})")
    try:
        return form.read(config)
    except (TypeError, KeyError, IndexError, AttributeError) as e:
        raise ValueError(f"{method} config is malformed ({type(e).__name__}: {e})") from e


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
    # in flight: nf4 with compressed statistics, dequantized to an fp32 absmax at load
    "bitsandbytes": QuantSpec(
        method="bitsandbytes", weight_bits=4, source="runtime", removed_in="0.32"
    ),
    # Int8OnlineMoEMethod: experts int8 with an fp32 scale per row; linears unquantized
    "experts_int8": QuantSpec(
        method="experts_int8",
        weight_bits=8,
        group_size=0,
        scale_bytes=4,
        experts_only=True,
        source="runtime",
    ),
}

CHECKPOINT_METHODS = frozenset(FORMATS)


def _same_family(name: str, checkpoint: QuantSpec) -> bool:
    base = checkpoint.method.split(":")[0]
    form = FORMATS.get(name)
    flag = (form.family if form else name).removesuffix("_marlin")
    if flag == "moe_wna16":  # vLLM's MoE kernels for a GPTQ/AWQ checkpoint: same bytes
        return base in ("gptq", "awq", "moe_wna16")
    return flag in (base, base.removesuffix("_marlin"))


def _moe_wna16(checkpoint: QuantSpec) -> QuantSpec:
    """``--quantization moe_wna16`` on a GPTQ/AWQ checkpoint: linears as the checkpoint's
    method, experts in ``MoeWNA16Method``'s layout (moe_wna16.py): uint8-packed weights,
    model-dtype scales per group, uint8-packed zeros only when asymmetric."""
    zero = checkpoint.zero_bits if checkpoint.method == "awq" else 0
    zero = zero if checkpoint.method == "awq" or checkpoint.symmetric else checkpoint.weight_bits
    experts = replace(checkpoint, method="moe_wna16", zero_bits=zero, act_order=False)
    return replace(checkpoint, experts_scheme=experts)


def quant_from_flag(flag: str, checkpoint: QuantSpec | None) -> QuantSpec | None:
    """Resolve ``--quantization FLAG`` against the checkpoint's own quantization.

    A checkpoint method (awq, gptq, fp8 …) must match what the checkpoint carries;
    an online method quantizes an unquantized checkpoint at load time.
    """
    name = flag.lower().replace("-", "_") if flag != "compressed-tensors" else flag
    if name in ("none", "auto"):
        return checkpoint
    if checkpoint is not None:
        if name == "moe_wna16" and checkpoint.method in ("gptq", "awq"):
            return _moe_wna16(checkpoint)
        if _same_family(name, checkpoint):
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
