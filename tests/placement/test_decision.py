"""Placement: best fit, TP groups, flags that pass vLLM's checks, reasons and suggestions."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.overhead import pre_init_bytes
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.inventory import InventorySnapshot
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.placement.gpu_search import gpu_lines
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.units import GIB

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
LLAMA70 = resolve_model("meta-llama/Llama-3.3-70B-Instruct")
SHARED = PlacementPolicy(share_gpus=True)
ONE_SEQ = PlacementPolicy(share_gpus=True, shared_kv_sequences=1)


def node(text: str, used_gib: dict[int, float] | None = None) -> InventorySnapshot:
    snap = parse_declared_node(text)
    gpus = []
    for g in snap.gpus:
        used = round((used_gib or {}).get(g.index, 0) * GIB)
        gpus.append(dataclasses.replace(g, free_bytes=g.free_bytes - used, used_bytes=used))
    return dataclasses.replace(snap, gpus=tuple(gpus))


def req(spec=LLAMA8, **options) -> PlacementRequest:
    options.setdefault("max_model_len", 8192)
    return PlacementRequest(spec, ServeOptions(**options))


def test_best_fit_prefers_the_gpu_with_least_room_left():
    d = decide(req(), node("3xH100-80GB", {0: 10, 1: 50, 2: 30}), policy=SHARED)
    assert d.admitted and d.placement is not None
    assert d.placement.gpu_indices == (1,)


def test_usable_memory_subtracts_reservations_and_margin():
    snap = node("2xH100-80GB", {1: 30})
    lines = gpu_lines(snap, {snap.gpus[0].uuid: 60 * GIB}, {}, SHARED)
    g0 = lines[0]
    assert g0.usable_bytes == g0.free_bytes - 60 * GIB - g0.margin_bytes
    assert g0.margin_bytes == SHARED.margin_bytes + int(0.02 * g0.total_bytes)
    d = decide(req(), snap, reserved={snap.gpus[0].uuid: 60 * GIB}, policy=SHARED)
    assert d.placement is not None and d.placement.gpu_indices == (1,)


def test_unplaceable_gpus_are_never_chosen():
    snap = node("3xH100-80GB")
    sick = dataclasses.replace(snap.gpus[0], healthy=False, error="NVML_ERROR_GPU_IS_LOST")
    fenced = dataclasses.replace(snap.gpus[1], fence_reason="MIG mode is enabled")
    snap = dataclasses.replace(snap, gpus=(sick, fenced, snap.gpus[2]))
    d = decide(req(), snap)
    assert d.placement is not None and d.placement.gpu_indices == (2,)
    only = PlacementPolicy(allowed_gpus=frozenset({"0", "1"}))
    rejected = decide(req(), snap, policy=only)
    assert not rejected.admitted
    statuses = [g.status for g in rejected.gpus]
    assert statuses[0].startswith("unhealthy") and statuses[1].startswith("fenced")
    assert statuses[2] == "not allowed by the policy"


def test_ties_go_to_the_gpu_hosting_fewer_workers():
    snap = node("2xH100-80GB")
    d = decide(req(), snap, workers={snap.gpus[0].uuid: 1}, policy=SHARED)
    assert d.placement is not None and d.placement.gpu_indices == (1,)
    exclusive = decide(req(), snap, workers={snap.gpus[1].uuid: 1})
    assert exclusive.placement is not None and exclusive.placement.gpu_indices == (0,)


def test_smallest_tp_group_that_fits_and_same_product_first():
    d = decide(
        req(LLAMA70, kv_cache_dtype="fp8", max_model_len=32768), node("1xA100-80GB,2xH100-80GB")
    )
    assert d.placement is not None
    assert d.placement.flags.tensor_parallel_size == 2
    assert d.placement.gpu_indices == (1, 2)


def test_tp_sizes_that_do_not_divide_the_heads_are_skipped():
    phi4 = resolve_model("microsoft/phi-4")  # 40 heads, 10 KV heads: TP 4 and 8 are invalid
    d = decide(req(phi4, max_model_len=16384), node("8xL4"), policy=SHARED)
    assert d.placement is not None and d.placement.flags.tensor_parallel_size == 2


def test_exclusive_worker_gets_a_fraction_that_passes_vllms_free_memory_check():
    snap = node("1xH100-80GB", {0: 5})
    d = decide(req(), snap)
    assert d.placement is not None
    p, gpu, line = d.placement, snap.gpus[0], d.gpus[0]
    u = p.flags.gpu_memory_utilization
    assert p.flags.kv_cache_memory_bytes is None
    # vLLM: free (after the worker's own CUDA context) >= ceil(u * total).
    assert gpu.free_bytes - pre_init_bytes(1) >= math.ceil(u * gpu.visible_total_bytes)
    assert p.promise_bytes[0] <= line.usable_bytes
    assert p.kv_cache_bytes > 50 * GIB  # the whole GPU's room goes to KV
    assert "--gpu-memory-utilization" in p.args and f"{u:.4f}" in p.args


def test_shared_worker_gets_a_byte_budget_for_the_kv_it_asked_for():
    d = decide(dataclasses.replace(req(), min_sequences=4), node("1xH100-80GB"), policy=ONE_SEQ)
    one = decide(req(), node("1xH100-80GB"), policy=ONE_SEQ)
    assert d.placement is not None and one.placement is not None
    kv, kv_one = d.placement.flags.kv_cache_memory_bytes, one.placement.flags.kv_cache_memory_bytes
    assert kv is not None and kv_one is not None
    block = d.placement.estimate.kv_block_bytes
    per = 8192 // d.placement.estimate.block_size  # blocks of one sequence of 8192
    assert kv == block * (4 * per + 1) and kv_one == block * (per + 1)
    e = d.placement.estimate.worst
    in_budget = (
        e.weights_bytes + e.non_torch_bytes + e.activation_peak_bytes + kv + e.cuda_graph_bytes
    )
    assert d.placement.flags.gpu_memory_utilization * d.gpus[0].total_bytes >= in_budget
    assert "--kv-cache-memory-bytes" in d.placement.args


def test_rejection_names_the_numbers_and_what_would_fit():
    d = decide(req(LLAMA70, max_model_len=32768), node("2xH100-80GB"))
    assert not d.admitted
    text = "\n".join(d.reasons)
    assert "Llama-3.3-70B-Instruct at TP=2 needs" in text and "GiB" in text
    assert "GPU 0 (H100-80GB)" in text and "short by" in text
    kinds = {s.kind: s for s in d.suggestions}
    assert {"max_model_len", "kv_cache_dtype", "quantization"} <= kinds.keys()
    shorter = kinds["max_model_len"].options["max_model_len"]
    assert decide(req(LLAMA70, max_model_len=shorter), node("2xH100-80GB"), suggest=False).admitted
    assert not decide(
        req(LLAMA70, max_model_len=shorter + 1), node("2xH100-80GB"), suggest=False
    ).admitted


def test_nothing_fits_or_fits_once_idle():
    v3 = resolve_model("deepseek-ai/DeepSeek-V3")
    d = decide(req(v3), node("2xL4"))
    assert [s.kind for s in d.suggestions] == ["none"]
    busy = decide(
        req(LLAMA8, max_model_len=131072, kv_cache_dtype="fp8", quantization="fp8"),
        node("1xL4", {0: 20}),
    )
    assert not busy.admitted
    assert any(s.kind in ("wait", "max_model_len") for s in busy.suggestions)


def test_fixed_tp_rejection_suggests_a_tp_that_fits():
    d = decide(
        PlacementRequest(
            LLAMA70, ServeOptions(max_model_len=8192, tensor_parallel_size=1), auto_parallel=False
        ),
        node("4xH100-80GB"),
    )
    assert not d.admitted
    tp = [s for s in d.suggestions if s.kind == "parallelism"]
    assert tp and tp[0].options["tensor_parallel_size"] == 2


def test_max_model_len_beyond_the_model_is_rejected_with_vllms_reason():
    d = decide(req(max_model_len=500_000), node("8xH100-80GB"), suggest=False)
    assert not d.admitted
    assert any("derived maximum" in r for r in d.reasons)


def test_decision_json_is_machine_readable():
    d = decide(req(), node("1xH100-80GB")).to_json()
    assert d["admitted"] is True
    assert d["placement"]["vllm_args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert isinstance(d["placement"]["promise_bytes"][0], int)
    assert d["gpus"][0]["status"] == "chosen"


@settings(max_examples=40, deadline=None)
@given(
    used=st.lists(st.floats(min_value=0, max_value=79), min_size=1, max_size=4),
    length=st.sampled_from([2048, 8192, 32768, 131072]),
    share=st.booleans(),
    model=st.sampled_from(
        ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-0.6B", "Qwen/Qwen2.5-32B-Instruct"]
    ),
)
def test_an_admission_never_promises_more_than_is_usable(used, length, share, model):
    snap = node(f"{len(used)}xH100-80GB", dict(enumerate(used)))
    policy = PlacementPolicy(share_gpus=share)
    d = decide(req(resolve_model(model), max_model_len=length), snap, policy=policy, suggest=False)
    if not d.admitted:
        return
    assert d.placement is not None
    usable = {g.index: g.usable_bytes for g in gpu_lines(snap, {}, {}, policy)}
    for index, promise in zip(d.placement.gpu_indices, d.placement.promise_bytes, strict=True):
        assert promise <= usable[index]
    assert len(set(d.placement.gpu_indices)) == d.placement.flags.tensor_parallel_size


def test_bad_request_with_fixed_tp_is_an_error():
    from gatekeeper.errors import ServeOptionsError

    with pytest.raises(ServeOptionsError, match="tensor_parallel_size"):
        decide(
            PlacementRequest(LLAMA8, ServeOptions(tensor_parallel_size=3), auto_parallel=False),
            node("4xH100-80GB"),
        )


def test_a_local_checkpoint_is_launched_by_its_path(tmp_path):
    import json

    from gatekeeper.models.source import load_model_dir

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512,
    }  # fmt: skip
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(config))
    spec = load_model_dir(tmp_path / "tiny")
    d = decide(PlacementRequest(spec, ServeOptions(max_model_len=256)), node("1xL4"))
    assert d.placement is not None and d.placement.args[0] == str((tmp_path / "tiny").resolve())
