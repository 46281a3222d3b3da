"""The nearby configurations: what to try when a request does not fit as asked.

One menu, shared by the sidecar's rejections (``gatekeeper.placement.hints``) and the
webhook's denials (``gatekeeper.k8s.fit``), so both offer the same changes: a larger
tensor-parallel size (from the sizes placement searches, no more GPUs than one node has:
the sidecar's own, ``webhook_max_gpus_per_node`` for the webhook, default ``MAX_NODE_GPUS``), the longest ``max_model_len``
that fits (never below ``MIN_SUGGESTED_LEN``), an fp8 KV cache when the cache is
16-bit, and online fp8 weights when the model is not quantized (the flag vLLM's release
spells it with) and the GPU can run them (compute capability 7.5 or more, when known). Each caller probes them its own way and in its own order (the sidecar
with ``search`` on the node, the webhook with the estimator on the pod's GPU). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from gatekeeper.estimator.accounting import accounting_for
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.gpu_search import TP_SIZES

__all__ = [
    "FP8_WEIGHTS_MIN_CAPABILITY",
    "MAX_NODE_GPUS",
    "MIN_SUGGESTED_LEN",
    "Variant",
    "fp8_weights_run",
    "larger_sizes",
    "lighter_variants",
    "longest_length",
    "online_fp8_flag",
]

MIN_SUGGESTED_LEN = 256
"""A shorter ``max_model_len`` is not worth suggesting."""

FP8_WEIGHTS_MIN_CAPABILITY = (7, 5)
"""The least compute capability vLLM runs fp8 weights on: ``Fp8Config.get_min_capability``
and the online schemes' ``get_min_capability`` are 75 (vLLM 0.32:
``model_executor/layers/quantization/fp8.py`` and ``.../online/base.py``; vLLM refuses a
lower GPU in ``config/vllm.py``'s ``_get_quantization_config``). A V100 (7.0) gets none."""


def fp8_weights_run(capability: tuple[int, int] | None) -> bool:
    """Whether vLLM runs fp8 weights on a GPU of ``capability`` (None: unknown, assumed so)."""
    return capability is None or capability >= FP8_WEIGHTS_MIN_CAPABILITY


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Variant:
    """One change to the serving options, with its names for people."""

    kind: Literal["kv_cache_dtype", "quantization"]
    changes: Mapping[str, Any] = field(default_factory=dict)
    """``ServeOptions`` fields to replace."""
    option: str = ""
    """As an option: ``kv_cache_dtype fp8``."""
    flag: str = ""
    """As a ``vllm serve`` flag: ``--kv-cache-dtype fp8``."""


def online_fp8_flag(vllm_version: str) -> str:
    """``--quantization`` for online fp8 weights: ``fp8_per_tensor`` from vLLM 0.33."""
    return "fp8_per_tensor" if accounting_for(vllm_version).since >= (0, 33, 0) else "fp8"


def lighter_variants(
    spec: ModelSpec,
    options: ServeOptions,
    default_vllm_version: str,
    capability: tuple[int, int] | None = None,
) -> list[Variant]:
    """An fp8 KV cache (when it is ``auto``), then online fp8 weights (when neither the
    checkpoint nor the options quantize, and ``capability``, the GPU's compute capability
    when known, is at least ``FP8_WEIGHTS_MIN_CAPABILITY``)."""
    out = []
    if options.kv_cache_dtype == "auto":
        out.append(
            Variant(
                "kv_cache_dtype",
                {"kv_cache_dtype": "fp8"},
                "kv_cache_dtype fp8",
                "--kv-cache-dtype fp8",
            )
        )
    if spec.quantization is None and options.quantization is None and fp8_weights_run(capability):
        flag = online_fp8_flag(options.vllm_version or default_vllm_version)
        out.append(
            Variant(
                "quantization",
                {"quantization": flag},
                f"quantization {flag} (online fp8 weights)",
                f"--quantization {flag} (online fp8 weights)",
            )
        )
    return out


MAX_NODE_GPUS = 8
"""The most GPUs a menu offers on one node when it cannot see the node (the webhook):
NVIDIA's HGX and DGX boards carry 8, and a larger tensor-parallel group spans nodes
(the sidecar offers only what its own node has, ``search``'s shapes)."""


def larger_sizes(current: int, gpus_per_unit: int = 1, limit: int | None = None) -> tuple[int, ...]:
    """The parallel sizes (placement's TP sizes, also used for PP) above ``current``,
    smallest first; with ``limit``, only those whose ``size x gpus_per_unit`` GPUs (the
    other parallel sizes' product) a node of ``limit`` GPUs has."""
    return tuple(
        t for t in TP_SIZES if t > current and (limit is None or t * gpus_per_unit <= limit)
    )


def longest_length(probe: Callable[[int], T | None], now: int) -> tuple[int, T] | None:
    """The longest ``max_model_len`` below ``now`` (and at least ``MIN_SUGGESTED_LEN``)
    for which ``probe`` finds something, with what it found; binary search, so ``probe``
    must find something for every length below one that it finds something for."""
    lo, hi, best = MIN_SUGGESTED_LEN, now - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        found = probe(mid)
        if found is not None:
            best, lo = (mid, found), mid + 1
        else:
            hi = mid - 1
    return best
