"""The mutating webhook's record (``gatekeeper.cluster.claim_annotation``): the rank's
components written beside the flags and read back by name, a record written before the
components were (older pods) still holding, and a pod's components found by the claim
its container uses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gatekeeper import resolve_model
from gatekeeper.cluster.claim_annotation import (
    CLAIM_ANNOTATION,
    claim_components,
    entry,
    read_record,
)
from gatekeeper.cluster.claims import RankSizing, size_ranks
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION, accounting_for
from gatekeeper.estimator.components import COMPONENTS
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.overhead import pre_init_bytes
from gatekeeper.gpus.products import gpu_products
from gatekeeper.k8s.claim_record import intact
from gatekeeper.k8s.workloads import pod_templates, vllm_containers
from gatekeeper.placement.policy import PlacementPolicy
from tests.support.vllm_workloads import IMAGE, MODEL

GiB = 2**30
KV, FRACTION, TEMPLATE = 3759013888, 0.1172, "vllm-gpus-0123456789abcdef"


def sizing() -> RankSizing:
    """Qwen2.5-7B with --max-model-len 8192 sized on an H100 as the webhook sizes it."""
    h100 = next(p for p in gpu_products() if p.name.startswith("H100"))
    options = ServeOptions(max_model_len=8192)
    return size_ranks(resolve_model(MODEL), options, h100.total_bytes, h100.name, PlacementPolicy())


def test_the_record_carries_the_rank_s_components_which_read_back_by_name() -> None:
    sized = sizing()
    written = entry(TEMPLATE, sized, "gatekeeper")
    components = written["components"]
    assert set(components) == set(COMPONENTS)
    assert components["kv_cache"] == sized.kv_cache_memory_bytes
    # what placement promises per rank: the components and the CUDA context outside them
    # (from 0.33 with the cuBLAS workspace)
    outside = pre_init_bytes(1, accounting_for(DEFAULT_VLLM_VERSION))
    assert sum(components.values()) + outside == sized.rank_bytes
    assert written["memoryBytes"] - sized.rank_bytes < 2**20  # rounded up to a MiB
    (read,) = read_record({CLAIM_ANNOTATION: json.dumps({"vllm": written})}).values()
    assert dict(read.components) == components
    assert (read.template, read.ranks, read.memory_bytes) == (TEMPLATE, 1, sized.request_bytes)
    unsized = RankSizing(1, GiB, KV, FRACTION, None)  # no prediction: no components key
    assert "components" not in entry(TEMPLATE, unsized, "gatekeeper")


def pod(record: dict[str, Any] | None, *flags: str) -> dict[str, Any]:
    """A Pod of one vLLM container on gatekeeper's claim ``vllm-gpus`` with ``flags``."""
    annotations = {CLAIM_ANNOTATION: json.dumps(record)} if record is not None else {}
    container = {"name": "vllm", "image": IMAGE, "command": ["vllm", "serve"],
                 "args": [MODEL, *flags], "resources": {"claims": [{"name": "vllm-gpus"}]}}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "qwen", "namespace": "team-a", "annotations": annotations},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "vllm-gpus", "resourceClaimTemplateName": TEMPLATE}],
        },
    }


def held(record: dict[str, Any]) -> bool:
    flags = ("--kv-cache-memory-bytes", str(KV), "--gpu-memory-utilization", str(FRACTION))
    (template,) = pod_templates("Pod", pod(record, *flags))
    return intact(template, vllm_containers(template, "0.32.0"))


def test_a_record_without_components_still_holds_and_one_of_the_wrong_shape_does_not() -> None:
    """A pod the webhook mutated before the components were recorded is not mutated again
    (no re-mutation storm on upgrade); a record whose fields are not what gatekeeper
    writes reads as no record."""
    old = {"mode": "gatekeeper", "template": TEMPLATE, "ranks": 1, "memoryBytes": 20 * GiB,
           "kvCacheMemoryBytes": KV, "gpuMemoryUtilization": FRACTION}  # fmt: skip
    assert held({"vllm": old})
    assert held({"vllm": {**old, "components": {"weights": 15 * GiB, "kv_cache": KV}}})
    assert not held({"vllm": {**old, "kvCacheMemoryBytes": str(KV)}})
    assert not held({"vllm": {**old, "ranks": True}})
    assert not held({"vllm": {**old, "kvCacheMemoryBytes": KV + 1}})
    assert not held({"other": old})
    assert read_record({CLAIM_ANNOTATION: "{not json"}) == {}
    assert read_record({CLAIM_ANNOTATION: "[1]"}) == {}


@pytest.mark.parametrize("where", ["spec", "status"])
def test_a_pod_s_components_are_those_of_the_container_using_the_claim(where: str) -> None:
    """Two vLLM containers, each on its claim (named in ``spec.resourceClaims`` or, made
    from a template, in ``status.resourceClaimStatuses``): each claim's components are
    its container's; a claim the pod does not use, or a pod without a record, has none."""
    first = {"weights": 10 * GiB, "kv_cache": 4 * GiB}
    second = {"weights": 20 * GiB, "kv_cache": 2 * GiB, "bogus": 1, "non_torch": -1}
    record = {"vllm": {"mode": "gatekeeper", "components": first},
              "draft": {"mode": "gatekeeper", "components": second}}  # fmt: skip
    made = pod(record)
    other = {**made["spec"]["containers"][0], "name": "draft",
             "resources": {"claims": [{"name": "vllm-gpus-1"}]}}  # fmt: skip
    made["spec"]["containers"].append(other)
    names = [("vllm-gpus", "qwen-vllm-gpus-x1"), ("vllm-gpus-1", "qwen-vllm-gpus-1-x2")]
    entries = [{"name": n, "resourceClaimName": c} for n, c in names]
    if where == "spec":
        made["spec"]["resourceClaims"] = entries
    else:
        made["status"] = {"resourceClaimStatuses": entries}
    assert claim_components(made, "qwen-vllm-gpus-x1") == first
    assert claim_components(made, "qwen-vllm-gpus-1-x2") == {
        "weights": 20 * GiB,
        "kv_cache": 2 * GiB,
    }
    assert claim_components(made, "someone-else") == {}
    made["metadata"]["annotations"] = {}
    assert claim_components(made, "qwen-vllm-gpus-x1") == {}
