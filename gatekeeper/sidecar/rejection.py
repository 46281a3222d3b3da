"""The proxy's 507 message: why a model does not fit on this node now, and what would
(the decision's suggestions, ``gatekeeper.placement.nearby``'s menu, all of them as
``gatekeeper check`` shows them); and the decision line each admission rejection writes
(``log_rejection``, on ``gatekeeper.decisions``: the model, the bytes the closest GPU
needed against what it had free and usable, and the reason)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gatekeeper.cluster.decision_log import decisions
from gatekeeper.placement.types import Decision, GpuLine
from gatekeeper.units import format_gib

__all__ = ["log_rejection", "rejection_fields", "rejection_text"]


def rejection_text(model: str, decision: Decision, served_as: Sequence[str] = ()) -> str:
    """The 507 message: what the model needs, one line per GPU, then what would fit, or
    plainly that nothing does and which GPU comes closest. ``served_as``: the names this
    node configures or runs ``model`` (a repo id) under, named first, since those carry
    the configured options and a launch under the repo id does not."""
    gpu_lines = {g.text() for g in decision.gpus}
    needs = [r for r in decision.reasons if r not in gpu_lines]
    lines = [f"The model `{model}` does not fit on this node now.", *needs[:3]]
    if served_as:
        listed = ", ".join(f"`{n}`" for n in served_as)
        lines.insert(
            0,
            f"`{model}` is served on this node as {listed}: send that name as the model "
            "(its configured options, and its worker when one runs); launched under its "
            "own name, with vLLM's defaults, it does not fit:",
        )
    lines += [g.text() for g in decision.gpus]
    fits = [s for s in decision.suggestions if s.kind != "none"]
    if fits:
        lines += [f"Would fit: {s.text}." for s in fits]  # all, as check shows them
    else:
        lines.append(_nothing_fits(decision))
    return "\n".join(lines)


def _nothing_fits(decision: Decision) -> str:
    why = next((s.text for s in decision.suggestions if s.kind == "none"), "")
    why = why.removeprefix("nothing fits on this node: ")
    best = _closest(decision)
    closest = ""
    if best is not None:
        gap = format_gib((best.need_bytes or 0) - best.usable_bytes)
        closest = f" The closest is GPU {best.index} ({best.name}), short by {gap}."
    return (
        "No setting fits on this node: none of a shorter max_model_len, an fp8 KV cache, "
        f"fp8 weights or more tensor parallelism fits now{', and ' + why if why else ''}."
        f"{closest} Serve it on a node with more GPU memory, or pick a smaller or "
        "quantised model."
    )


def _closest(decision: Decision) -> GpuLine | None:
    """The GPU that comes closest to holding a rank (None when none was sized)."""
    short = [g for g in decision.gpus if g.need_bytes is not None]
    return min(short, key=lambda g: (g.need_bytes or 0) - g.usable_bytes) if short else None


def rejection_fields(name: str, decision: Decision, status: int = 507) -> dict[str, Any]:
    """The rejection line's fields: ``name`` (the deployment's) and the model, the HTTP
    status, the closest GPU with the bytes a rank needed there and what it had free and
    usable (free less reservations and the margin), and the reason."""
    gpu_lines = {g.text() for g in decision.gpus}
    reasons = [r for r in decision.reasons if r not in gpu_lines]
    best = _closest(decision)
    fields: dict[str, Any] = {
        "event": "sidecar_rejection",
        "status": status,
        "name": name,
        "model": decision.model,
    }
    if best is not None:
        fields |= {
            "gpu": best.index,
            "gpu_name": best.name,
            "need_bytes": best.need_bytes,
            "free_bytes": best.free_bytes,
            "usable_bytes": best.usable_bytes,
        }
    fields["reason"] = "; ".join(reasons[:3]) or _nothing_fits(decision)
    return fields


def log_rejection(fields: dict[str, Any]) -> None:
    """The rejection's decision line (WARNING)."""
    decisions.warning("sidecar: %s refused (%s)", fields.get("name"), fields.get("status"),
                      extra={"fields": fields})  # fmt: skip
