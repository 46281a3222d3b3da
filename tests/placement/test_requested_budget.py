"""A utilization or KV budget the operator asks for is honoured, or refused with the reason;
never silently replaced by placement's own numbers."""

from __future__ import annotations

import math

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import resolve_model
from gatekeeper.placement import PlacementPolicy, PlacementRequest, decide
from gatekeeper.units import GIB

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
H100 = parse_declared_node("1xH100-80GB")


def _decide(policy: PlacementPolicy | None = None, **options):
    options.setdefault("max_model_len", 8192)
    return decide(
        PlacementRequest(LLAMA8, ServeOptions(**options), auto_parallel=False), H100, policy=policy
    )


def test_a_requested_utilization_is_launched_as_asked_and_promised_in_full():
    for policy in (PlacementPolicy(), PlacementPolicy(share_gpus=True)):
        d = _decide(policy, gpu_memory_utilization=0.5)
        assert d.admitted and d.placement is not None
        flags = d.placement.flags
        assert flags.gpu_memory_utilization == 0.5 and flags.kv_cache_memory_bytes is None
        assert "--gpu-memory-utilization" in d.placement.args
        assert (
            float(d.placement.args[d.placement.args.index("--gpu-memory-utilization") + 1]) == 0.5
        )
        total = H100.gpus[0].visible_total_bytes
        assert d.placement.promise_bytes[0] >= math.ceil(0.5 * total)
        assert d.placement.kv_cache_bytes > 10 * GIB  # what vLLM gives: the budget's rest


def test_a_requested_kv_budget_is_launched_exactly():
    for policy in (PlacementPolicy(), PlacementPolicy(share_gpus=True)):
        d = _decide(policy, kv_cache_memory_bytes=6 * GIB)
        assert d.admitted and d.placement is not None
        assert d.placement.flags.kv_cache_memory_bytes == 6 * GIB
        assert d.placement.kv_cache_bytes == 6 * GIB
        assert d.placement.prediction.kv_cache_bytes == 6 * GIB


def test_a_budget_too_small_for_one_request_is_refused_with_the_reason():
    d = _decide(gpu_memory_utilization=0.2)  # 15.8 GiB: the 8B model's weights fill it
    assert not d.admitted
    assert any("--gpu-memory-utilization 0.2 leaves" in r for r in d.reasons), d.reasons
    small = _decide(kv_cache_memory_bytes=2**20)
    assert not small.admitted
    assert any("--kv-cache-memory-bytes 1048576 leaves" in r for r in small.reasons)


def test_a_utilization_beyond_what_is_free_is_refused():
    busy = parse_declared_node("1xH100-80GB")
    g = busy.gpus[0]
    import dataclasses

    busy = dataclasses.replace(
        busy,
        gpus=(dataclasses.replace(g, free_bytes=g.free_bytes // 2, used_bytes=g.free_bytes // 2),),
    )
    d = decide(
        PlacementRequest(LLAMA8, ServeOptions(max_model_len=8192, gpu_memory_utilization=0.9)),
        busy,
    )
    assert not d.admitted
    assert d.gpus[0].need_bytes is not None and d.gpus[0].need_bytes >= 0.9 * g.visible_total_bytes


def test_on_a_mixed_node_the_budget_picks_the_gpus_it_works_on():
    mixed = parse_declared_node("1xL4,1xH100-80GB")
    request = PlacementRequest(
        LLAMA8, ServeOptions(max_model_len=8192, gpu_memory_utilization=0.3), auto_parallel=False
    )
    d = decide(request, mixed)
    assert d.admitted and d.placement is not None
    assert d.placement.gpu_indices == (1,)  # 0.3 of an L4 cannot hold the weights
    assert d.placement.flags.gpu_memory_utilization == 0.3


def test_a_utilization_asked_with_a_kv_budget_is_kept():
    d = _decide(gpu_memory_utilization=0.9, kv_cache_memory_bytes=6 * GIB)
    assert d.admitted and d.placement is not None
    assert d.placement.flags.gpu_memory_utilization == 0.9
    assert d.placement.flags.kv_cache_memory_bytes == 6 * GIB
