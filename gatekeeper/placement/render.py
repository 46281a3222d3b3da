"""Human output of a placement decision: each GPU as a bar of its memory.

GPU 0 H100-80GB  [####rrWWWWWWWWKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKooo..m]  79.19 GiB
legend: # used by others  r reserved (starting workers)  W weights  K KV cache
        o activation, graphs, context  . free  m safety margin
"""

from __future__ import annotations

from gatekeeper.placement.sizing import kv_text
from gatekeeper.placement.types import Decision, GpuLine, Placement
from gatekeeper.units import format_gib

__all__ = ["LEGEND", "render_bar", "render_decision", "worker_parts"]

WIDTH = 50
LEGEND = (
    "legend: # used by others  r reserved for starting workers  W weights  K KV cache  "
    "o activation, graphs, context  . free  m safety margin"
)


def _cells(parts: list[tuple[str, int]], total: int) -> str:
    """Proportional cells; every non-zero part gets at least one, free ('.') takes the rest."""
    counts = [
        (char, max(1, round(size * WIDTH / total)) if total and size > 0 else 0)
        for char, size in parts
    ]
    fixed = sum(n for char, n in counts if char != ".")
    cells = "".join(char * (max(0, WIDTH - fixed) if char == "." else n) for char, n in counts)
    return cells[:WIDTH]


def render_bar(line: GpuLine, worker: tuple[int, int, int] | None = None) -> str:
    """One GPU: memory used by others, reserved, the new worker's (weights, KV, other)
    bytes when given, free, and the margin."""
    used = line.total_bytes - line.free_bytes
    parts = [("#", used), ("r", line.reserved_bytes)]
    taken = used + line.reserved_bytes
    if worker is not None:
        weights, kv, other = worker
        parts += [("W", weights), ("K", kv), ("o", other)]
        taken += weights + kv + other
    free = max(0, line.total_bytes - taken - line.margin_bytes)
    parts += [(".", free), ("m", min(line.margin_bytes, line.total_bytes - taken))]
    bar = _cells(parts, line.total_bytes)
    return f"GPU {line.index} {line.name:<12} [{bar}] {format_gib(line.total_bytes)}"


def worker_parts(p: Placement, gpu_index: int) -> tuple[int, int, int]:
    """(weights, KV, everything else) the placed worker holds on one of its GPUs."""
    w = p.estimate.worst
    promise = p.promise_bytes[p.gpu_indices.index(gpu_index)]
    other = max(0, promise - w.weights_bytes - p.kv_cache_bytes)
    return w.weights_bytes, p.kv_cache_bytes, other


def render_decision(d: Decision) -> str:
    lines = []
    if d.admitted and d.placement is not None:
        p = d.placement
        gpus = ", ".join(str(i) for i in p.gpu_indices)
        lines.append(f"ADMITTED {d.model} on GPU {gpus}")
        lines.append("  vllm serve " + " ".join(p.args))
        lines.append(
            f"  predicted per GPU: weights {format_gib(p.estimate.worst.weights_bytes)}, "
            f"{kv_text(p.estimate, p.kv_cache_bytes)}, "
            f"promised {format_gib(max(p.promise_bytes))} until ready"
        )
        lines += [f"  warning: {w}" for w in d.warnings]
    else:
        lines.append(f"REJECTED {d.model}")
        lines += [f"  - {r}" for r in d.reasons]
        if d.suggestions:
            lines.append("  what would fit:")
            lines += [f"  * {s.text}" for s in d.suggestions]
    lines.append("")
    for g in d.gpus:
        worker = (
            worker_parts(d.placement, g.index)
            if d.placement is not None and g.index in d.placement.gpu_indices
            else None
        )
        lines.append(render_bar(g, worker) + f"  {g.status}")
    lines.append(LEGEND)
    return "\n".join(lines)
