"""Hybrid and attention-free models, the way vLLM's hybrid KV-cache allocator sizes them.

Each expected figure is computed by hand from the config and vLLM's rules:
``MambaStateShapeCalculator`` (state shapes), ``platforms/interface.py::
_align_hybrid_block_size`` (the attention block grows until a page holds a state, the
state page is padded to it), the hybrid allocator's groups of equal layer counts, and
``MambaSpec.max_memory_usage_bytes`` (2 blocks per request with prefix caching, 1
without, plus draft tokens).
"""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION, accounting_for
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.units import GIB, cdiv
from gatekeeper.vllm.flags import options_from_mapping

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")
KV = 20 * GIB

GRANITE_H = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "hidden_size": 4096,
    "num_hidden_layers": 40,
    "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)],
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "mamba_n_heads": 128,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "vocab_size": 100352,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}
JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 256,
    "vocab_size": 65536,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "intermediate_size": 5120,
    "vocab_size": 151936,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
MAMBA2 = {
    "architectures": ["Mamba2ForCausalLM"],
    "model_type": "mamba2",
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "num_heads": 128,
    "head_dim": 64,
    "n_groups": 8,
    "state_size": 128,
    "conv_kernel": 4,
    "expand": 2,
    "vocab_size": 32768,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 4096,
    "num_hidden_layers": 8,
    "hybrid_override_pattern": "M-M*-M-M",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 21504,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "vocab_size": 131072,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
FALCON_H1 = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 8192,
    "mamba_d_ssm": 3072,
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "vocab_size": 65537,
    "max_position_embeddings": 16384,
    "torch_dtype": "bfloat16",
}


ALIGN = accounting_for(DEFAULT_VLLM_VERSION).default_block_size
"""The hybrid block's alignment at the default release (64 from vLLM 0.34)."""


def run(config: dict[str, Any], **flags: Any) -> Estimate:
    spec = spec_from_config(config, name=config["model_type"])
    options = options_from_mapping(
        {"max_model_len": 8192, "kv_cache_memory_bytes": KV, **flags}, where="test"
    )[0]
    return estimate(spec, options, H100)


def test_granite_4_h_aligns_the_attention_block_to_a_mamba2_state():
    e = run(GRANITE_H)
    conv = (8192 + 2 * 1 * 128) * (4 - 1) * 2  # (I + 2 G N) x (k - 1), bf16
    ssm = 128 * 64 * 128 * 2  # heads x head_dim x d_state
    assert conv + ssm == 2_147_840
    attn_per_token = 8 * (128 + 128) * 2  # 8 KV heads, K and V of 128, bf16: 4,096 B
    # Platform._align_hybrid_block_size: the kernel alignment is max(the backend's least
    # kernel block, the cache's block size): 16 up to 0.33 (16 x 33 = 528 tokens), 64 from
    # 0.34 (CacheConfig.DEFAULT_BLOCK_SIZE; 64 x 9 = 576)
    block = ALIGN * cdiv(conv + ssm, ALIGN * attn_per_token)
    assert e.block_size == block == 576
    assert run(GRANITE_H, vllm_version="0.33.0").block_size == 528
    # 4 attention layers, 36 Mamba layers: groups of 4 (1 attention group, 9 Mamba groups)
    bytes_per_block = 4 * attn_per_token * block
    assert e.kv_block_bytes == bytes_per_block
    # prefix caching on: 2 state blocks per group, + 1 prefill checkpoint block for Mamba-2
    # (vLLM 0.32's mamba_mixer2.py; measured by tests/estimator/test_conformance.py)
    per_request = cdiv(8192, block) + 9 * 3
    assert e.blocks_per_request == per_request
    assert e.kv_bytes_per_token == 4 * attn_per_token  # the attention part only
    assert e.state_bytes_per_sequence == 36 * (conv + ssm)
    blocks = KV // bytes_per_block
    assert e.worst.num_blocks == blocks
    assert e.kv_cache_tokens == int(blocks / per_request * 8192)


def test_without_prefix_caching_a_state_holds_one_block():
    e = run(GRANITE_H, enable_prefix_caching=False)
    assert e.blocks_per_request == cdiv(8192, 576) + 9


def test_jamba_layers_mamba1_state_and_its_weights():
    e = run(JAMBA, tensor_parallel_size=2)
    inner = 2 * 4096 // 2  # expand x H over TP 2
    state = inner * (4 - 1) * 2 + inner * 16 * 2  # conv I x (k-1), SSM I x d_state
    assert e.state_bytes_per_sequence == 28 * state  # attention at 4, 12, 20, 28
    attn_per_token = 4 * 256 * 2  # 8 KV heads over TP 2
    assert e.kv_bytes_per_token == 4 * attn_per_token
    assert e.block_size == ALIGN * cdiv(state, ALIGN * attn_per_token) == 128
    # the published 51.6B parameters, 96.1 GiB in bf16 over two ranks
    assert 2 * e.worst.weights_bytes == pytest.approx(51.6e9 * 2, rel=0.01)


def test_qwen3_next_gated_delta_net_state():
    e = run(QWEN3_NEXT)
    conv_dim = 2 * 16 * 128 + 32 * 128
    state = conv_dim * 3 * 2 + 32 * 128 * 128 * 2  # conv, then Vh x Vd x Kd
    assert state == 1_097_728
    assert e.state_bytes_per_sequence == 36 * state  # every 4th of 48 layers attends
    attn_per_token = 2 * 512 * 2
    assert e.block_size == ALIGN * cdiv(state, ALIGN * attn_per_token) == 576
    assert e.kv_bytes_per_token == 12 * attn_per_token


def test_an_attention_free_model_holds_one_state_block_per_sequence():
    e = run(MAMBA2)
    conv = (8192 + 2 * 8 * 128) * 3 * 2
    ssm = 128 * 64 * 128 * 2
    per_sequence = 64 * (conv + ssm)
    assert e.kv_bytes_per_token == 0
    assert e.state_bytes_per_sequence == per_sequence
    assert e.kv_block_bytes == per_sequence  # one block: the whole state of a sequence
    assert e.blocks_per_request == 1  # no prefix caching for attention-free models
    assert e.max_concurrency == pytest.approx(KV // per_sequence, abs=1e-9)
    assert e.fits and e.max_model_len_fit == 8192
    # Mamba-2 blocks: in_proj, conv1d (+bias), dt_bias, A, D, gated norm, out_proj
    i, gn, h = 8192, 2 * 8 * 128, 4096
    mixer = h * (2 * i + gn + 128) + (i + gn) * 5 + 3 * 128 + i + i * h
    assert e.worst.weights_bytes == pytest.approx(
        (64 * (mixer + 2 * h) + 2 * 32768 * h + h) * 2, rel=0.001
    )


def test_nemotron_h_pattern_and_its_float32_ssm_state():
    e = run(NEMOTRON_H)
    conv = (8192 + 2 * 8 * 128) * 3 * 2  # bf16
    ssm = 128 * 64 * 128 * 4  # float32 unless the config says otherwise
    assert e.state_bytes_per_sequence == 4 * (conv + ssm)  # M at 0, 2, 5, 7
    assert e.kv_bytes_per_token == 1 * 8 * 256 * 2  # one * layer
    bf16 = run(NEMOTRON_H, mamba_ssm_cache_dtype="bfloat16")
    assert bf16.state_bytes_per_sequence == 4 * (conv + ssm // 2)


def test_falcon_h1_has_attention_and_mamba2_in_every_layer():
    e = run(FALCON_H1)
    conv = (3072 + 2 * 1 * 256) * 3 * 2
    ssm = 48 * 64 * 256 * 2
    assert e.state_bytes_per_sequence == 24 * (conv + ssm)
    assert e.kv_bytes_per_token == 24 * 2 * 256 * 2
    # 24 attention and 24 Mamba layers: two groups of 24; 3 Mamba-2 state blocks (align)
    assert e.blocks_per_request == cdiv(8192, e.block_size) + 3


def test_mamba_dtypes_tp_and_speculation_change_the_state():
    base = run(GRANITE_H)
    fp32 = run(GRANITE_H, mamba_cache_dtype="float32")
    assert fp32.state_bytes_per_sequence == 2 * base.state_bytes_per_sequence  # both on auto
    ssm32 = run(GRANITE_H, mamba_ssm_cache_dtype="float32")
    assert ssm32.state_bytes_per_sequence == 36 * ((8192 + 256) * 3 * 2 + 128 * 64 * 128 * 4)
    tp2 = run(GRANITE_H, tensor_parallel_size=2)
    # 1 group does not divide TP 2: padded to 2 groups, then everything halves
    assert tp2.state_bytes_per_sequence == 36 * (
        (8192 + 2 * 2 * 128) // 2 * 3 * 2 + 64 * 64 * 128 * 2
    )
    spec = run(GRANITE_H, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert spec.state_bytes_per_sequence == 36 * ((8192 + 256) * (3 + 2) * 2 + 128 * 64 * 128 * 2)
    assert spec.blocks_per_request == cdiv(8192, spec.block_size) + 9 * (2 + 1 + 2)


def test_pure_attention_models_report_no_state():
    spec = spec_from_config(
        {**JAMBA, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}, name="llama"
    )
    e = estimate(spec, ServeOptions(max_model_len=8192), H100)
    assert spec.state is None and e.state_bytes_per_sequence == 0
    assert e.to_json()["state_bytes_per_sequence"] == 0
