"""What the mutating webhook leaves on a pod template, and how it knows it again.

Pure. The pod claims it adds are named ``CLAIM_NAME`` (``vllm-gpus``, then ``vllm-gpus-1``
… for further vLLM containers); the annotation ``CLAIM_ANNOTATION`` records, per container
name, the claims mode, the template (none in ``hami`` mode: the container's
``nvidia.com/gpumem`` stands for it), the ranks, the bytes per rank and the two flags
(``claim_record``).
``intact`` says whether that record is still true of the template: an already mutated
template is left alone, but a client-side apply of an edited command line keeps the claims
and the annotation while it replaces the flags, and such a template is mutated again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gatekeeper.cluster.claims import HAMI_GPUMEM, ClaimsMode, RankSizing, hami_resources
from gatekeeper.k8s.workloads import CLAIM_ANNOTATION, ContainerRequest, PodTemplate

__all__ = ["CLAIM_ANNOTATION", "CLAIM_NAME", "claim_record", "intact", "ours"]

CLAIM_NAME = "vllm-gpus"
"""The pod claim gatekeeper adds (``vllm-gpus-1`` … for further vLLM containers)."""


def claim_record(
    template: str | None, sizing: RankSizing, mode: ClaimsMode = "gatekeeper"
) -> dict[str, Any]:
    """One container's entry in ``CLAIM_ANNOTATION`` (``template`` None: HAMi's resources)."""
    where = {"template": template} if template is not None else {}
    return {
        "mode": mode,
        **where,
        "ranks": sizing.ranks,
        "memoryBytes": sizing.request_bytes,
        "kvCacheMemoryBytes": sizing.kv_cache_memory_bytes,
        "gpuMemoryUtilization": sizing.gpu_memory_utilization,
    }


def ours(entry: object) -> bool:
    """A pod claim gatekeeper wrote (``vllm-gpus``, ``vllm-gpus-1`` …)."""
    name = entry.get("name") if isinstance(entry, dict) else None
    return isinstance(name, str) and (name == CLAIM_NAME or name.startswith(f"{CLAIM_NAME}-"))


def intact(template: PodTemplate, containers: Sequence[ContainerRequest]) -> bool:
    """Whether gatekeeper's record is on ``template`` and still true: each vLLM container
    reads with the budget recorded for it, and the recorded template is claimed."""
    try:
        record = json.loads(template.annotations.get(CLAIM_ANNOTATION, "null"))
    except ValueError:
        return False
    claimed = {
        e.get("resourceClaimTemplateName")
        for e in template.spec.get("resourceClaims") or []
        if isinstance(e, dict)
    }
    for c in containers:
        mine = record.get(c.name) if isinstance(record, dict) else None
        options = c.command.options
        if not (
            isinstance(mine, dict)
            and _held(mine, claimed, _limits(template, c.path))
            and options.kv_cache_memory_bytes == mine.get("kvCacheMemoryBytes")
            and options.gpu_memory_utilization == mine.get("gpuMemoryUtilization")
        ):
            return False
    return True


def _held(mine: dict[str, Any], claimed: set[Any], limits: dict[str, Any]) -> bool:
    """The recorded template is claimed, or (``hami``) the recorded MiB still requested."""
    if mine.get("mode") != "hami":
        return mine.get("template") in claimed
    bytes_ = mine.get("memoryBytes")
    ranks = mine.get("ranks")
    if not isinstance(bytes_, int) or not isinstance(ranks, int):
        return False
    wanted = hami_resources(RankSizing(ranks, bytes_, 0, 0.0, None))[HAMI_GPUMEM]
    return str(limits.get(HAMI_GPUMEM)) == wanted


def _limits(template: PodTemplate, path: str) -> dict[str, Any]:
    """The limits of the container at ``path`` (``…containers[i]``) in ``template``."""
    containers = template.spec.get("containers") or []
    index = int(path.rsplit("[", 1)[1].rstrip("]"))
    container = containers[index] if index < len(containers) else {}
    limits = (
        (container.get("resources") or {}).get("limits") if isinstance(container, dict) else None
    )
    return dict(limits) if isinstance(limits, dict) else {}
