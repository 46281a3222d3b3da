"""The decision: search, then, on a rejection, the reasons and what would fit.

Pure: ``decide`` runs ``search`` (``gatekeeper.placement.gpu_search``) and returns a
``Decision``: admitted, with the placement and every GPU's line marked (chosen, fits,
too small, or why it was passed over); or rejected, with a reason per shape tried and
per GPU, and the nearest configurations that would fit (``gatekeeper.placement.hints``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.estimator.releases import release_warning
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.models.module_names import unknown_architecture_warning
from gatekeeper.placement.budget import Need
from gatekeeper.placement.gpu_search import EstimateCache, SearchResult, search
from gatekeeper.placement.hints import rejection_reasons, suggestions
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.sizing import sequences_held, sized_for
from gatekeeper.placement.types import Decision, GpuLine, Placement, PlacementRequest
from gatekeeper.units import format_gib

__all__ = ["decide", "kv_warnings", "mark_lines", "model_warnings"]


def decide(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    *,
    reserved: Mapping[str, int] | None = None,
    workers: Mapping[str, int] | None = None,
    policy: PlacementPolicy | None = None,
    suggest: bool = True,
    cache: EstimateCache | None = None,
) -> Decision:
    """Admit ``request`` on the best-fitting GPUs of ``snapshot``, or reject it with reasons.

    ``reserved`` maps GPU UUIDs to bytes promised to workers still starting; ``workers``
    maps GPU UUIDs to the number of gatekeeper workers they host. ``suggest=False``
    leaves out the nearby configurations (each costs a search). ``cache`` keeps
    estimates across decisions.
    """
    policy = policy or PlacementPolicy()
    cache = cache if cache is not None else EstimateCache()
    found = search(
        request, snapshot, reserved=reserved, workers=workers, policy=policy, cache=cache
    )
    if found.placement is not None:
        return Decision(
            model=request.model.name,
            admitted=True,
            placement=found.placement,
            reasons=(),
            gpus=tuple(mark_lines(found.lines, found.chosen, found.needs)),
            warnings=(
                *model_warnings(request, policy),
                *kv_warnings(request, found.placement, policy),
            ),
        )
    return _reject(request, snapshot, found, policy, suggest, cache)


def mark_lines(
    lines: Iterable[GpuLine], chosen: Iterable[GpuLine], needs: Mapping[int, Need]
) -> list[GpuLine]:
    """Candidate lines marked chosen, fits or too small against ``needs``."""
    picked = {g.index for g in chosen}
    out = []
    for g in lines:
        if g.status != "candidate":
            out.append(g)
            continue
        need = needs[g.total_bytes].max_bytes if g.total_bytes in needs else None
        fits = need is not None and g.usable_bytes >= need
        status = "chosen" if g.index in picked else ("fits" if fits else "too small")
        out.append(dataclasses.replace(g, status=status, need_bytes=need))
    return out


def model_warnings(
    request: PlacementRequest, policy: PlacementPolicy | None = None
) -> tuple[str, ...]:
    """A warning when the request's vLLM release is past the newest one gatekeeper models
    (``releases.release_warning``), and when vLLM's model table lacks the model's
    architecture: its modules are then named as a plain decoder's, and a quantization
    config's per-module lists may not match them as vLLM would
    (``module_names.unknown_architecture_warning``)."""
    default = policy.default_vllm_version if policy is not None else DEFAULT_VLLM_VERSION
    release = release_warning(request.options.vllm_version or default)
    warning = unknown_architecture_warning(request.model.architecture)
    return tuple(f"{request.model.name}: {w}" for w in (release, warning) if w)


def kv_warnings(
    request: PlacementRequest, p: Placement, policy: PlacementPolicy
) -> tuple[str, ...]:
    """A warning when a KV byte budget (``share_gpus``, or the request's
    ``--kv-cache-memory-bytes``) cannot hold ``max_num_seqs`` sequences of max_model_len
    at once (a worker alone on its GPUs gets all their memory, and is not warned of): vLLM then schedules fewer (it logs the same figure at start-up
    as "Maximum concurrency for N tokens per request", ``vllm/v1/core/kv_cache_utils.py``
    ``_report_kv_cache_config``), and longer batches wait or are preempted."""
    e = p.estimate
    budgeted = policy.share_gpus or p.flags.kv_cache_memory_bytes is not None
    if not budgeted or not e.kv_block_bytes or p.kv_cache_bytes >= e.kv_bytes_for(e.max_num_seqs):
        return ()
    held = sequences_held(e, p.kv_cache_bytes)
    fix = (
        "raise --kv-cache-memory-bytes"
        if request.options.kv_cache_memory_bytes is not None
        else f"raise shared_kv_sequences (now {policy.shared_kv_sequences}) or min_sequences"
    )
    return (
        f"{request.model.name}: its KV cache ({format_gib(p.kv_cache_bytes)} per GPU) is "
        f"{sized_for(held, e.max_model_len)} at once, fewer than max_num_seqs "
        f"{e.max_num_seqs}; requests beyond that wait or are preempted. To run more at full "
        f"length, {fix}, or lower --max-model-len; else set --max-num-seqs {max(held, 1)}.",
    )


def _reject(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    found: SearchResult,
    policy: PlacementPolicy,
    suggest: bool,
    cache: EstimateCache,
) -> Decision:
    last_needs = found.tried[-1][1] if found.tried else {}
    marked = mark_lines(found.lines, (), last_needs)
    reasons = rejection_reasons(request, snapshot, marked, found.tried)
    hints = suggestions(request, snapshot, list(found.lines), policy, cache) if suggest else ()
    return Decision(
        model=request.model.name,
        admitted=False,
        placement=None,
        reasons=tuple(reasons),
        gpus=tuple(marked),
        suggestions=tuple(hints),
        warnings=model_warnings(request, policy),
    )
