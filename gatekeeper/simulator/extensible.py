"""A vLLM 0.34 worker's memory: the extensible KV cache, its lines and its failures.

Part of the gatekeeper simulator, written from vLLM 0.34.0's source on its own (the
simulator imports nothing of the estimator; ``gatekeeper.simulator`` says why). A 0.34
worker (``GATEKEEPER_SIM_VLLM_VERSION=0.34.0``) differs from 0.33's in:

- the extensible KV cache, on unless ``--kv-cache-memory-bytes`` or
  ``--no-enable-extensible-kv-cache`` turns it off (``config/vllm.py:3180-3269``,
  ``_resolve_extensible_kv_cache``; ``--enable-extensible-kv-cache`` beside a byte budget
  is refused, line 3262). With it ``--gpu-memory-utilization`` defaults to a 1.0 cap
  (``config/cache.py:494-501``) and the start-up refusal "Free memory on device ... is less
  than desired GPU memory utilization" is skipped (``v1/worker/utils.py:783-797``);
  "Available KV cache memory" is the address space reserved, ``requested - weights -
  non-torch - activation`` (``gpu_worker.py:776-780``, no CUDA-graph estimate:
  ``v1/worker/gpu/model_runner.py:1121-1125``); after warm-up and graph capture
  ``measure_kv_cache_bytes`` (``v1/worker/extensible_kv_cache.py:592-618``) sizes it::

      used      = weights + non-torch + CUDA graphs     (init_free - free - committed)
      margin    = max(1 GiB, int(0.75 x activation))    (lines 64-65, 615)
      available = min(requested - used, init_free - used - margin) - activation

  the activation being the transient peak kept free (``reserved_headroom_bytes``, the
  profile's peak; the simulator's warm-up steps peak no higher and torch's reservation
  does not grow); the blocks are ``available // block bytes`` (``blocks_within``, one
  segment, no granule rounding), at most the reservation's. Then "Memory after warmup: ..."
  (line 693), ``max_model_len`` checked against the blocks (``kv_cache_planning.py:
  shrink_kv_cache_configs``, the null block held back), "GPU KV cache size: N tokens"
  (``kv_cache_utils.py:1168``) and "Extended KV cache to N blocks (X GiB)." (line 536);
- the default block size, 64 (``config/cache.py:185``);
- with the cache off, no "Estimated CUDA graph memory" line: "CUDA graph memory profiling
  is enabled ..." (``gpu_worker.py:809``) instead; and the wording of the KV-memory
  errors (``kv_cache_planning.py:64-130``).

``GATEKEEPER_SIM_KV_BYTES`` (the rehearsal's prediction) still names the KV cache; without
it the measured ``available`` is the cache. The bytes held are then used + activation +
KV cache (``GATEKEEPER_SIM_ACTUAL_BYTES`` when set). Not played: "Remapping the KV cache"
(warm-up committing more than the budget), "Disabling the extensible KV cache" (no VMM
driver), ``--num-gpu-blocks-override`` and ``--max-model-len auto``'s refit after warm-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from gatekeeper.simulator.memory import (
    DEFAULT_TOTAL_BYTES,
    DOCS,
    SHARES,
    MemoryPlan,
    StartupFailure,
    fmt,
    kv_capacity,
)
from gatekeeper.units import GIB, MIB, cdiv

__all__ = [
    "BLOCK_SIZE",
    "FIRST_RELEASE",
    "ExtensibleSizing",
    "config_error",
    "extensible_kv_cache",
    "graph_profiling_line",
    "kv_memory_failure",
    "plan_extensible",
    "resolved_utilization",
]

FIRST_RELEASE = "0.34.0"
"""The first release with the extensible KV cache and 64-token blocks."""
BLOCK_SIZE = 64
"""``CacheConfig.DEFAULT_BLOCK_SIZE`` from 0.34 (``config/cache.py:185``)."""
MARGIN_FLOOR_BYTES = 1 * GIB
"""``KV_CACHE_MARGIN_FLOOR_BYTES`` on CUDA (``extensible_kv_cache.py:64``)."""
MARGIN_FRACTION = 0.75
"""``KV_CACHE_MARGIN_FRACTION`` (``extensible_kv_cache.py:65``)."""
NON_TORCH_RESERVE_BYTES = 512 * MIB
"""``KV_CACHE_NON_TORCH_RESERVE_BYTES`` on CUDA (``extensible_kv_cache.py:71``)."""
DEFAULT_UTILIZATION = 0.92
"""``CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION``: the fraction with the cache off."""


def extensible_kv_cache(args: argparse.Namespace) -> bool:
    """Whether a 0.34 worker with ``args`` sizes its KV cache after warm-up."""
    return args.kv_cache_memory_bytes is None and args.enable_extensible_kv_cache is not False


def config_error(args: argparse.Namespace) -> str | None:
    """vLLM 0.34's refusal of ``--enable-extensible-kv-cache`` beside a byte budget
    (``config/vllm.py:3203-3207``, 3262), or None."""
    if args.enable_extensible_kv_cache and args.kv_cache_memory_bytes is not None:
        return (
            "enable_extensible_kv_cache: it sizes the KV cache from measured memory, which "
            "kv_cache_memory_bytes overrides."
        )
    return None


def resolved_utilization(args: argparse.Namespace) -> float:
    """``CacheConfig.resolved_gpu_memory_utilization`` (``config/cache.py:494-501``)."""
    if args.gpu_memory_utilization is not None:
        return float(args.gpu_memory_utilization)
    return 1.0 if extensible_kv_cache(args) else DEFAULT_UTILIZATION


@dataclasses.dataclass(frozen=True, slots=True)
class ExtensibleSizing:
    """What the extensible KV cache's sizing after warm-up measured and committed."""

    capacity_bytes: int
    """"Available KV cache memory": the reservation, ``requested - non-KV - activation``."""
    init_free_bytes: int
    free_bytes: int
    """Free after warm-up and capture, with ``committed_bytes`` of the cache committed."""
    committed_bytes: int
    transient_bytes: int
    margin_bytes: int
    available_bytes: int
    """``measure_kv_cache_bytes``: what the cache may take (at least 0)."""
    block_bytes: int
    num_blocks: int
    torch_limit_bytes: int

    @property
    def kv_bytes(self) -> int:
        """The committed cache's bytes (``num_blocks`` blocks)."""
        return self.num_blocks * self.block_bytes

    def after_warmup_line(self, requested_bytes: int) -> str:
        """``measure_kv_cache_blocks``' line (``extensible_kv_cache.py:693-707``)."""
        return (
            f"Memory after warmup: {fmt(self.free_bytes)} GiB free, "
            f"{fmt(self.committed_bytes)} GiB committed to the KV cache, "
            f"{fmt(self.transient_bytes)} GiB kept for transient activations "
            f"({fmt(self.transient_bytes)} GiB allocated at peak, {fmt(0)} GiB of torch "
            f"reservation growth); {self.num_blocks} KV cache blocks ({fmt(self.kv_bytes)} GiB) "
            f"fit within the requested {fmt(requested_bytes)} GiB. Torch may reserve up to "
            f"{fmt(self.torch_limit_bytes)} GiB."
        )

    def extended_line(self) -> str:
        """``extend_kv_cache``'s line (``extensible_kv_cache.py:536-540``: ``%.2f`` of the
        physical bytes)."""
        return f"Extended KV cache to {self.num_blocks} blocks ({self.kv_bytes / GIB:.2f} GiB)."


def plan_extensible(
    env: Any,
    args: argparse.Namespace,
    block_bytes: int,
    total_bytes: int | None = None,
    free_bytes: int | None = None,
) -> tuple[MemoryPlan, ExtensibleSizing]:
    """The figures of a 0.34 worker with the extensible KV cache on one GPU of
    ``total_bytes`` with ``free_bytes`` free (the total when not known), and its sizing.
    The components not given are split from ``GATEKEEPER_SIM_ACTUAL_BYTES``, else from
    the requested memory (``SHARES``); the KV cache is the given one, else measured."""
    total = env.gpu_total_bytes or total_bytes or DEFAULT_TOTAL_BYTES
    init_free = total if free_bytes is None else free_bytes
    u = resolved_utilization(args)
    requested = math.ceil(u * total)  # v1/worker/utils.py:743
    given = dict(env.components)
    base = env.actual_bytes if env.actual_bytes is not None else requested
    shares = dict(SHARES)
    if args.enforce_eager:
        shares["weights"] += shares.pop("cuda_graph")
    parts = {name: given.get(name, int(base * share)) for name, share in shares.items()}
    parts["cuda_graph"] = 0 if args.enforce_eager else parts.get("cuda_graph", 0)
    activation = parts["activation"]
    used = parts["weights"] + parts["non_torch"] + parts["cuda_graph"]
    capacity = requested - (parts["weights"] + parts["non_torch"] + activation)
    committed = block_bytes  # the null block, committed at allocation
    margin = max(MARGIN_FLOOR_BYTES, int(activation * MARGIN_FRACTION))  # line 615
    # extensible_kv_cache.py:613-618, free = init_free - used - committed
    available = max(min(requested - used, init_free - used - margin) - activation, 0)
    kv = given.get("kv", available)
    num_blocks = max(min(kv, capacity) // block_bytes, 0) if block_bytes else 0
    free_after = init_free - used - committed
    left_free = free_after - (num_blocks * block_bytes - committed) - NON_TORCH_RESERVE_BYTES
    sizing = ExtensibleSizing(
        capacity_bytes=capacity,
        init_free_bytes=init_free,
        free_bytes=free_after,
        committed_bytes=committed,
        transient_bytes=activation,
        margin_bytes=margin,
        available_bytes=available,
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        torch_limit_bytes=parts["weights"] + parts["cuda_graph"] + max(left_free, 0),
    )
    actual = env.actual_bytes
    if actual is None:
        actual = used + activation + sizing.kv_bytes
    plan = MemoryPlan(
        total_bytes=total,
        free_bytes=init_free,
        utilization=u,
        requested_bytes=requested,
        actual_bytes=actual,
        weights_bytes=parts["weights"],
        non_torch_bytes=parts["non_torch"],
        activation_bytes=activation,
        cuda_graph_bytes=parts["cuda_graph"],
        kv_bytes=sizing.kv_bytes,
        capacity_bytes=capacity,
    )
    return plan, sizing


def graph_profiling_line(plan: MemoryPlan) -> str:
    """``determine_available_memory``'s note on the CUDA-graph estimate with the cache off
    (``gpu_worker.py:800-819``)."""
    u = plan.utilization
    delta = plan.cuda_graph_bytes / plan.total_bytes
    return (
        "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
        f"--gpu-memory-utilization={u:.4f} is equivalent to "
        f"--gpu-memory-utilization={round(u - delta, 4):.4f} without CUDA graph memory "
        "profiling. To maintain the same effective KV cache size as before, increase "
        f"--gpu-memory-utilization to {min(round(u + delta, 4), 1.0):.4f}. To disable, set "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0."
    )


def _hint(extensible: bool, utilization: float, after_warmup: bool) -> str:
    """``_more_kv_cache_memory_hint`` (``kv_cache_planning.py:64-96``)."""
    if not extensible:
        return (
            "Try increasing `gpu_memory_utilization` when initializing the engine (this flag "
            "also controls CPU memory reservation on the CPU backend, despite its name)."
        )
    used_by, graphs = "the model and its activations", ""
    if after_warmup:
        used_by = "the model, its activations, CUDA graphs and warmup"
        graphs = (
            " CUDA graphs take less with fewer or smaller capture sizes in the compilation config."
        )
    if utilization < 1.0:
        return (
            f"The KV cache gets what is left after {used_by} within "
            f"`gpu_memory_utilization`={utilization}; increase it (with the extensible KV "
            f"cache it defaults to 1.0) or decrease `max_model_len` or `max_num_seqs`.{graphs}"
        )
    return (
        f"The extensible KV cache already takes all device memory left after {used_by}; "
        "decrease `max_model_len` or `max_num_seqs`, or the model needs a device with more "
        f"memory.{graphs}"
    )


def kv_memory_failure(
    plan: MemoryPlan,
    args: argparse.Namespace,
    max_model_len: int,
    kv_bytes: int,
    bytes_per_token: int | None,
    *,
    extensible: bool,
    after_warmup: bool = False,
    forced: bool = False,
) -> StartupFailure | None:
    """``_check_enough_kv_cache_memory`` (``kv_cache_planning.py:99-130``) of 0.34 for a KV
    cache of ``kv_bytes``, one block held back (the null block, lines 1635-1643 and
    1847-1851): None when ``max_model_len`` fits (``forced``: it never does)."""
    capacity = kv_capacity(
        dataclasses.replace(plan, kv_bytes=kv_bytes),
        max_model_len,
        args,
        bytes_per_token,
        default_block_size=BLOCK_SIZE,
    )
    block = capacity.block_bytes
    hint = _hint(extensible, plan.utilization, after_warmup)
    available = (capacity.num_blocks - 1) * block if after_warmup else kv_bytes - block
    if available <= 0:
        return StartupFailure(
            f"ValueError: No available memory for the cache blocks. {hint} See {DOCS} for "
            "more details."
        )
    needed = block * capacity.blocks_per_request
    if forced:  # a bigger model: a request needs half again what there is
        block = max(block, cdiv(available * 3 // 2, capacity.blocks_per_request))
        needed = block * capacity.blocks_per_request
    if needed <= available:
        return None
    estimate = min(available // block * capacity.block_size, max_model_len - 1)
    based = (
        f"Based on the available memory, the estimated maximum model length is {estimate}. "
        if estimate > 0
        else ""
    )
    return StartupFailure(
        "ValueError: To serve at least one request with the model's max seq len "
        f"({max_model_len}), ({fmt(needed)} GiB KV cache is needed, which is larger than the "
        f"available KV cache memory ({fmt(available)} GiB). {based}{hint} Decreasing "
        f"`max_model_len` also reduces what is needed. See {DOCS} for more details."
    )
