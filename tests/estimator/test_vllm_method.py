"""The estimator against hand-computed components and vLLM's printed figures."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import KV_DTYPES, ServeOptions
from gatekeeper.estimator.simple_method import simple_estimate
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.models.quantization import quant_from_config
from gatekeeper.models.source import resolve_model
from gatekeeper.units import GIB, MIB

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")
V019: dict[str, Any] = {
    "vllm_version": "0.19.0",
    "gpu_memory_utilization": 0.95,
    "max_model_len": 8192,
}


def test_seed_rule_figures_for_llama_2_7b():
    p = 7_000_000_000
    expected_gib = {32: 26.08, 16: 13.04, 8: 6.52, 4: 3.26}
    for bits, weights_gib in expected_gib.items():
        s = simple_estimate(p, bits)
        assert round(s.weights_bytes / GIB, 2) == weights_gib
        assert s.total_bytes == round(s.weights_bytes * 1.2)
    assert round(simple_estimate(p, 16).total_bytes / GIB, 2) == 15.65


def llama_31_8b_params() -> int:
    h, inter, vocab, layers = 4096, 14336, 128256, 32
    attention = h * h * 2 + h * 1024 * 2
    per_layer = attention + 3 * h * inter + 2 * h
    return layers * per_layer + 2 * vocab * h + h


def test_llama_31_8b_gqa_components_match_hand_computation_and_vllm():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    e = estimate(spec, ServeOptions(**V019), H100)
    w = e.worst
    rope_cache = 131072 * 128 * 2
    assert llama_31_8b_params() == 8_030_261_248
    assert w.weights_bytes == llama_31_8b_params() * 2 + rope_cache
    assert e.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    sampler = round(1024 * 128256 * (2 + 13.4))
    assert w.activation_peak_bytes == sampler
    budget = math.ceil(0.95 * H100.total_bytes)
    assert w.kv_cache_bytes == budget - w.weights_bytes - w.non_torch_bytes - sampler
    assert w.num_blocks == w.kv_cache_bytes // (2 * MIB)
    assert e.kv_cache_tokens == w.num_blocks * 16
    # vLLM v0.19.0 printed: 14.99 GiB weights, 58.11 GiB KV, 476,016 tokens.
    assert round(w.weights_bytes / GIB, 2) == 14.99
    assert abs(w.kv_cache_bytes / GIB - 58.11) < 0.05
    assert abs(e.kv_cache_tokens - 476_016) / 476_016 < 0.001
    assert e.fits and e.reasons == ()


def test_mixtral_moe_weights_per_rank_at_tp2():
    spec = resolve_model("mistralai/Mixtral-8x7B-Instruct-v0.1")
    e = estimate(spec, ServeOptions(tensor_parallel_size=2, max_model_len=4096), H100)
    h, inter, experts, layers, vocab = 4096, 14336, 8, 32, 32000
    attention = h * (h // 2) * 2 + h * (1024 // 2) * 2
    moe = experts * 3 * h * (inter // 2) + h * experts
    per_layer = attention + moe + 2 * h
    params = layers * per_layer + 2 * (vocab // 2) * h + h
    rope = spec.rope_cache_positions * 128 * 2
    assert e.worst.weights_bytes == params * 2 + rope
    assert e.kv_bytes_per_token == 32 * 2 * 4 * 128 * 2


def test_deepseek_v2_lite_mla_kv_is_replicated_across_tp():
    spec = resolve_model("deepseek-ai/DeepSeek-V2-Lite")
    assert spec.mla is not None
    per_token = 27 * (512 + 64) * 2
    for tp in (1, 2):
        e = estimate(spec, ServeOptions(tensor_parallel_size=tp, max_model_len=8192), H100)
        assert e.kv_bytes_per_token == per_token
        assert e.block_size == 64
    fp8 = estimate(spec, ServeOptions(kv_cache_dtype="fp8_ds_mla", max_model_len=8192), H100)
    assert fp8.kv_bytes_per_token == 27 * 656


def test_gemma_2_sliding_window_layers_use_the_hybrid_allocator():
    spec = resolve_model("google/gemma-2-9b-it")
    assert spec.layer_attention.count("sliding") == 21
    new = estimate(spec, ServeOptions(max_model_len=8192, vllm_version="0.19.0"), H100)
    old = estimate(spec, ServeOptions(max_model_len=8192, vllm_version="0.9.0"), H100)
    page = 8 * (256 + 256) * 2
    assert new.kv_bytes_per_token == old.kv_bytes_per_token == 42 * page
    # Hybrid: two groups of 21 layers sharing one pool; the sliding group keeps a window.
    assert new.worst.num_blocks == new.worst.kv_cache_bytes // (21 * page * 16)
    assert old.worst.num_blocks == old.worst.kv_cache_bytes // (42 * page * 16)
    long_new = estimate(
        spec,
        ServeOptions(max_model_len=8192, max_num_batched_tokens=512, vllm_version="0.19.0"),
        H100,
    )
    blocks_per_request = 512 + ((4096 - 1 + 512 + 15) // 16 + 1)
    assert long_new.max_concurrency == pytest.approx(long_new.worst.num_blocks / blocks_per_request)


def test_awq_linear_bytes_include_scales_and_zeros():
    q = quant_from_config({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    in_f, out_f = 3584, 18944
    assert q.linear_bytes(in_f, out_f, 2) == in_f * out_f // 2 + 28 * out_f * 2 + 28 * out_f // 2
    assert q.linear_bytes(in_f, out_f, 2) * 8 / (in_f * out_f) == pytest.approx(4 + 20 / 128)


def test_awq_checkpoint_keeps_embeddings_in_16_bit():
    awq = resolve_model("Qwen/Qwen2.5-7B-Instruct-AWQ")
    bf16 = resolve_model("Qwen/Qwen2.5-7B-Instruct")
    opts = ServeOptions(max_model_len=8192)
    w_awq = estimate(awq, opts, H100).worst.weights_bytes
    w_bf16 = estimate(bf16, opts, H100).worst.weights_bytes
    embeddings = 2 * 152064 * 3584 * 2
    linear_bf16 = w_bf16 - embeddings
    # Quantized linears take ~4.16/16 of their bf16 bytes; the embeddings do not shrink.
    assert embeddings < w_awq < embeddings + linear_bf16 * 0.30
    assert w_awq > embeddings + linear_bf16 * 0.25


def test_kv_need_grows_with_max_model_len_while_the_pool_does_not():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    runs = [
        estimate(spec, ServeOptions(max_model_len=n, max_num_batched_tokens=8192), H100)
        for n in (4096, 32768, 131072)
    ]
    pools = {r.worst.kv_cache_bytes for r in runs}
    assert len(pools) == 1
    concurrency = [r.max_concurrency for r in runs]
    assert concurrency[0] > concurrency[1] > concurrency[2]


def test_tp_halves_the_weights():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    rope = 131072 * 128 * 2
    w1 = estimate(spec, ServeOptions(), H100).worst.weights_bytes - rope
    w2 = estimate(spec, ServeOptions(tensor_parallel_size=2), H100).worst.weights_bytes - rope
    assert w2 * 2 == pytest.approx(w1, rel=1e-4)  # norms are replicated, not split


def test_kv_heads_replicate_when_tp_exceeds_them():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")  # 8 KV heads
    per_token = {
        tp: estimate(spec, ServeOptions(tensor_parallel_size=tp), H100).kv_bytes_per_token
        for tp in (2, 8, 16)
    }
    assert per_token[2] == 4 * per_token[8]
    assert per_token[16] == per_token[8]  # one head per rank, replicated


def test_fp8_kv_halves_the_kv_page():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    auto = estimate(spec, ServeOptions(), H100)
    fp8 = estimate(spec, ServeOptions(kv_cache_dtype="fp8"), H100)
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    assert "fp8" in KV_DTYPES


def test_too_long_max_model_len_does_not_fit_and_says_what_would():
    spec = resolve_model("Qwen/Qwen3-32B")
    e = estimate(
        spec,
        ServeOptions(max_model_len=32000, vllm_version="0.10.1", gpu_memory_utilization=0.9),
        H100,
    )
    assert not e.fits
    assert "max_model_len 32000" in e.reasons[0]
    assert 0 < e.max_model_len_fit < 32000
    ok = estimate(
        spec,
        ServeOptions(
            max_model_len=e.max_model_len_fit, vllm_version="0.10.1", gpu_memory_utilization=0.9
        ),
        H100,
    )
    assert ok.fits


def test_model_bigger_than_the_gpu_does_not_fit():
    e = estimate(resolve_model("deepseek-ai/DeepSeek-R1"), ServeOptions(max_model_len=16000), H100)
    assert not e.fits and "weights need" in e.reasons[0]


def test_free_memory_check_uses_live_free_memory():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    busy = dataclasses.replace(H100, free_bytes=40 * GIB)
    e = estimate(spec, ServeOptions(max_model_len=8192, vllm_version="0.33.0"), busy)
    assert not e.fits and "free memory" in e.reasons[0]
    # 0.34's extensible KV cache skips the refusal (v1/worker/utils.py:783-786) and sizes
    # the cache from what is free; with the cache off the refusal is back
    capped = estimate(spec, ServeOptions(max_model_len=8192, vllm_version="0.34.0"), busy)
    assert capped.fits and capped.worst.kv_cache_bytes < 40 * GIB - capped.worst.weights_bytes
    off = ServeOptions(max_model_len=8192, vllm_version="0.34.0", enable_extensible_kv_cache=False)
    refused = estimate(spec, off, busy)
    assert not refused.fits and "free memory" in refused.reasons[0]


def test_cuda_graphs_enter_the_budget_from_v0_21():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    old = estimate(
        spec, ServeOptions(vllm_version="0.20.0", gpu_memory_utilization=0.9), H100
    ).worst
    new = estimate(
        spec, ServeOptions(vllm_version="0.21.0", gpu_memory_utilization=0.9), H100
    ).worst
    assert new.kv_cache_bytes == old.kv_cache_bytes - new.cuda_graph_bytes
    eager = estimate(spec, ServeOptions(enforce_eager=True), H100).worst
    assert eager.cuda_graph_bytes == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
        ({"quantization": "nonsense"}, "quantization"),
        ({"quantization": "awq"}, "quantization"),
        ({"vllm_version": "latest"}, "vllm_version"),
        ({"pipeline_parallel_size": 64}, "pipeline_parallel_size"),
    ],
)
def test_bad_serving_options_name_the_field(options, field):
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    with pytest.raises(ServeOptionsError) as info:
        estimate(spec, ServeOptions(**options), H100)
    assert info.value.field == field
    assert field in str(info.value)


def test_multimodal_profile_runs_the_vision_encoder_on_the_largest_image():
    spec = resolve_model("Qwen/Qwen2.5-VL-72B-Instruct")
    assert spec.vision is not None
    assert spec.vision.patches_per_item == 65536 and spec.vision.tokens_per_item == 16384
    e = estimate(
        spec,
        ServeOptions(tensor_parallel_size=4, vllm_version="0.8.3", max_model_len=8192),
        GpuTarget(total_bytes=round(39.38 * GIB), name="A100-40GB"),
    )
    # One item fills the encoder cache (16,384 tokens >= 2,048 batched tokens).
    per_patch = 3 * 3456 + 3 * 1280 + 1280
    expected = (65536 * per_patch + 16384 * 8192) * 2
    assert e.stages[0].activation_peak_bytes == expected
    # vLLM 0.8.3 printed 2.51 GiB for this profile (shared/calibration obs-011).
    assert abs(expected / GIB - 2.51) / 2.51 < 0.2


def test_cross_attention_models_profile_one_image_per_sequence_on_v0():
    spec = resolve_model("meta-llama/Llama-3.2-11B-Vision")
    assert spec.vision is not None and spec.vision.cross_attention
    opts = ServeOptions(
        max_model_len=65536, max_num_seqs=128, enforce_eager=True, vllm_version="0.7.0"
    )
    e = estimate(spec, opts, H100)
    assert e.stages[0].activation_peak_bytes > 30 * GIB  # vLLM printed 36.63 GiB
    fewer = estimate(spec, dataclasses.replace(opts, max_num_seqs=16), H100)
    assert fewer.stages[0].activation_peak_bytes * 7 < e.stages[0].activation_peak_bytes


def test_custom_all_reduce_buffers_only_on_supported_world_sizes():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    nt = {
        tp: estimate(
            spec, ServeOptions(tensor_parallel_size=tp, vllm_version="0.19.0"), H100
        ).worst.non_torch_bytes
        for tp in (1, 2, 8, 16)
    }
    assert nt[2] == nt[8] > nt[1]
    assert nt[16] == nt[1]  # beyond one node: NCCL ring buffers only


def test_an_embedded_engine_has_almost_no_non_torch_growth_and_llm_class_batches():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    served = estimate(spec, ServeOptions(vllm_version="0.19.0"), H100)
    embedded = estimate(spec, ServeOptions(vllm_version="0.19.0", embedded=True), H100)
    assert embedded.worst.non_torch_bytes == 10 * MIB < served.worst.non_torch_bytes
    assert served.max_num_batched_tokens == 8192 and embedded.max_num_batched_tokens == 16384


def test_the_largest_length_that_fits_never_exceeds_the_models_derived_maximum():
    spec = resolve_model("facebook/opt-125m")
    assert spec.max_position_embeddings == 2048
    e = estimate(spec, ServeOptions(max_model_len=32768), H100)
    assert e.length_beyond_model and not e.fits
    assert e.max_model_len_fit == 2048  # not 32768: vLLM refuses anything longer
