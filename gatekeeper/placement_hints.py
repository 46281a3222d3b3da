"""Why a request was rejected, and the nearest configurations that would fit.

Every rejection names the model, what it needs per GPU, what each GPU has usable and
why it was passed over, then tries, in order: the largest ``max_model_len`` that fits,
an fp8 KV cache, online fp8 weights, a larger tensor-parallel group; and, when none of
those fits, whether the model fits on this node once its GPUs are idle, or not at all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gatekeeper.accounting import accounting_for
from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus import InventorySnapshot
from gatekeeper.units import format_gib

if TYPE_CHECKING:
    from gatekeeper.placement import (
        Decision,
        GpuLine,
        PlacementPolicy,
        PlacementRequest,
        Suggestion,
        _Need,
    )

__all__ = ["rejection_reasons", "suggestions"]


def rejection_reasons(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    lines: list[GpuLine],
    tried: list[tuple[tuple[int, int], dict[int, _Need]]],
) -> list[str]:
    name = request.model.name
    if not snapshot.ok:
        return [f"{name}: the GPU snapshot failed ({snapshot.error}); nothing can be placed"]
    reasons: list[str] = []
    if not any(g.status in ("too small", "candidate") for g in lines):
        reasons.append(f"{name}: no GPU on this node can take work")
    for (tp, pp), needs in tried:
        need = needs[max(needs)]  # on the largest GPU product
        reasons.append(_need_line(name, tp, pp, need))
        if need.estimate.length_beyond_model:
            reasons += [r for r in need.estimate.reasons if r.startswith("max_model_len")]
    reasons += [g.text() for g in lines]
    return reasons


def _need_line(name: str, tp: int, pp: int, need: _Need) -> str:
    e = need.estimate
    w = e.worst
    shape = f"TP={tp}" + (f" PP={pp}" if pp > 1 else "")
    return (
        f"{name} at {shape} needs {format_gib(need.max_bytes)} per GPU "
        f"({e.gpu_total_bytes / 2**30:.2f} GiB GPUs): weights {format_gib(w.weights_bytes)}, "
        f"KV cache {format_gib(need.kv_bytes)} for max_model_len {e.max_model_len}, "
        f"activation {format_gib(w.activation_peak_bytes)}, non-torch {format_gib(w.non_torch_bytes)}, "
        f"CUDA graphs {format_gib(w.cuda_graph_bytes)}"
    )


@dataclass(frozen=True, slots=True)
class _Probe:
    """The rejected request's situation, to try variants of it against."""

    request: PlacementRequest
    snapshot: InventorySnapshot
    policy: PlacementPolicy
    reserved: dict[str, int]
    workers: dict[str, int]

    def admitted(self, **changes: Any) -> Decision | None:
        from gatekeeper.placement import decide

        try:
            d = decide(
                dataclasses.replace(self.request, **changes),
                self.snapshot,
                reserved=self.reserved,
                workers=self.workers,
                policy=self.policy,
                suggest=False,
            )
        except GatekeeperError:
            return None
        return d if d.admitted else None


def _where(d: Decision) -> str:
    assert d.placement is not None
    gpus = ", ".join(str(i) for i in d.placement.gpu_indices)
    return f"GPU {gpus}" if len(d.placement.gpu_indices) == 1 else f"GPUs {gpus}"


def suggestions(
    request: PlacementRequest,
    snapshot: InventorySnapshot,
    lines: list[GpuLine],
    policy: PlacementPolicy,
) -> list[Suggestion]:
    probe = _Probe(
        request,
        snapshot,
        policy,
        reserved={g.uuid: g.reserved_bytes for g in lines if g.reserved_bytes},
        workers={g.uuid: g.workers for g in lines if g.workers},
    )
    found = [_shorter(probe), *_variants(probe)]
    out = [s for s in found if s is not None]
    return out or [_idle(probe, lines)]


def _shorter(probe: _Probe) -> Suggestion | None:
    from gatekeeper.placement import Suggestion

    request = probe.request
    options = request.options
    length = options.max_model_len or request.model.max_position_embeddings
    lo, hi, best = 1, length - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        d = probe.admitted(options=dataclasses.replace(options, max_model_len=mid))
        if d is not None:
            best, lo = (mid, d), mid + 1
        else:
            hi = mid - 1
    if best is None or best[0] < 256:
        return None
    n, d = best
    return Suggestion(
        "max_model_len",
        f"max_model_len {n} (now {length}) fits on {_where(d)}",
        {"max_model_len": n},
    )


def _variants(probe: _Probe) -> list[Suggestion | None]:
    from gatekeeper.placement import Suggestion

    request, options = probe.request, probe.request.options
    version = options.vllm_version or probe.policy.default_vllm_version
    out: list[Suggestion | None] = []
    if options.kv_cache_dtype == "auto":
        d = probe.admitted(options=dataclasses.replace(options, kv_cache_dtype="fp8"))
        if d is not None:
            text = f"kv_cache_dtype fp8 fits on {_where(d)}"
            out.append(Suggestion("kv_cache_dtype", text, {"kv_cache_dtype": "fp8"}))
    if request.model.quantization is None and options.quantization is None:
        flag = "fp8_per_tensor" if accounting_for(version).since >= (0, 33, 0) else "fp8"
        d = probe.admitted(options=dataclasses.replace(options, quantization=flag))
        if d is not None:
            text = f"quantization {flag} (online fp8 weights) fits on {_where(d)}"
            out.append(Suggestion("quantization", text, {"quantization": flag}))
    if not request.auto_parallel:
        d = probe.admitted(auto_parallel=True)
        if d is not None and d.placement is not None:
            f = d.placement.flags
            text = f"tensor_parallel_size {f.tensor_parallel_size}" + (
                f" with pipeline_parallel_size {f.pipeline_parallel_size}"
                if f.pipeline_parallel_size > 1
                else ""
            )
            out.append(
                Suggestion(
                    "parallelism",
                    f"{text} fits on {_where(d)}",
                    {
                        "tensor_parallel_size": f.tensor_parallel_size,
                        "pipeline_parallel_size": f.pipeline_parallel_size,
                    },
                )
            )
    return out


def _idle(probe: _Probe, lines: list[GpuLine]) -> Suggestion:
    from gatekeeper.placement import Suggestion, decide

    request, snapshot = probe.request, probe.snapshot
    idle = dataclasses.replace(
        snapshot,
        gpus=tuple(
            dataclasses.replace(g, free_bytes=g.visible_total_bytes, processes=())
            for g in snapshot.gpus
        ),
    )
    open_policy = dataclasses.replace(
        probe.policy, share_gpus=True, allow_pipeline=True, allowed_gpus=None
    )
    try:
        d = decide(
            dataclasses.replace(request, auto_parallel=True),
            idle,
            policy=open_policy,
            suggest=False,
        )
    except GatekeeperError:
        d = None
    if d is not None and d.admitted:
        held = sum(g.total_bytes - g.free_bytes for g in lines)
        return Suggestion(
            "wait",
            f"it would fit on {_where(d)} of this node once they are idle ({format_gib(held)} is held by other processes now)",
        )
    return Suggestion(
        "none",
        f"nothing fits on this node: even idle, its {len(lines)} GPU(s) cannot hold {request.model.name} with these options",
    )
