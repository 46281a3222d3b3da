"""Weights by module group, vLLM's against gatekeeper's (#36 item 4): what vLLM built for a
quantized conformance case (``quant_conformance_vllm.py``'s row: every tensor, and the
quantize method vLLM chose for each module), put in the same groups as
``estimate(...).worst.weights_by_group``, and split the same way into what a quantized
method holds and what stays unquantized.

vLLM's side is classified by its own module tree: a tensor belongs to the group of the
module path vLLM registered it under (``...self_attn...``, ``...mlp.experts``, the
router ``...mlp.gate``, ``...shared_experts``, ``embed_tokens``, ``lm_head``,
``rotary_emb`` ...), and it is quantized when the nearest module that has a quantize
method has one other than ``Unquantized*`` (its scales and biases go with it). MLA's
dequantized copies of a quantized ``kv_b_proj`` are attention in the model dtype.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gatekeeper.estimator.weight_groups import WeightGroups

__all__ = ["DTYPES", "compare_groups", "gatekeeper_split", "vllm_split"]

DTYPES = ("bfloat16", "float16", "float32")
Split = dict[tuple[str, bool], int]
"""(group, quantized) -> bytes."""


def _vllm_group(name: str) -> str:
    if name.startswith("drafter:"):
        return "drafter"
    if "rotary_emb" in name:
        return "other"
    if any(k in name for k in ("visual", "vision", "multi_modal_projector")):
        return "vision"
    if "embed_tokens" in name or ".embedding." in name:  # gpt_oss.py: model.embedding
        return "embedding"
    if "lm_head" in name:
        return "lm_head"
    if "shared_expert" in name:
        return "mlp"
    if any(k in name for k in (".experts.", ".gate.", ".router.")):
        return "experts"
    if any(k in name for k in (".self_attn.", ".attn.", ".attention.")):
        return "attention"
    if any(k in name for k in (".linear_attn.", ".mixer.", ".mamba.")):
        return "mixer"
    if any(k in name for k in (".mlp.", ".feed_forward.")):
        return "mlp"
    return "other"


def _quantized(module: str, methods: dict[str, str]) -> bool:
    while module:
        method = methods.get(module)
        if method is not None:
            return not method.startswith("Unquantized") and "KVCache" not in method
        module = module.rpartition(".")[0]
    return False


def vllm_split(row: dict[str, Any]) -> Split:
    """vLLM's tensors, MLA copies and freed tensors by (group, quantized)."""
    methods = row["methods"]
    out: Counter[tuple[str, bool]] = Counter()
    for name, (_, _, num_bytes) in row["tensors"].items():
        out[(_vllm_group(name), _quantized(name.rsplit(".", 1)[0], methods))] += num_bytes
    for _, num_bytes in row.get("mla_copies", {}).items():
        out[("attention", False)] += num_bytes
    for name, num_bytes in row.get("freed_after_loading", {}).items():
        out[(_vllm_group(name), _quantized(name.rsplit(".", 1)[0], methods))] -= num_bytes
    return dict(out)


def gatekeeper_split(groups: WeightGroups) -> Split:
    out: Counter[tuple[str, bool]] = Counter()
    for group, fmt, num_bytes in groups.entries:
        out[(group, fmt not in DTYPES)] += num_bytes
    return dict(out)


def compare_groups(vllm: Split, gatekeeper: Split, tolerance: float) -> list[str]:
    """Each (group, quantized) whose bytes differ by more than ``tolerance`` of vLLM's
    bytes of that group, as 'group quantized|unquantized: vLLM N B, gatekeeper M B'."""
    totals: Counter[str] = Counter()
    for (group, _), num_bytes in vllm.items():
        totals[group] += num_bytes
    out = []
    for key in sorted(set(vllm) | set(gatekeeper)):
        got, want = gatekeeper.get(key, 0), vllm.get(key, 0)
        if abs(got - want) > tolerance * max(totals[key[0]], 1):
            kind = "quantized" if key[1] else "unquantized"
            out.append(f"{key[0]} {kind}: vLLM {want:,} B, gatekeeper {got:,} B")
    return out
