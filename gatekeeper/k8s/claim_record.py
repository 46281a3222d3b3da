"""What the mutating webhook leaves on a pod template, and how it knows it again.

Pure. The pod claims it adds are named ``CLAIM_NAME`` (``vllm-gpus``, then ``vllm-gpus-1``
… for further vLLM containers); the annotation ``CLAIM_ANNOTATION`` records, per container
name, the claims mode, the template (none in ``hami`` mode: the container's
``nvidia.com/gpumem`` stands for it), the ranks, the bytes per rank, the two flags and the
rank's components (``gatekeeper.cluster.claim_annotation``, which writes and reads it: the
node agent reads it too). A record without the components (written before they were)
still holds.
``intact`` says whether that record is still true of the template: an already mutated
template is left alone, but a client-side apply of an edited command line keeps the claims
and the annotation while it replaces the flags, and such a template is mutated again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gatekeeper.cluster.claim_annotation import RecordEntry, read_record
from gatekeeper.cluster.claims import HAMI_GPUMEM, RankSizing, hami_resources
from gatekeeper.k8s.workloads import ContainerRequest, PodTemplate

__all__ = ["intact"]


def intact(template: PodTemplate, containers: Sequence[ContainerRequest]) -> bool:
    """Whether gatekeeper's record is on ``template`` and still true: each vLLM container
    reads with the budget recorded for it, and the recorded template is claimed."""
    record = read_record(template.annotations)
    claimed = {
        e.get("resourceClaimTemplateName")
        for e in template.spec.get("resourceClaims") or []
        if isinstance(e, dict)
    }
    for c in containers:
        mine = record.get(c.name)
        options = c.command.options
        if not (
            mine is not None
            and _held(mine, claimed, _limits(template, c.path))
            and options.kv_cache_memory_bytes == mine.kv_cache_memory_bytes
            and options.gpu_memory_utilization == mine.gpu_memory_utilization
        ):
            return False
    return True


def _held(mine: RecordEntry, claimed: set[Any], limits: dict[str, Any]) -> bool:
    """The recorded template is claimed, or (``hami``) the recorded MiB still requested."""
    if mine.mode != "hami":
        return mine.template in claimed
    if mine.memory_bytes is None or mine.ranks is None:
        return False
    sizing = RankSizing(mine.ranks, mine.memory_bytes, 0, 0.0, None)
    return str(limits.get(HAMI_GPUMEM)) == hami_resources(sizing)[HAMI_GPUMEM]


def _limits(template: PodTemplate, path: str) -> dict[str, Any]:
    """The limits of the container at ``path`` (``…containers[i]``) in ``template``."""
    containers = template.spec.get("containers") or []
    index = int(path.rsplit("[", 1)[1].rstrip("]"))
    container = containers[index] if index < len(containers) else {}
    limits = (
        (container.get("resources") or {}).get("limits") if isinstance(container, dict) else None
    )
    return dict(limits) if isinstance(limits, dict) else {}
