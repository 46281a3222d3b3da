"""vLLM 0.34's extensible KV cache: the KV cache sized after warm-up from measured memory.

With the extensible KV cache (on by default on CUDA from 0.34.0; ``plan.extensible_kv_cache``
says when) the worker reserves address space for the cache the profile leaves room for,
then, after JIT warm-up, a KV-sizing step and CUDA-graph capture, measures free memory
and commits as many blocks as ``measure_kv_cache_bytes`` allows
(``vllm/v1/worker/extensible_kv_cache.py:592-618`` of the 0.34.0 wheel)::

    non_kv_used = init_free - free - committed            weights, non-torch, CUDA graphs
    headroom    = free + committed                        what the device has left
    margin      = max(1 GiB, int(0.75 x transient_peak))  lines 64-65, 615 (3 GiB on ROCm)
    available   = min(requested - non_kv_used, headroom - margin)
                  - max(transient_peak, torch_reserve_growth)

``requested`` is ``ceil(u x total)`` with ``u`` defaulting to 1.0 (a cap, not a budget:
``config/cache.py:494-501``), and the start-up refusal "Free memory on device ... is less
than desired GPU memory utilization" is skipped (``v1/worker/utils.py:783-786``).
``transient_peak`` starts as the profile's activation peak (the CUDA-graph estimate is 0:
``v1/worker/gpu/model_runner.py:1123-1125``, ``gpu_worker.py:771-773`` and ``946-948``) and
grows to any larger peak of the warm-up steps (``record_transient_peak``, lines 268-278);
``torch_reserve_growth`` is the sizing step's growth of torch's reservation
(``v1/worker/gpu/warmup.py:452-479``). The graphs are measured, inside ``non_kv_used``.

In the estimator's terms, for one rank whose GPU has ``free`` bytes when vLLM starts
(the total when unknown) and holds ``pre_init`` bytes before vLLM's snapshot::

    init_free   = free - pre_init
    non_kv_used = weights + non_torch + cuda_graphs
    KV          = min(requested - non_kv_used, init_free - non_kv_used - margin) - activation

that is, the older spans' ``KV = budget - used - activation`` with the budget
``min(requested, init_free - margin)``: on a GPU of its own with ``u`` unset,
``total - pre_init - margin``. The margin, not 0.92 of the total, is what stays free.
gatekeeper keeps ``KV`` negative where it is short (vLLM clamps it at 0, line 618, and
refuses to start), as for the older spans. Not modelled: the torch-reservation growth beyond the allocated peak
(fragmentation, measured only on a GPU), a warm-up step's peak above the profile's (the
sizing step's prompt logprobs run in 1,024-row chunks, ``sample/prompt_logprob.py:20``, the
size of the profile's sampler), and the 2 MiB granules each layer's segment is rounded to
(``blocks_within``, lines 305-318: at most one granule a layer).

Worked example: Llama-3.1-8B bf16 on an H100 (79.19 GiB), vLLM 0.34 at 8,192 tokens:
used = weights 14.99 + non-torch 0.22 + graphs 0.88 = 16.09 GiB; held before the snapshot
0.53 GiB (CUDA context and the cuBLAS workspace); activation 2.37 GiB, margin 0.75 x 2.37
= 1.78 GiB; KV = 79.19 - 0.53 - 16.09 - 1.78 - 2.37 = 58.42 GiB, in 64-token blocks of
8 MiB (vLLM 0.33: 0.92 x 79.19 - 16.09 - 2.37 = 54.39 GiB).
"""

from __future__ import annotations

from gatekeeper.units import GIB

__all__ = [
    "KV_CACHE_MARGIN_FLOOR_BYTES",
    "KV_CACHE_MARGIN_FRACTION",
    "KV_CACHE_NON_TORCH_RESERVE_BYTES",
    "kv_cache_available",
    "kv_cache_margin",
    "measure_kv_cache_bytes",
]

KV_CACHE_MARGIN_FLOOR_BYTES = 1 * GIB
"""``KV_CACHE_MARGIN_FLOOR_BYTES`` on CUDA (extensible_kv_cache.py:64; 3 GiB on ROCm)."""
KV_CACHE_MARGIN_FRACTION = 0.75
"""``KV_CACHE_MARGIN_FRACTION`` (extensible_kv_cache.py:65)."""
KV_CACHE_NON_TORCH_RESERVE_BYTES = GIB // 2
"""What vLLM keeps free for allocations outside torch once the cache is sized: torch's
allocator is capped at its reservation plus what stays free less this
(extensible_kv_cache.py:71, 683-692). Part of the margin, not taken from the KV cache."""


def kv_cache_margin(transient_peak_bytes: int) -> int:
    """``margin = max(KV_CACHE_MARGIN_FLOOR_BYTES, int(transient_peak * 0.75))``
    (extensible_kv_cache.py:615): device memory left free beyond the transient peak."""
    return max(KV_CACHE_MARGIN_FLOOR_BYTES, int(transient_peak_bytes * KV_CACHE_MARGIN_FRACTION))


def kv_cache_available(
    *,
    init_free_memory: int,
    free_memory: int,
    committed_bytes: int,
    requested_memory: int,
    transient_peak_bytes: int = 0,
    torch_reserve_growth_bytes: int = 0,
) -> int:
    """``measure_kv_cache_bytes``' ``available`` before it is clamped at 0
    (extensible_kv_cache.py:613-617): negative by what the KV cache is short of."""
    non_kv_used = init_free_memory - free_memory - committed_bytes  # line 613
    headroom = free_memory + committed_bytes  # line 614
    margin = kv_cache_margin(transient_peak_bytes)  # line 615
    available = min(requested_memory - non_kv_used, headroom - margin)  # line 616
    return available - max(transient_peak_bytes, torch_reserve_growth_bytes)  # line 617


def measure_kv_cache_bytes(**measured: int) -> int:
    """Bytes the KV cache may take given the memory measured after warm-up, as
    ``measure_kv_cache_bytes`` (extensible_kv_cache.py:592-618) computes them: what
    ``kv_cache_available`` says of the same keywords, 0 when nothing is left (line 618: vLLM
    then commits no block and refuses to start)."""
    return max(kv_cache_available(**measured), 0)
