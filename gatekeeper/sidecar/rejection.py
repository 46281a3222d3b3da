"""The proxy's 507 message: why a model does not fit on this node now, and what would
(the decision's suggestions, ``gatekeeper.placement.nearby``'s menu, all of them as
``gatekeeper check`` shows them)."""

from __future__ import annotations

from collections.abc import Sequence

from gatekeeper.placement.types import Decision
from gatekeeper.units import format_gib

__all__ = ["rejection_text"]


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
    short = [g for g in decision.gpus if g.need_bytes is not None]
    closest = ""
    if short:
        best = min(short, key=lambda g: (g.need_bytes or 0) - g.usable_bytes)
        gap = format_gib((best.need_bytes or 0) - best.usable_bytes)
        closest = f" The closest is GPU {best.index} ({best.name}), short by {gap}."
    return (
        "No setting fits on this node: none of a shorter max_model_len, an fp8 KV cache, "
        f"fp8 weights or more tensor parallelism fits now{', and ' + why if why else ''}."
        f"{closest} Serve it on a node with more GPU memory, or pick a smaller or "
        "quantised model."
    )
