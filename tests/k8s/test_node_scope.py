"""Cluster mode judges a pod only on the published GPUs of the nodes it may land on
(gatekeeper.k8s.node_scope): node selectors and required affinity matched to the Nodes'
labels as kube-scheduler matches them, reviews in, reviews out."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.k8s.fleet import fleet_from_slices
from gatekeeper.k8s.node_scope import node_constraint, refusal
from tests.k8s.test_fleet import answer, published, review

L4_NODE = {"nvidia.com/gpu.product": "NVIDIA-L4", "cloud.google.com/gke-accelerator": "nvidia-l4"}
H100_NODE = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "big", "gpus": "8"}
MIXED = published(("l4-node", "2xL4"), ("h100-node", "1xH100-80GB"))
NODES = {"l4-node": L4_NODE, "h100-node": H100_NODE}
QWEN_14B = ["Qwen/Qwen2.5-14B-Instruct", "--max-model-len", "8192"]


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def pinned(args: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    """``review`` with ``spec`` merged into its pod spec."""
    body = review(args)
    body["request"]["object"]["spec"]["template"]["spec"].update(spec)
    return body


@pytest.mark.parametrize(
    ("spec", "l4", "h100"),
    [
        ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}, None,
         "nodeSelector nvidia.com/gpu.product=NVIDIA-L4: the node's is 'NVIDIA-H100-80GB-HBM3'"),
        ({"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}, None,
         "nodeSelector cloud.google.com/gke-accelerator=nvidia-l4: the node has none"),
        (affinity([expression("pool", "In", "big")]),
         "required node affinity: label pool In ['big']: the node has none", None),
        (affinity([expression("nvidia.com/gpu.product", "NotIn", "NVIDIA-L4")]),
         "required node affinity: label nvidia.com/gpu.product NotIn ['NVIDIA-L4']: "
         "the node's is 'NVIDIA-L4'", None),
        (affinity([expression("pool", "DoesNotExist")]), None,
         "required node affinity: label pool DoesNotExist: the node's is 'big'"),
        (affinity([expression("gpus", "Gt", "4")]),
         "required node affinity: label gpus Gt 4: the node has none, not an integer", None),
        # terms are ORed: either one lets the pod on the node
        (affinity([expression("pool", "Exists")], [expression("gpus", "Lt", "100")],
                  [expression("cloud.google.com/gke-accelerator", "Exists")]), None, None),
        ({"nodeName": "h100-node"}, "spec.nodeName is h100-node", None),
        (affinity(), "required node affinity with no nodeSelectorTerms matches no node",
         "required node affinity with no nodeSelectorTerms matches no node"),
        (affinity([]), "required node affinity: an empty term matches no node",
         "required node affinity: an empty term matches no node"),
    ],
)  # fmt: skip
def test_a_node_is_refused_as_the_scheduler_refuses_it(
    spec: dict[str, Any], l4: str | None, h100: str | None
) -> None:
    constraint = node_constraint(spec)
    assert constraint is not None
    assert refusal(constraint, "l4-node", L4_NODE) == l4
    assert refusal(constraint, "h100-node", H100_NODE) == h100


def test_a_pod_without_node_constraints_has_none() -> None:
    assert node_constraint({"containers": [], "tolerations": [{"operator": "Exists"}]}) is None


def test_a_node_selector_on_the_product_judges_only_that_node_s_gpus_and_says_so() -> None:
    """Before, the H100 elsewhere in the cluster let a 14B pinned to the L4s through."""
    fleet = fleet_from_slices(MIXED, quantity_bytes, nodes=NODES)
    assert answer(fleet, review(QWEN_14B))["allowed"] is True  # on the H100
    on_l4 = answer(
        fleet, pinned(QWEN_14B, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}})
    )
    assert on_l4["allowed"] is False
    message = on_l4["status"]["message"]
    assert "does not fit on L4 (published by the cluster: 2 x L4 (" in message
    assert "on 1 node)" in message
    assert "Would fit: --tensor-parallel-size 2" in message
    assert (
        "no device on the nodes it may land on holds it (published: 2 x L4 (21.11 GiB "
        "claimable) on 1 node; judged on the nodes it may land on: l4-node; left out: "
        "h100-node (nodeSelector nvidia.com/gpu.product=NVIDIA-L4: the node's is "
        "'NVIDIA-H100-80GB-HBM3'))"
    ) in message
    away = pinned(QWEN_14B, affinity([expression("nvidia.com/gpu.product", "NotIn", "NVIDIA-L4")]))
    assert answer(fleet, away)["allowed"] is True


def test_tp_beyond_the_gpus_of_the_nodes_it_may_land_on_is_denied_naming_them() -> None:
    fleet = fleet_from_slices(MIXED, quantity_bytes, nodes=NODES)
    body = pinned([*QWEN_14B, "--tensor-parallel-size", "2"], {"nodeName": "h100-node"})
    response = answer(fleet, body)
    assert response["allowed"] is False
    assert (
        "needs 2 GPUs on one node but no node publishes more than 1 (published: 1 x H100-80GB"
    ) in response["status"]["message"]
    assert "left out: l4-node (spec.nodeName is h100-node)" in response["status"]["message"]


def test_no_publishing_node_it_may_land_on_judges_by_the_product_with_a_warning() -> None:
    fleet = fleet_from_slices(MIXED, quantity_bytes, nodes=NODES)
    body = pinned(QWEN_14B, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}})
    response = answer(fleet, body)
    assert response["allowed"] is True, response
    (warning,) = response["warnings"]
    assert warning.startswith(
        "container 'vllm' of Deployment team/llm: judged by its node selector, annotation or "
        "the default GPU: no node that publishes GPUs is one it may land on (left out: "
        "h100-node (nodeSelector nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB: the node's is "
    ), warning


def test_a_published_device_of_a_node_with_no_node_object_is_left_out() -> None:
    fleet = fleet_from_slices(MIXED, quantity_bytes, nodes={"l4-node": L4_NODE})
    response = answer(fleet, pinned(QWEN_14B, affinity([expression("pool", "DoesNotExist")])))
    assert response["allowed"] is False
    assert "left out: h100-node (no Node object has its name)" in response["status"]["message"]


def test_nodes_that_could_not_be_read_judge_on_every_published_gpu_with_a_warning() -> None:
    error = "the apiserver refused to list nodes (403: forbidden)"
    fleet = fleet_from_slices(MIXED, quantity_bytes, nodes_error=error)
    body = pinned(QWEN_14B, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}})
    response = answer(fleet, body)
    assert response["allowed"] is True  # on the H100, as before the nodes were read
    (warning,) = response["warnings"]
    assert warning == (
        "container 'vllm' of Deployment team/llm: judged on every published GPU: its node "
        f"selector or affinity could not be matched to the nodes ({error}); give the "
        "webhook's ServiceAccount list on nodes"
    )


def test_a_denial_names_at_most_eight_nodes_left_out() -> None:
    many = published(*((f"l4-{i:02}", "1xL4") for i in range(12)), ("h100-node", "1xH100-80GB"))
    nodes = {f"l4-{i:02}": L4_NODE for i in range(12)} | {"h100-node": H100_NODE}
    fleet = fleet_from_slices(many, quantity_bytes, nodes=nodes)
    llama_70b = ["meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192"]
    body = pinned(llama_70b, {"nodeSelector": {"pool": "big"}})
    message = answer(fleet, body)["status"]["message"]
    assert "judged on the nodes it may land on: h100-node; left out: l4-00 (" in message
    assert "l4-07 (nodeSelector pool=big: the node has none); and 4 more)" in message
    assert "l4-08" not in message
