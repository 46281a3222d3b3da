"""Why a request was rejected, and the nearest configurations that would fit.

Every rejection names the model, what it needs per GPU, what each GPU has usable and
why it was passed over, then tries the menu of ``gatekeeper.placement.nearby`` in
order: the largest ``max_model_len`` that fits, an fp8 KV cache, online fp8 weights, a
larger tensor-parallel group; and, when none of those fits, whether the model fits on
this node once its GPUs are idle, or not at all. Each variant is probed with
``search``, never with ``decide``: a probe needs no reasons of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.gpus.products import best_capability
from gatekeeper.placement.budget import Need
from gatekeeper.placement.gpu_search import EstimateCache, Shape, search
from gatekeeper.placement.nearby import lighter_variants, longest_length
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.sizing import kv_text, need_text
from gatekeeper.placement.types import GpuLine, Placement, PlacementRequest, Suggestion
from gatekeeper.units import format_gib

__all__ = ["rejection_reasons", "share_suggestion", "suggestions"]


def rejection_reasons(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    lines: Sequence[GpuLine],
    tried: Sequence[tuple[Shape, Mapping[int, Need]]],
) -> list[str]:
    name = request.model.name
    if not snapshot.ok:
        return [f"{name}: the GPU snapshot failed ({snapshot.error}); nothing can be placed"]
    reasons: list[str] = []
    if not any(g.status in ("too small", "fits", "candidate") for g in lines):
        why = "; ".join(dict.fromkeys(f"GPU {g.index} {g.status}" for g in lines))
        reasons.append(f"{name}: no GPU on this node can take work ({why})")
    for (tp, pp), needs in tried:
        need = needs[max(needs)]  # on the largest GPU product
        reasons.append(need_text(name, tp, pp, need.estimate, need.max_bytes, need.kv_bytes))
        if need.estimate.length_beyond_model:
            reasons += [r for r in need.estimate.reasons if r.startswith("max_model_len")]
        reasons += [f"{name} at TP={tp}: {n.short}" for n in needs.values() if n.short]
    reasons += [g.text() for g in lines]
    return reasons


@dataclass(frozen=True, slots=True)
class _Probe:
    """The rejected request's situation, to try variants of it against."""

    request: PlacementRequest
    snapshot: InventorySnapshot
    policy: PlacementPolicy
    reserved: dict[str, int]
    workers: dict[str, int]
    cache: EstimateCache

    def placed(self, **changes: Any) -> Placement | None:
        """Where the request with ``changes`` would go, if anywhere."""
        try:
            return search(
                dataclasses.replace(self.request, **changes),
                self.snapshot,
                reserved=self.reserved,
                workers=self.workers,
                policy=self.policy,
                cache=self.cache,
            ).placement
        except GatekeeperError:
            return None


def _where(p: Placement) -> str:
    gpus = ", ".join(str(i) for i in p.gpu_indices)
    return f"GPU {gpus}" if len(p.gpu_indices) == 1 else f"GPUs {gpus}"


def suggestions(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    lines: Sequence[GpuLine],
    policy: PlacementPolicy,
    cache: EstimateCache | None = None,
) -> list[Suggestion]:
    probe = _Probe(
        request,
        snapshot,
        policy,
        reserved={g.uuid: g.reserved_bytes for g in lines if g.reserved_bytes},
        workers={g.uuid: g.workers for g in lines if g.workers},
        cache=cache if cache is not None else EstimateCache(),
    )
    found = [_shared(probe), _shorter(probe), *_lighter(probe), _parallel(probe)]
    out = [s for s in found if s is not None]
    return out or _idle(probe, lines)


def _shared(probe: _Probe) -> Suggestion | None:
    """``share_gpus`` when it is off and the request, as asked, fits with it on beside
    the workers there now (``share_suggestion``)."""
    if probe.policy.share_gpus:
        return None
    shared = dataclasses.replace(probe, policy=dataclasses.replace(probe.policy, share_gpus=True))
    p = shared.placed()
    return share_suggestion(p, "beside the workers there") if p is not None else None


def share_suggestion(p: Placement, where: str) -> Suggestion:
    """The ``share_gpus`` hint for a refusal that sharing would admit, placed as ``p``:
    its GPUs, its KV cache in placement's words (sized for up to ``shared_kv_sequences``
    sequences) and the budget flag its release takes (``--kv-cache-memory-bytes`` from
    vLLM 0.10.2, else a fraction)."""
    budget = (
        f"--kv-cache-memory-bytes {p.flags.kv_cache_memory_bytes}"
        if p.flags.kv_cache_memory_bytes is not None
        else f"--gpu-memory-utilization {p.flags.gpu_memory_utilization}"
    )
    return Suggestion(
        "share_gpus",
        f"share_gpus = true (GATEKEEPER_SHARE_GPUS=true) fits it on {_where(p)} {where}: "
        f"{kv_text(p.estimate, p.kv_cache_bytes)} ({budget}), "
        f"{format_gib(max(p.promise_bytes))} per GPU",
        {"share_gpus": True},
    )


def _shorter(probe: _Probe) -> Suggestion | None:
    options = probe.request.options
    length = options.max_model_len or probe.request.model.default_max_model_len
    best = longest_length(
        lambda n: probe.placed(options=dataclasses.replace(options, max_model_len=n)), length
    )
    if best is None:
        return None
    n, p = best
    return Suggestion(
        "max_model_len",
        f"max_model_len {n} (now {length}) fits on {_where(p)}",
        {"max_model_len": n},
    )


def _lighter(probe: _Probe) -> list[Suggestion]:
    request, options = probe.request, probe.request.options
    out = []
    # a GPU vLLM runs fp8 weights on (the node's best: the search may use any of them)
    capability = best_capability(g.name for g in probe.snapshot.gpus)
    version = probe.policy.default_vllm_version
    for v in lighter_variants(request.model, options, version, capability):
        p = probe.placed(options=dataclasses.replace(options, **v.changes))
        if p is not None:
            out.append(Suggestion(v.kind, f"{v.option} fits on {_where(p)}", dict(v.changes)))
    return out


def _parallel(probe: _Probe) -> Suggestion | None:
    if probe.request.auto_parallel:
        return None
    p = probe.placed(auto_parallel=True)
    if p is None:
        return None
    f = p.flags
    text = f"tensor_parallel_size {f.tensor_parallel_size}" + (
        f" with pipeline_parallel_size {f.pipeline_parallel_size}"
        if f.pipeline_parallel_size > 1
        else ""
    )
    return Suggestion(
        "parallelism",
        f"{text} fits on {_where(p)}",
        {
            "tensor_parallel_size": f.tensor_parallel_size,
            "pipeline_parallel_size": f.pipeline_parallel_size,
        },
    )


def _idle(probe: _Probe, lines: Sequence[GpuLine]) -> list[Suggestion]:
    """What would fit once the node's GPUs are idle, under the same policy: the request
    as asked, else each change of the menu (a shorter max_model_len, fp8 KV cache, fp8
    weights), at any TP (PP when allowed) size the node has GPUs for; else that nothing
    does."""
    request = probe.request
    idle = _idle_probe(probe)
    held = format_gib(sum(g.total_bytes - g.free_bytes + g.reserved_bytes for g in lines))
    p = idle.placed()
    if p is not None:
        return [
            Suggestion(
                "wait",
                f"it would fit on {_where(p)} of this node once they are idle ({held} is held by other processes and promised to gatekeeper workers now)",
            )
        ]
    changed = [s for s in (_shorter(idle), *_lighter(idle)) if s is not None]
    if changed:
        return [
            Suggestion(
                "wait", f"once this node's GPUs are idle ({held} is held now): {s.text}", s.options
            )
            for s in changed
        ]
    return [
        Suggestion(
            "none",
            f"nothing fits on this node: even idle, its {len(lines)} GPU(s) cannot hold {request.model.name} with these options",
        )
    ]


def _idle_probe(probe: _Probe) -> _Probe:
    """The probe on the node as if its GPUs were idle, under the operator's rules (no
    pipeline unless allowed, only the allowed GPUs: nothing else can run there)."""
    snapshot = probe.snapshot
    gpus = tuple(
        dataclasses.replace(g, free_bytes=g.visible_total_bytes, processes=())
        for g in snapshot.gpus
    )
    return _Probe(
        dataclasses.replace(probe.request, auto_parallel=True),
        dataclasses.replace(snapshot, gpus=gpus),
        probe.policy,
        reserved={},
        workers={},
        cache=probe.cache,
    )
