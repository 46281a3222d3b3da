"""The pods on a node that hold GPUs gatekeeper's books do not count (pure; issue 38 item 4).

In cluster mode a GPU node's memory is booked through DRA claims: the scheduler's
``consumedCapacity`` against the capacity the agent publishes. A pod that holds whole GPUs
through a device plugin's ``nvidia.com/gpu`` is in no claim: it was admitted while the
mutating webhook was down (under ``failurePolicy: Ignore``), in a namespace the webhook's
selector leaves out, or annotated ``vllm-gatekeeper.io/skip``. Its GPUs may be the very
ones the scheduler places claims on. ``unclaimed_gpu_pods`` finds such pods among a node's
pods: not finished (phase neither ``Succeeded`` nor ``Failed``), a container or init
container asking ``nvidia.com/gpu`` (limits, else requests) above 0, and no pod claim of
gatekeeper's (``vllm-gpus``, ``vllm-gpus-1`` ...). The node agent reports each once (an
Event on the pod) and exports their count (``gatekeeper_agent_unclaimed_gpu_pods``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.claims import GPU_RESOURCE, container_gpus, ours

__all__ = ["GPU_RESOURCE", "UnclaimedPod", "unclaimed_gpu_pods", "unclaimed_text"]


@dataclass(frozen=True, slots=True)
class UnclaimedPod:
    """A pod that holds whole GPUs through ``nvidia.com/gpu`` and no gatekeeper claim."""

    namespace: str
    name: str
    uid: str
    gpus: int


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def unclaimed_gpu_pods(pods: Iterable[Mapping[str, Any]]) -> list[UnclaimedPod]:
    """The pods of ``pods`` (a node's, as the API lists them) that hold GPUs through
    ``nvidia.com/gpu`` without a gatekeeper claim, by namespace and name."""
    out = []
    for pod in pods:
        metadata, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
        if _map(pod.get("status")).get("phase") in ("Succeeded", "Failed"):
            continue
        if any(ours(e) for e in _list(spec.get("resourceClaims"))):
            continue
        containers = [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]
        gpus = max((container_gpus(_map(c)) or 0 for c in containers), default=0)
        if gpus > 0:
            namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
            out.append(UnclaimedPod(namespace, name, str(metadata.get("uid", "")), gpus))
    return sorted(out, key=lambda p: (p.namespace, p.name))


def unclaimed_text(pod: UnclaimedPod, node: str) -> str:
    """What the agent says of ``pod`` on ``node`` (the Event's message, the log line)."""
    return (
        f"pod {pod.namespace}/{pod.name} holds {pod.gpus} whole GPU(s) of node {node} through "
        f"{GPU_RESOURCE}, in no gatekeeper claim: the memory the scheduler books on this "
        "node's published GPUs does not count them, so claims placed there may not fit. It "
        "was admitted while the mutating webhook was down, in a namespace its selector "
        "leaves out, or with vllm-gatekeeper.io/skip; delete it so that its controller makes "
        "it again through the webhook (a bare pod: apply it again)"
    )
