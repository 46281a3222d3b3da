"""Placement (pure): ``Estimate`` + GPU snapshot + promises -> ``Decision``.

``search`` finds the best-fitting GPUs (one GPU, then the smallest tensor-parallel group,
then pipeline stages) and derives the worker's flags as its vLLM release takes them
(``budget``); ``decide`` runs the search and, on
a rejection, gives every reason with its numbers and the nearby configurations that
would fit (``hints``, probing with ``search``; the menu is ``nearby``, which the
webhook shares). ``policy`` holds the operator's rules, ``types`` the request and decision (and the decision's
JSON form), ``render`` draws them for people, ``plan`` admits a file of deployments in
order. Estimates are cached by an ``EstimateCache`` that the caller holds.

May import: ``gatekeeper.vllm`` (the launch flags), ``gatekeeper.estimator``,
``gatekeeper.models`` (the spec), ``gatekeeper.gpus`` (the snapshot types), ``errors``,
``units``. No I/O beyond ``plan`` reading its file (an import-linter contract forbids
the sidecar, NVML, the hub, HTTP, SQLite, threads and asyncio).
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face

if TYPE_CHECKING:
    from gatekeeper.placement.decision import decide
    from gatekeeper.placement.gpu_search import (
        TP_SIZES,
        EstimateCache,
        SearchResult,
        gpu_lines,
        search,
    )
    from gatekeeper.placement.nearby import MIN_SUGGESTED_LEN, Variant, lighter_variants
    from gatekeeper.placement.plan import Plan, PlanError, PlanResult, load_plan, run_plan
    from gatekeeper.placement.policy import PlacementPolicy
    from gatekeeper.placement.render import render_bar, render_decision
    from gatekeeper.placement.types import (
        Decision,
        GpuLine,
        Placement,
        PlacementRequest,
        Prediction,
        Suggestion,
        auto_parallel,
    )

__all__ = [
    "MIN_SUGGESTED_LEN",
    "TP_SIZES",
    "Decision",
    "EstimateCache",
    "GpuLine",
    "Placement",
    "PlacementPolicy",
    "PlacementRequest",
    "Plan",
    "PlanError",
    "PlanResult",
    "Prediction",
    "SearchResult",
    "Suggestion",
    "Variant",
    "auto_parallel",
    "decide",
    "gpu_lines",
    "lighter_variants",
    "load_plan",
    "render_bar",
    "render_decision",
    "run_plan",
    "search",
]

__getattr__, __dir__ = face(globals())
