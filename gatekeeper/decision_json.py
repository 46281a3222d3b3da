"""The machine-readable form of a placement ``Decision`` (bytes as integers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gatekeeper.placement import Decision, GpuLine, Placement

__all__ = ["decision_to_json"]


def _gpu(g: GpuLine) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "total_bytes": g.total_bytes,
        "free_bytes": g.free_bytes,
        "reserved_bytes": g.reserved_bytes,
        "margin_bytes": g.margin_bytes,
        "usable_bytes": g.usable_bytes,
        "workers": g.workers,
        "need_bytes": g.need_bytes,
        "status": g.status,
        "text": g.text(),
    }


def _placement(p: Placement) -> dict[str, Any]:
    w = p.estimate.worst
    f = p.flags
    return {
        "gpu_indices": list(p.gpu_indices),
        "gpu_uuids": list(p.gpu_uuids),
        "promise_bytes": list(p.promise_bytes),
        "vllm_args": list(p.args),
        "flags": {
            "max_model_len": f.max_model_len,
            "tensor_parallel_size": f.tensor_parallel_size,
            "pipeline_parallel_size": f.pipeline_parallel_size,
            "gpu_memory_utilization": f.gpu_memory_utilization,
            "kv_cache_memory_bytes": f.kv_cache_memory_bytes,
            "max_num_seqs": f.max_num_seqs,
            "max_num_batched_tokens": f.max_num_batched_tokens,
        },
        "predicted": {
            "weights_bytes": w.weights_bytes,
            "non_torch_bytes": w.non_torch_bytes,
            "activation_peak_bytes": w.activation_peak_bytes,
            "cuda_graph_bytes": w.cuda_graph_bytes,
            "kv_cache_bytes": p.kv_cache_bytes,
        },
        "vllm_version": p.estimate.vllm_version,
        "accounting": p.estimate.accounting,
    }


def decision_to_json(d: Decision) -> dict[str, Any]:
    return {
        "model": d.model,
        "admitted": d.admitted,
        "placement": _placement(d.placement) if d.placement is not None else None,
        "reasons": list(d.reasons),
        "gpus": [_gpu(g) for g in d.gpus],
        "suggestions": [
            {"kind": s.kind, "text": s.text, "options": dict(s.options)} for s in d.suggestions
        ],
    }
