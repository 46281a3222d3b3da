"""The pure half of the mutating webhook's claims (``gatekeeper.cluster.claims``): an
estimate as a ResourceClaimTemplate, and a hand-written template's requests back."""

from __future__ import annotations

import math
from typing import Any

import kubernetes_validate
import pytest
from lightkube.utils.quantity import parse_quantity

from gatekeeper import PlacementPolicy, ServeOptions, estimate, resolve_model
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.claims import (
    ClaimError,
    RankSizing,
    capability_selector,
    claim_template,
    claim_template_spec,
    requested_memory,
    size_ranks,
    template_name,
)
from gatekeeper.estimator.accounting import accounting_by_name
from gatekeeper.estimator.overhead import pre_init_bytes
from gatekeeper.estimator.vllm_method import GpuTarget
from gatekeeper.gpus.products import gpu_products, lookup_gpu

MiB = 2**20
QWEN = resolve_model("Qwen/Qwen2.5-7B-Instruct")
B200 = lookup_gpu("B200")
POLICY = PlacementPolicy()


def _sized(options: ServeOptions, gpu: str = "B200") -> RankSizing:
    product = lookup_gpu(gpu)
    return size_ranks(QWEN, options, product.total_bytes, product.name, POLICY)


def test_a_rank_is_its_components_with_the_kv_cache_of_eight_sequences() -> None:
    """The claim is placement's promise on a shared GPU: context, weights, non-torch,
    activation, graphs and a KV cache of min(max_num_seqs, 8) sequences of the length."""
    options = ServeOptions(max_model_len=8192)
    sized = _sized(options)
    e = estimate(QWEN, options, GpuTarget(B200.total_bytes, name=B200.name))
    kv = e.kv_bytes_for(POLICY.shared_kv_sequences)
    w = e.worst
    parts = w.weights_bytes + w.non_torch_bytes + w.activation_peak_bytes + w.cuda_graph_bytes
    assert sized.kv_cache_memory_bytes == kv
    # outside the budget: the CUDA context, and from 0.33 the cuBLAS workspace
    assert sized.rank_bytes == pre_init_bytes(1, accounting_by_name(e.accounting)) + parts + kv
    assert sized.request_bytes % MiB == 0 and 0 <= sized.request_bytes - sized.rank_bytes < MiB
    assert (sized.ranks, sized.min_capability) == (1, None)


def test_an_operators_byte_budget_is_kept() -> None:
    sized = _sized(ServeOptions(max_model_len=8192, kv_cache_memory_bytes=6 * 2**30))
    assert sized.kv_cache_memory_bytes == 6 * 2**30


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_the_fraction_passes_vllms_start_up_check_on_every_gpu(tp: int) -> None:
    """vLLM refuses to start unless free >= ceil(u x total), free measured after the CUDA
    context and NCCL; the claim holds its bytes free on the device, so ceil(u x total)
    must stay within the claim less that pre-init memory on every GPU of the table."""
    sized = _sized(ServeOptions(max_model_len=4096, tensor_parallel_size=tp))
    assert sized.ranks == tp
    for product in gpu_products():
        requested = math.ceil(product.total_bytes * sized.gpu_memory_utilization)
        assert requested <= sized.request_bytes - pre_init_bytes(tp), product.name
    assert sized.gpu_memory_utilization >= 0.0001


def test_fp8_weights_need_the_capability_vllm_checks() -> None:
    assert _sized(ServeOptions(max_model_len=4096, quantization="fp8")).min_capability == (7, 5)


def test_a_model_no_gpu_of_the_size_holds_is_refused_with_the_need() -> None:
    llama = resolve_model("meta-llama/Llama-3.1-70B-Instruct")
    l4 = lookup_gpu("L4")
    with pytest.raises(ClaimError, match=r"needs .* GiB per GPU .*; it does not fit on one L4"):
        size_ranks(llama, ServeOptions(max_model_len=8192), l4.total_bytes, l4.name, POLICY)


def _spec(ranks: int = 2, capability: tuple[int, int] | None = (7, 5)) -> dict[str, Any]:
    return claim_template_spec(RankSizing(ranks, 20 * 2**30 + 1, 2**30, 0.1, capability))


def test_the_template_has_a_request_per_rank_and_keeps_a_tp_group_together() -> None:
    devices = _spec()["spec"]["devices"]
    assert [r["name"] for r in devices["requests"]] == ["rank0", "rank1"]
    for request in devices["requests"]:
        exactly = request["exactly"]
        assert exactly["deviceClassName"] == "gpu.gatekeeper.dev" and exactly["count"] == 1
        assert exactly["capacity"]["requests"]["memory"] == str(20 * 2**30 + MiB)
    assert devices["constraints"] == [
        {"requests": ["rank0", "rank1"], "matchAttribute": "gpu.gatekeeper.dev/node"},
        {"requests": ["rank0", "rank1"], "distinctAttribute": "gpu.gatekeeper.dev/uuid"},
    ]
    single = _spec(1, None)["spec"]["devices"]
    assert "constraints" not in single and "selectors" not in single["requests"][0]["exactly"]


def test_the_selector_compares_the_published_capability() -> None:
    expression = capability_selector((8, 9))["cel"]["expression"]
    assert expression == (
        '"cudaComputeCapability" in device.attributes["gpu.gatekeeper.dev"] && '
        'device.attributes["gpu.gatekeeper.dev"].cudaComputeCapability'
        '.compareTo(semver("8.9.0")) >= 0'
    )


def test_the_name_follows_the_spec() -> None:
    assert template_name(_spec()) == template_name(_spec())
    assert template_name(_spec()) != template_name(_spec(3))
    assert len(template_name(_spec())) == len("vllm-gpus-") + 16


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_the_template_validates_strictly_against_each_supported_kubernetes(version: str) -> None:
    for spec in (_spec(), _spec(1, None)):
        kubernetes_validate.validate(claim_template("ns", spec), version, strict=True)


def test_a_hand_written_templates_requests_read_back_as_bytes() -> None:
    spec = {"spec": {"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": "c", "capacity": {"requests": {"memory": "12Gi"}}}},
        {"name": "b", "exactly": {"deviceClassName": "c"}},
        {"name": "c", "firstAvailable": [
            {"name": "x", "deviceClassName": "c", "capacity": {"requests": {"memory": "40Gi"}}},
            {"name": "y", "deviceClassName": "c", "capacity": {"requests": {"memory": "20Gi"}}},
        ]},
    ]}}}  # fmt: skip
    assert requested_memory(spec, quantity_bytes) == [12 * 2**30, None, 20 * 2**30]
    assert parse_quantity("12Gi") == 12 * 2**30
