"""What the mutating webhook leaves on a pod template, and how it knows it again.

Pure. The pod claims it adds are named ``CLAIM_NAME`` (``vllm-gpus``, then ``vllm-gpus-1``
… for further vLLM containers); the annotation ``CLAIM_ANNOTATION`` records, per container
name, the template, the ranks, the bytes per rank and the two flags (``claim_record``).
``intact`` says whether that record is still true of the template: an already mutated
template is left alone, but a client-side apply of an edited command line keeps the claims
and the annotation while it replaces the flags, and such a template is mutated again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gatekeeper.cluster.claims import RankSizing
from gatekeeper.k8s.workloads import CLAIM_ANNOTATION, ContainerRequest, PodTemplate

__all__ = ["CLAIM_ANNOTATION", "CLAIM_NAME", "claim_record", "intact", "ours"]

CLAIM_NAME = "vllm-gpus"
"""The pod claim gatekeeper adds (``vllm-gpus-1`` … for further vLLM containers)."""


def claim_record(template: str, sizing: RankSizing) -> dict[str, Any]:
    """One container's entry in ``CLAIM_ANNOTATION``."""
    return {
        "template": template,
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
            and mine.get("template") in claimed
            and options.kv_cache_memory_bytes == mine.get("kvCacheMemoryBytes")
            and options.gpu_memory_utilization == mine.get("gpuMemoryUtilization")
        ):
            return False
    return True
