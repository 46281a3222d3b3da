"""How vLLM accounted GPU memory, release by release.

vLLM's accounting changed over time; the estimator follows the release it is told
(``--vllm-version``), and says which accounting it used. Each ``Accounting`` is one
span of releases with the same mechanisms:

- ``engine``: V0 profiled ``max_num_seqs`` dummy sequences and sampled them; V1
  profiles ``max_num_batched_tokens`` tokens over ``min(max_num_seqs, tokens)`` requests.
- ``cuda_graphs_in_budget``: from v0.21.0 the CUDA-graph estimate is subtracted from the
  KV cache (graphs live inside ``gpu_memory_utilization x total``); before, graphs were
  captured after the KV cache was allocated, outside the budget.
- ``sampler_extra_bytes``: bytes per element of the ``[requests, padded vocab]`` sampler
  working set beyond the logits in the model dtype (fp32 copies, sort values and
  indices). Measured from vLLM's own logs (``shared/calibration``): V0 and V1 0.9-0.11
  computed full-vocab logprobs (~36 B), V1 0.8 ~10 B, V1 0.12+ ~13.4 B.
- ``non_torch_bytes``: non-torch memory that appears after vLLM's init snapshot (cuBLAS
  workspaces, lazily loaded kernels); ``non_torch_tp_bytes`` is added under TP for NCCL
  and custom all-reduce buffers allocated at the first collective.
- ``sampler_warmup_bytes``: bytes per element of the ``[requests, padded vocab]``
  working set that the profile's second sampler pass adds (0.33+).
- ``handles_before_snapshot``: cuBLAS(Lt) handles and torch's workspace for them are
  made before the init snapshot, outside the budget (0.33+).
- ``default_block_size``: ``CacheConfig.DEFAULT_BLOCK_SIZE`` (64 from 0.34).
- ``extensible_kv``: the extensible KV cache (0.34+, on unless turned off): sized after
  warm-up and CUDA-graph capture from measured memory (``extensible_kv``).

The spans of 0.33 and 0.34 were read from the releases' wheels (``vllm/_version.py``
commits g4ba787ec9 and g62d4bc3c7); each term names the file and line it follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from gatekeeper.errors import ServeOptionsError
from gatekeeper.units import GIB

__all__ = [
    "ACCOUNTINGS",
    "DEFAULT_VLLM_VERSION",
    "Accounting",
    "accounting_by_name",
    "accounting_for",
    "parse_vllm_version",
]

Version = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Accounting:
    name: str
    since: Version
    engine: Literal["v0", "v1"]
    default_utilization: float
    cuda_graphs_in_budget: bool
    hybrid_kv: bool
    sampler_extra_bytes: float
    non_torch_bytes: int
    non_torch_tp_bytes: int
    non_torch_pp_bytes: int
    chunked_prefill: Literal["never", "long", "always"]
    batch_defaults: Literal["v0", "v1-flat", "v1-by-gpu"]
    mla_align: int
    mla_block_size: int
    description: str
    sampler_warmup_bytes: float = 0.0
    """Bytes per sampler element the warm-up-params pass adds to the profile's peak."""
    handles_before_snapshot: bool = False
    """cuBLAS(Lt) handles (and torch's workspace for them) exist before the snapshot."""
    default_block_size: int = 16
    """Tokens per KV block when neither the flag nor the backend picks one."""
    extensible_kv: bool = False
    """The extensible KV cache is vLLM's default (on CUDA), sized after warm-up."""


def _gib(x: float) -> int:
    return round(x * GIB)


_V0 = Accounting(
    name="v0",
    since=(0, 0, 0),
    engine="v0",
    default_utilization=0.90,
    cuda_graphs_in_budget=False,
    hybrid_kv=False,
    sampler_extra_bytes=36.0,
    non_torch_bytes=_gib(0.2),
    non_torch_tp_bytes=_gib(0.15),
    non_torch_pp_bytes=_gib(0.2),
    chunked_prefill="never",
    batch_defaults="v0",
    mla_align=256,
    mla_block_size=16,
    description="V0 engine: profile max_num_seqs dummy sequences of max_num_batched_tokens "
    "(= max_model_len, no chunked prefill); graphs outside the budget",
)
_V1_08 = replace(
    _V0,
    name="v1-0.8",
    since=(0, 8, 0),
    engine="v1",
    sampler_extra_bytes=10.0,
    non_torch_tp_bytes=_gib(0.2),
    chunked_prefill="always",
    batch_defaults="v1-flat",
    mla_align=0,
    description="V1 engine: profile max_num_batched_tokens over min(max_num_seqs, tokens) "
    "requests; graphs outside the budget",
)
_V1_09 = replace(
    _V1_08,
    name="v1-0.9",
    since=(0, 9, 0),
    sampler_extra_bytes=36.5,
    non_torch_bytes=_gib(0.13),
    non_torch_tp_bytes=_gib(1.85),
    non_torch_pp_bytes=_gib(0.07),
    batch_defaults="v1-by-gpu",
    mla_block_size=64,
    description="V1 with batch defaults by GPU size and a full-vocab sampler warm-up",
)
_V1_010 = replace(
    _V1_09,
    name="v1-0.10",
    since=(0, 10, 0),
    hybrid_kv=True,
    description="V1 with the hybrid KV cache manager (sliding-window layers keep a window)",
)
_V1_012 = replace(
    _V1_010,
    name="v1-0.12",
    since=(0, 12, 0),
    sampler_extra_bytes=13.4,
    non_torch_bytes=_gib(0.25),
    description="V1 with the lighter sampler (as measured on v0.19.0); graphs outside the budget",
)
_V1_020 = replace(
    _V1_012,
    name="v1-0.20",
    since=(0, 20, 0),
    default_utilization=0.92,
    description="V1 with the lighter sampler; gpu_memory_utilization defaults to 0.92 from "
    "0.20.0 (vllm/config/cache.py of the 0.19.1 and 0.20.0 wheels)",
)
_V1_021 = replace(
    _V1_020,
    name="v1-0.21",
    since=(0, 21, 0),
    cuda_graphs_in_budget=True,
    description="V1 with CUDA-graph memory profiled and subtracted from the KV cache "
    "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)",
)
_V1_033 = replace(
    _V1_021,
    name="v1-0.33",
    since=(0, 33, 0),
    # v1/worker/gpu/model_runner.py:1010-1014 (0.33.0): _dummy_sampler_run runs the sampler
    # a second time with SamplingParams.for_sampler_warmup(), whose logits processing copies
    # the logits to fp32 first (v1/worker/gpu/sample/sampler.py:241-242): 4 B an element
    sampler_warmup_bytes=4.0,
    # v1/worker/gpu_worker.py:526-528 (0.33.0): a 16x16 mm and linear before the snapshot
    # (line 541) create the cuBLAS(Lt) handles, "so they count as baseline"
    handles_before_snapshot=True,
    description="V1 as since 0.21 (CUDA-graph memory profiled and subtracted from the KV "
    "cache), plus 0.33's second sampler pass with warm-up params in the profile (one more "
    "fp32 copy of the logits) and cuBLAS handles made before the init snapshot (outside "
    "the budget)",
)
_V1_034 = replace(
    _V1_033,
    name="v1-0.34",
    since=(0, 34, 0),
    # config/cache.py:185 (0.34.0): DEFAULT_BLOCK_SIZE = 64 (16 before); FlashAttention keeps
    # the default it supports (v1/attention/backend.py:158-165 and backends/flash_attn.py:372-379)
    default_block_size=64,
    # config/vllm.py:3180-3269 (0.34.0): _resolve_extensible_kv_cache turns it on on CUDA and
    # ROCm unless kv_cache_memory_bytes, num_gpu_blocks_override, elastic EP or a KV
    # connector that cannot use driver-mapped memory rules it out
    extensible_kv=True,
    description="V1 with 0.34's extensible KV cache (on by default): the KV cache is sized "
    "after warm-up and CUDA-graph capture from measured memory, min(budget - used, free - "
    "margin) - transient peak with margin = max(1 GiB, 0.75 x transient peak) "
    "(v1/worker/extensible_kv_cache.py:592-618), gpu_memory_utilization defaulting to a 1.0 "
    "cap and no start-up free-memory refusal; block size 64. With the cache off "
    "(--no-enable-extensible-kv-cache, --kv-cache-memory-bytes, --num-gpu-blocks-override) "
    "0.33's rules with block size 64",
)

ACCOUNTINGS: tuple[Accounting, ...] = (
    _V0,
    replace(
        _V0,
        name="v0-chunked",
        since=(0, 6, 0),
        chunked_prefill="long",
        description="V0 engine with chunked prefill for max_model_len > 32K (2048-token batches)",
    ),
    _V1_08,
    _V1_09,
    _V1_010,
    _V1_012,
    _V1_020,
    _V1_021,
    _V1_033,
    _V1_034,
)

DEFAULT_VLLM_VERSION = "0.34.0"
"""The vLLM release whose accounting applies when nothing names one: the newest modelled.
Settings, placement, the webhook and the estimator all default to it."""

_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_vllm_version(text: str) -> tuple[Version, bool]:
    """``'0.8.3rc2.dev'`` -> ((0, 8, 3), False); ``'0.8.2 (V0)'`` -> ((0, 8, 2), True).

    The flag says the V0 engine was forced (``VLLM_USE_V1=0``).
    """
    match = _VERSION_RE.search(text)
    if match is None:
        raise ServeOptionsError(
            f"vllm_version: {text!r} is not a version; give one such as 0.19.0 or 0.33.0 "
            "(append ' V0' for the V0 engine)",
            field="vllm_version",
            value=text,
        )
    major, minor, patch = match.group(1), match.group(2), match.group(3) or "0"
    forced_v0 = bool(re.search(r"(?<![\w.])v0(?![\w.])", text.lower()))
    return (int(major), int(minor), int(patch)), forced_v0


def accounting_by_name(name: str) -> Accounting:
    """The accounting an ``Estimate`` names."""
    return next(a for a in ACCOUNTINGS if a.name == name)


def accounting_for(text: str) -> Accounting:
    """The accounting of the named vLLM release."""
    version, forced_v0 = parse_vllm_version(text)
    chosen = ACCOUNTINGS[0]
    for accounting in ACCOUNTINGS:
        if version >= accounting.since and not (forced_v0 and accounting.engine == "v1"):
            chosen = accounting
    return chosen
