"""The validating webhook in cluster mode, judged against published devices
(gatekeeper.k8s.fleet): the slices the node agents publish, as API dicts, in reviews out."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gatekeeper.cluster import resource_slice
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.k8s.fleet import Fleet, devices_from_slices, fleet_from_slices, shapes
from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.placement import PlacementPolicy
from gatekeeper.settings import Settings

L4_TOTAL = parse_declared_node("1xL4").gpus[0].visible_total_bytes
H100_TOTAL = parse_declared_node("1xH100-80GB").gpus[0].visible_total_bytes


def published(*nodes: tuple[str, str], generation: int = 1) -> list[dict[str, Any]]:
    """A slice per (node, declared GPUs) as ``resource_slice`` writes it."""
    return [
        resource_slice(node, parse_declared_node(gpus), PlacementPolicy(), generation=generation)
        for node, gpus in nodes
    ]


TWO_L4_NODES = published(("node-a", "2xL4"), ("node-b", "2xL4"))


def review(args: list[str], *, selector: str | None = None) -> dict[str, Any]:
    """An AdmissionReview of a Deployment running ``vllm serve`` with ``args``, no GPU named."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.11.0",
                "command": ["vllm", "serve"],
                "args": args,
            }
        ]
    }
    if selector is not None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": selector}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": "team"},
        "spec": {"selector": {}, "template": {"metadata": {}, "spec": spec}},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0a1b2c3d-0000-4000-8000-000000000001",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "llm",
            "namespace": "team",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": deployment,
        },
    }


def answer(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    webhook = webhook_from_settings(Settings(), published=lambda: fleet)
    status, payload, _ = webhook.answer(json.dumps(body).encode())
    assert status == 200, payload
    response: dict[str, Any] = payload["response"]
    return response


def test_devices_and_shapes_from_the_newest_generation_of_each_pool() -> None:
    stale = published(("node-a", "8xH100-80GB"))  # generation 1 of node-a's pool: replaced
    newer = published(("node-a", "2xL4"), generation=2)
    other_driver = copy.deepcopy(published(("node-c", "4xH100-80GB"))[0])
    other_driver["spec"]["driver"] = "gpu.nvidia.com"
    devices = devices_from_slices([*stale, *newer, other_driver], quantity_bytes)
    assert [(d.node, d.product, d.total_bytes) for d in devices] == [("node-a", "L4", L4_TOTAL)] * 2
    (shape,) = shapes(devices)
    assert (shape.devices, shape.nodes, shape.per_node) == (2, 1, 2)
    assert shape.compute_capability == (8, 9)
    assert shape.capacity_bytes < shape.total_bytes


def test_per_node_counts_devices_at_least_as_large_on_one_node() -> None:
    fleet = fleet_from_slices(
        published(("big", "1xH100-80GB,1xL4"), ("small", "2xL4")), quantity_bytes
    )
    assert [(s.product, s.devices, s.nodes, s.per_node) for s in fleet.shapes] == [
        ("H100-80GB", 1, 1, 1),
        ("L4", 3, 2, 2),
    ]
    assert fleet.shapes[0].total_bytes == H100_TOTAL


def test_a_device_without_memory_total_is_sized_by_its_product() -> None:
    slice_ = copy.deepcopy(TWO_L4_NODES[0])
    for device in slice_["spec"]["devices"]:
        del device["attributes"]["memoryTotal"]
    (shape,) = fleet_from_slices([slice_], quantity_bytes).shapes
    assert shape.total_bytes == L4_TOTAL


def test_a_70b_at_fp16_fits_no_published_device_and_says_what_is_published() -> None:
    fleet = fleet_from_slices(TWO_L4_NODES, quantity_bytes)
    response = answer(
        fleet, review(["meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192"])
    )
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert (
        "meta-llama/Llama-3.1-70B-Instruct does not fit on L4 (published by the cluster: "
        in message
    )
    assert "4 x L4 (" in message and "claimable) on 2 nodes" in message
    assert "no device the cluster publishes holds it" in message
    assert "Nothing nearby fits" in message


def test_a_denial_suggests_what_fits_on_the_published_nodes() -> None:
    fleet = fleet_from_slices(TWO_L4_NODES, quantity_bytes)
    response = answer(fleet, review(["Qwen/Qwen2.5-14B-Instruct", "--max-model-len", "8192"]))
    assert response["allowed"] is False
    assert "Would fit: --tensor-parallel-size 2" in response["status"]["message"]
    assert "--tensor-parallel-size 4" not in response["status"]["message"]  # no node has 4


def test_a_model_that_fits_a_published_device_is_allowed() -> None:
    fleet = fleet_from_slices(TWO_L4_NODES, quantity_bytes)
    response = answer(fleet, review(["Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192"]))
    assert response["allowed"] is True, response


def test_tp_beyond_what_one_node_publishes_is_denied() -> None:
    fleet = fleet_from_slices(TWO_L4_NODES, quantity_bytes)
    args = ["Qwen/Qwen2.5-7B-Instruct", "--tensor-parallel-size", "4"]
    response = answer(fleet, review(args))
    assert response["allowed"] is False
    assert (
        "needs 4 GPUs on one node but no node publishes more than 2"
        in (response["status"]["message"])
    )


def test_the_larger_device_is_tried_first_and_a_tp_group_takes_the_node_with_enough() -> None:
    fleet = fleet_from_slices(published(("big", "1xH100-80GB"), ("small", "2xL4")), quantity_bytes)
    qwen14 = ["Qwen/Qwen2.5-14B-Instruct", "--max-model-len", "8192"]
    assert answer(fleet, review(qwen14))["allowed"] is True  # on the H100
    assert answer(fleet, review([*qwen14, "--tensor-parallel-size", "2"]))["allowed"] is True


@pytest.mark.parametrize(
    ("fleet", "why"),
    [
        (Fleet(), "no node publishes a GPU under driver gpu.gatekeeper.dev yet; start the node"),
        (
            Fleet(error="the apiserver refused to list resourceslices (403: forbidden)"),
            "(403: forbidden); give the webhook's ServiceAccount list on resourceslices",
        ),
    ],
)
def test_nothing_published_warns_and_judges_by_the_node_selector(fleet: Fleet, why: str) -> None:
    args = ["meta-llama/Llama-3.1-70B-Instruct", "--max-model-len", "8192"]
    unnamed = answer(fleet, review(args))
    assert unnamed["allowed"] is True
    text = "\n".join(unnamed["warnings"])
    assert "cannot judge it by the cluster's GPUs: " in text and why in text
    assert "no GPU named" in text  # product mode's own warning: nothing else to go by
    on_l4 = answer(fleet, review(args, selector="NVIDIA-L4"))
    assert on_l4["allowed"] is False
    assert (
        "does not fit on L4 (nodeSelector nvidia.com/gpu.product=NVIDIA-L4)"
        in (on_l4["status"]["message"])
    )


def test_a_rank_whose_claim_exceeds_the_claimable_bytes_is_denied() -> None:
    """The agents keep 10 GiB back on each L4 (their margin setting): vLLM would start a 7B
    on the 22 GiB it sees, but a rank's claim cannot be allocated on what is left."""
    wide = PlacementPolicy(margin_bytes=10 * 2**30)
    slices = [resource_slice(n, parse_declared_node("2xL4"), wide) for n in ("node-a", "node-b")]
    fleet = fleet_from_slices(slices, quantity_bytes)
    (shape,) = fleet.shapes
    assert shape.total_bytes == L4_TOTAL and shape.capacity_bytes < 12 * 2**30
    response = answer(fleet, review(["Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192"]))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert (
        "a rank claims " in message
        and f"a published L4 has {shape.capacity_bytes} bytes" in message
    )
    assert "lower --max-model-len or quantize" in message
