"""The node agent's metrics over a fixed state, for the metrics doc, dashboard and alert
tests: the pass that republished one GPU after the other vanished (generation 2), the
one pod whose claim was on the vanished GPU, one pod holding a whole GPU in no claim, and
the per-pod figures of one pod on the
remaining GPU (a 24 GiB claim, 20 GiB used, the components the webhook recorded on the
pod) beside 2 GiB of a process in no pod."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.accounting import Allocation, Orphans, orphan_key
from gatekeeper.cluster.agent import PassResult, quantity_bytes
from gatekeeper.cluster.agent_metrics import AgentCollector, PodCollector, PrepareCounter
from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION
from gatekeeper.cluster.slices import device_name
from gatekeeper.cluster.unclaimed import UnclaimedPod
from gatekeeper.gpus.inventory import InventorySnapshot
from tests.support.snapshots import busy_gpu

ORPHAN = Allocation("team-a", "qwen-0-vllm-gpus-x7k2p", "gpu-1", 16 * 2**30, ("qwen-0",))
"""The pod on a vanished GPU."""
VANISHED_UUID = "GPU-00000001-aaaa-bbbb-cccc-000000000001"
UNCLAIMED = UnclaimedPod("team-b", "whole-gpu-0", "9f8e7d6c-0000-4000-8000-00000000000b", 1)
"""A pod holding a whole GPU through nvidia.com/gpu, in no claim."""
LAST = PassResult("updated", 2, ("gpu-0",), (), (ORPHAN,), (), (UNCLAIMED,))


@dataclass
class AgentState:
    """An agent's state as the collector reads it (``agent_metrics.AgentState``)."""

    last: PassResult | None = LAST
    passes: Counter[str] = field(default_factory=lambda: Counter(created=1, updated=1))
    orphans: Orphans = field(default_factory=lambda: {orphan_key(ORPHAN): (ORPHAN, VANISHED_UUID)})
    unclaimed: tuple[UnclaimedPod, ...] = (UNCLAIMED,)


NODE = "node-a"
POD_UID = "1a2b3c4d-0000-4000-8000-00000000000a"
GPU = busy_gpu(0, 22 * 2**30, (10, 20 * 2**30), (11, 2 * 2**30))
DEVICE = device_name(GPU)
CLAIM: dict[str, Any] = {
    "metadata": {"name": "qwen-1-vllm-gpus-a1b2c", "namespace": "team-a"},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "driver": DRIVER_NAME,
                        "pool": NODE,
                        "device": DEVICE,
                        "consumedCapacity": {"memory": "24Gi"},
                    }
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "qwen-1", "uid": POD_UID}],
    },
}


COMPONENTS = {"weights": 15 * 2**30, "kv_cache": 5 * 2**30, "activation": 2**30,
              "non_torch": 2**29, "cuda_graph": 2**29}  # fmt: skip
"""What the mutating webhook recorded for the pod's rank (22 GiB; the claim adds the CUDA
context and rounds up)."""
POD: dict[str, Any] = {
    "metadata": {
        "name": "qwen-1",
        "namespace": "team-a",
        "uid": POD_UID,
        "annotations": {
            CLAIM_ANNOTATION: json.dumps({"vllm": {"mode": "gatekeeper", "components": COMPONENTS}})
        },
    },
    "spec": {
        "containers": [
            {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "command": ["vllm", "serve"],
             "args": ["Qwen/Qwen2.5-7B-Instruct"], "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM["metadata"]["name"]}],
    },
}  # fmt: skip
"""The pod ``CLAIM`` is reserved for, as the apiserver returns it."""


def _read_pod(namespace: str, name: str) -> dict[str, Any]:
    return POD


def pod_collector(
    read_pod: Callable[[str, str], Mapping[str, Any]] = _read_pod,
) -> PodCollector:
    """The per-pod figures of ``CLAIM`` on ``GPU``: pid 10 in the pod, 11 in none; the pod
    read (``POD``, unless ``read_pod`` reads another) for its recorded components."""
    snapshot = InventorySnapshot(gpus=(GPU,), ok=True)
    return PodCollector(
        NODE,
        DRIVER_NAME,
        lambda: snapshot,
        lambda: [CLAIM],
        {10: POD_UID}.get,
        quantity_bytes,
        read_pod=read_pod,
    )


def agent_registry() -> CollectorRegistry:
    """A registry with the agent's collectors over ``AgentState()`` and ``pod_collector``,
    one prepare refused."""
    registry = CollectorRegistry()
    prepares = PrepareCounter()
    prepares.count("refused")
    registry.register(AgentCollector(AgentState(), prepares))
    registry.register(pod_collector())
    return registry
