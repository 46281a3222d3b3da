"""The flags a placement launches with, as its vLLM release takes a memory budget.

Pure. ``placement_for`` turns the chosen GPUs and the per-rank needs of one shape into
the ``Placement``: the ``LaunchFlags``, the bytes promised on each GPU until the worker
is ready, and the KV cache it gets. vLLM's ``--gpu-memory-utilization`` is a fraction of
the GPU's total memory; how the release reads it is ``gatekeeper.vllm.launch.ReleaseBudget``:

- the operator's own ``--gpu-memory-utilization``: honoured;
- a byte budget (``share_gpus``, or the operator's ``--kv-cache-memory-bytes``) on a
  release with ``--kv-cache-memory-bytes`` (0.10.2 on): that flag, sized for the KV cache
  asked for, and the smallest fraction that passes vLLM's start-up check;
- ``share_gpus`` on a release without it: the smallest fraction whose budget covers the
  worker's in-budget need, ``ceil(u x total) >= weights + non-torch + activation + KV``
  (+ CUDA graphs from 0.21), so that vLLM's profile leaves it the KV cache asked for,
  give or take the rounding to 4 decimals (at most total / 10^4, added to the promise);
- alone on its GPUs: the whole usable room as a fraction.

On a whole-device release (V1 before 0.9.1) the fraction budgets the GPU, not the worker:
it also covers what the GPU holds already (``total - free``) and the worker's CUDA
context, and such a worker never shares a GPU with another gatekeeper worker
(``search`` passes those GPUs over).

Worked example: a worker needing 19.5 GiB per rank (0.5 context + 0.88 graphs outside
the budget + 18.12 inside) on an idle 79.19 GiB H100 with ``share_gpus``: on vLLM 0.10.1,
``--gpu-memory-utilization 0.2289`` (18.12 / 79.19 rounded up) and no byte flag; on
0.8.5 (whole-device) the same plus the GPU's used memory and the context,
``(18.12 + 0.5 + used) / 79.19``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gatekeeper.estimator.accounting import accounting_by_name
from gatekeeper.estimator.overhead import pre_init_bytes
from gatekeeper.estimator.vllm_method import Estimate
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import GpuLine, Placement, PlacementRequest
from gatekeeper.vllm.launch import (
    LaunchFlags,
    ReleaseBudget,
    ceil_fraction,
    floor_fraction,
    launch_args,
    release_budget,
)

__all__ = ["FRACTION_STEP", "Need", "placement_for", "whole_device_status"]

FRACTION_STEP = 10_000
"""Fractions carry 4 decimals: rounding one up adds at most total / 10^4 bytes."""


@dataclass(frozen=True, slots=True)
class Need:
    """Per-rank bytes of one (TP, PP) shape on one GPU product."""

    estimate: Estimate
    per_stage: tuple[int, ...]
    kv_bytes: int
    static_in_budget: tuple[int, ...]
    short: str | None = None
    """Why the request's own budget cannot work on this GPU product (its
    ``gpu_memory_utilization`` or ``kv_cache_memory_bytes`` leaves less KV cache than
    one request of max_model_len needs); None when it can."""

    @property
    def max_bytes(self) -> int:
        return max(self.per_stage)


_Shares = tuple[float, int | None, tuple[int, ...]]
"""(utilization, KV byte budget or None, bytes promised per chosen GPU)."""


def whole_device_status(release: str) -> str:
    """Why a GPU that hosts gatekeeper workers cannot take a worker of ``release`` when
    its budget is the whole device: the release, the rule, and what to do instead."""
    return (
        f"in use by another gatekeeper worker, and vLLM {release} cannot share a GPU: "
        "its --gpu-memory-utilization budgets everything on the GPU (the V1 engine before "
        "0.9.1 counts other processes' memory in its profile), so its KV cache would be "
        "whatever its neighbours leave at start-up; run vLLM 0.9.1 or later "
        "(vllm_version) or give it a GPU of its own"
    )


def placement_for(
    request: PlacementRequest,
    chosen: Sequence[GpuLine],
    needs: Mapping[int, Need],
    policy: PlacementPolicy,
    release: str,
) -> Placement:
    """The placement of ``request`` on ``chosen`` with the flags ``release`` takes."""
    first = needs[chosen[0].total_bytes]
    e = first.estimate
    rules = release_budget(release)
    utilization, kv_budget, promise = _shares(request, chosen, needs, policy, rules)
    flags = LaunchFlags(
        max_model_len=e.max_model_len,
        tensor_parallel_size=e.tensor_parallel_size,
        pipeline_parallel_size=e.pipeline_parallel_size,
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=kv_budget,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
    )
    kv = first.kv_bytes if kv_budget is not None else _kv_in(chosen, needs, utilization, rules)
    return Placement(
        gpu_indices=tuple(g.index for g in chosen),
        gpu_uuids=tuple(g.uuid for g in chosen),
        promise_bytes=promise,
        flags=flags,
        args=launch_args(request.model.serve_reference, flags, request.options, release),
        estimate=e,
        kv_cache_bytes=kv,
    )


def _shares(
    request: PlacementRequest,
    chosen: Sequence[GpuLine],
    needs: Mapping[int, Need],
    policy: PlacementPolicy,
    rules: ReleaseBudget,
) -> _Shares:
    asked = request.options
    needed = tuple(needs[g.total_bytes].max_bytes for g in chosen)
    if asked.gpu_memory_utilization is not None and asked.kv_cache_memory_bytes is None:
        # the operator's own budget, honoured: vLLM takes u x total on every GPU
        return asked.gpu_memory_utilization, None, needed
    # vLLM 0.34 refuses --enable-extensible-kv-cache beside a byte budget: an operator who
    # asks for the extensible cache on a shared GPU gets a fraction as its cap instead
    extensible = asked.enable_extensible_kv_cache is True
    if asked.kv_cache_memory_bytes is not None or (
        policy.share_gpus and rules.byte_budget and not extensible
    ):
        # (an asked byte budget on a release without the flag: launch_args names the release)
        in_budget = max(max(needs[g.total_bytes].static_in_budget) for g in chosen)
        totals = min(g.total_bytes for g in chosen)
        utilization = asked.gpu_memory_utilization or ceil_fraction(in_budget, totals)
        return utilization, needs[chosen[0].total_bytes].kv_bytes, needed
    context = _context(needs[chosen[0].total_bytes].estimate)
    if policy.share_gpus:
        return _sized_fraction(chosen, needs, context, rules)
    outside = max(n.max_bytes - max(n.static_in_budget) - context for n in needs.values())
    utilization = min(
        floor_fraction(g.usable_bytes - context - outside + _held(g, context, rules), g.total_bytes)
        for g in chosen
    )
    promise = tuple(
        context + outside + int(utilization * g.total_bytes) - _held(g, context, rules) + 1
        for g in chosen
    )
    return utilization, None, promise


def _sized_fraction(
    chosen: Sequence[GpuLine], needs: Mapping[int, Need], context: int, rules: ReleaseBudget
) -> _Shares:
    """The smallest fraction that covers the in-budget need on every chosen GPU (vLLM
    takes the fewest KV blocks of all ranks, so no rank exceeds its need by more than the
    rounding, which the promise adds)."""
    utilization = max(
        ceil_fraction(
            max(needs[g.total_bytes].static_in_budget) + _held(g, context, rules), g.total_bytes
        )
        for g in chosen
    )
    slack = math.ceil(max(g.total_bytes for g in chosen) / FRACTION_STEP)
    return utilization, None, tuple(needs[g.total_bytes].max_bytes + slack for g in chosen)


def _held(g: GpuLine, context: int, rules: ReleaseBudget) -> int:
    """Bytes inside ``u x total`` that are not the worker's in-budget memory: none when the
    budget is the worker's own; on a whole-device release, what the GPU holds already
    and the worker's own CUDA context."""
    return g.total_bytes - g.free_bytes + context if rules.whole_device else 0


def _kv_in(
    chosen: Sequence[GpuLine], needs: Mapping[int, Need], utilization: float, rules: ReleaseBudget
) -> int:
    """KV bytes a utilization-sized worker gets: its budget less what is not KV (the
    fewest of all ranks, as vLLM allocates). With vLLM 0.34's extensible KV cache the
    budget is a cap, ``min(u x total, free at start - context - margin)``
    (``estimator.extensible_kv``): the margin vLLM keeps free when it sizes the cache
    after warm-up can bind before the cap does."""
    e = needs[chosen[0].total_bytes].estimate
    context = _context(e)
    out = []
    for g in chosen:
        need = needs[g.total_bytes]
        budget = int(utilization * g.total_bytes) - _held(g, context, rules)
        if need.estimate.extensible_kv_cache:  # never a whole-device release: nothing held
            budget = math.ceil(utilization * g.total_bytes)  # request_memory, utils.py:743
            margin = max(s.kv_margin_bytes for s in need.estimate.stages)
            budget = min(budget, g.free_bytes - context - margin)
        out.append(budget - (max(need.static_in_budget) - need.kv_bytes))
    return min(out)


def _context(e: Estimate) -> int:
    """What a rank holds before vLLM's snapshot: the CUDA context (NCCL under TP; from
    0.33 the cuBLAS workspace), as the estimate's accounting has it."""
    return pre_init_bytes(e.tensor_parallel_size, accounting_by_name(e.accounting))
