"""The search apart from the decision: what it finds, and the estimate cache its caller holds."""

from __future__ import annotations

import dataclasses

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import resolve_model
from gatekeeper.placement import EstimateCache, PlacementRequest, decide, search
from gatekeeper.placement.types import Prediction, auto_parallel

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
LLAMA70 = resolve_model("meta-llama/Llama-3.3-70B-Instruct")


def test_search_finds_what_decide_admits_and_records_the_shapes_it_tried():
    request = PlacementRequest(LLAMA70, ServeOptions(max_model_len=8192))
    snapshot = parse_declared_node("4xH100-80GB")
    found = search(request, snapshot)
    decision = decide(request, snapshot)
    assert found.placement is not None and decision.placement is not None
    assert found.placement.gpu_indices == decision.placement.gpu_indices
    assert found.placement.args == decision.placement.args
    assert found.placement.flags.tensor_parallel_size == 2
    assert [g.index for g in found.chosen] == list(found.placement.gpu_indices)
    one_l4 = search(request, parse_declared_node("1xL4"))
    assert one_l4.placement is None
    assert [shape for shape, _ in one_l4.tried] == [(1, 1)]


def test_the_estimate_cache_is_reused_across_decisions_and_keyed_by_the_spec_object():
    cache = EstimateCache()
    snapshot = parse_declared_node("2xH100-80GB")
    request = PlacementRequest(LLAMA8, ServeOptions(max_model_len=8192))
    first = decide(request, snapshot, cache=cache)
    size = len(cache)
    assert size >= 1
    again = decide(request, snapshot, cache=cache)
    assert len(cache) == size and again == first
    # An equal but distinct spec object is not served another object's estimate.
    twin = dataclasses.replace(LLAMA8)
    decide(dataclasses.replace(request, model=twin), snapshot, cache=cache)
    assert len(cache) == size + 1


def test_the_estimate_cache_is_bounded():
    cache = EstimateCache(limit=2)
    snapshot = parse_declared_node("1xH100-80GB")
    for length in (1024, 2048, 4096):
        search(PlacementRequest(LLAMA8, ServeOptions(max_model_len=length)), snapshot, cache=cache)
    assert len(cache) <= 2


def test_a_prediction_survives_its_json_form():
    decision = decide(
        PlacementRequest(LLAMA8, ServeOptions(max_model_len=8192)),
        parse_declared_node("1xH100-80GB"),
    )
    assert decision.placement is not None
    prediction = decision.placement.prediction
    recorded = decision.to_json()["placement"]["predicted"]
    assert Prediction.from_json(recorded) == prediction
    assert prediction.weights_bytes > 0 and prediction.kv_cache_bytes > 0
    assert Prediction.from_json({"weights_bytes": "12", "kv_cache_bytes": True}) is None
    assert Prediction.from_json({"weights_bytes": 12}) == Prediction(weights_bytes=12)


def test_parallelism_is_searched_only_when_the_request_fixes_none():
    assert auto_parallel([])
    assert auto_parallel(["max_model_len", "kv_cache_dtype"])
    assert not auto_parallel(["tensor_parallel_size"])
    assert not auto_parallel({"pipeline_parallel_size": 2})
