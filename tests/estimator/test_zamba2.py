"""Zamba2 as vLLM 0.32's ``zamba2.py`` builds it: a Mamba-2 mixer in every layer, and in
the "hybrid" layers one of ``num_mem_blocks`` shared transformer blocks (built once each,
taken in turn), with per-layer adapters and a ``linear`` of their own; KV only in the
hybrid layers' attention, a Mamba-2 state in every layer.

Each expected figure is computed by hand from the config and ``zamba2.py``."""

from __future__ import annotations

from typing import Any

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION, accounting_for
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.units import GIB, cdiv
from gatekeeper.vllm.flags import options_from_mapping

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")
KV = 4 * GIB

H, INNER, HEADS, N = 64, 128, 4, 16  # hidden, mamba_expand x hidden, Mamba heads, d_state
ZAMBA2: dict[str, Any] = {
    "architectures": ["Zamba2ForCausalLM"],
    "model_type": "zamba2",
    "hidden_size": H,
    "num_hidden_layers": 6,
    "layers_block_type": ["mamba", "mamba", "hybrid", "mamba", "hybrid", "hybrid"],
    "num_mem_blocks": 2,
    "use_shared_attention_adapter": True,
    "adapter_rank": 8,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "n_mamba_heads": HEADS,
    "mamba_d_state": N,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_ngroups": 1,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def run(config: dict[str, Any], **flags: Any) -> Estimate:
    spec = spec_from_config(config, name="zamba2")
    options = options_from_mapping(
        {"max_model_len": 8192, "kv_cache_memory_bytes": KV, **flags}, where="test"
    )[0]
    return estimate(spec, options, H100)


def test_zamba2_counts_each_shared_block_once_and_each_hybrid_layer_its_own_parts():
    e = run(ZAMBA2)
    # MambaMixer2 in each of the 6 layers: in_proj H -> 2I + 2GN + heads, conv1d (I + 2GN)
    # x k (+bias), dt_bias, A, D, the gated norm (I), out_proj I -> H; input_layernorm (H)
    mixer = H * (2 * INNER + 2 * N + HEADS) + (INNER + 2 * N) * 5 + 3 * HEADS + INNER + INNER * H
    layers = 6 * (mixer + H)
    # 2 blocks (num_mem_blocks), once each: attention over 2H (hidden and embeddings side by
    # side) with 4 heads of 2H / 4, q k v and o; the gated MLP (256); norms 2H and H
    two_h = 2 * H
    block = two_h * 3 * two_h + two_h * H + H * 2 * 256 + 256 * H + two_h + H
    # 3 hybrid layers, each: linear H -> H, the MLP adapter (A H -> 8, B 8 -> 2 x 256),
    # q, k and v adapters (A 2H -> 8, B 8 -> 2H)
    hybrid = H * H + (H * 8 + 8 * 512) + 3 * (two_h * 8 + 8 * two_h)
    embedding = 1024 * H  # tied: no lm_head of its own
    total = layers + 2 * block + 3 * hybrid + embedding + H  # + the final norm
    assert e.worst.weights_bytes == 2 * total
    groups = e.worst.weights_by_group.by_group()
    assert sum(groups["attention"].values()) == 2 * (
        2 * (two_h * 3 * two_h + two_h * H) + 3 * 3 * (two_h * 8 + 8 * two_h)
    )


def test_zamba2_kv_in_the_hybrid_layers_and_a_mamba2_state_in_every_layer():
    e = run(ZAMBA2)
    head_dim = 2 * H // 4  # attention_head_dim: 2 x hidden / heads
    attn_per_token = 4 * (head_dim + head_dim) * 2  # KV heads = heads, bf16
    assert e.kv_bytes_per_token == 3 * attn_per_token  # the 3 hybrid layers
    conv = (INNER + 2 * 1 * N) * (4 - 1) * 2  # (I + 2 G N) x (k - 1)
    ssm = HEADS * (INNER // HEADS) * N * 2  # heads x mamba_headdim x d_state
    assert e.state_bytes_per_sequence == 6 * (conv + ssm)
    align = accounting_for(DEFAULT_VLLM_VERSION).default_block_size  # 64 from vLLM 0.34
    assert e.block_size == align * cdiv(conv + ssm, align * attn_per_token)
    # 3 attention and 6 Mamba layers: groups of 3 (one attention group, two Mamba groups),
    # 3 Mamba-2 state blocks each (prefix caching's align mode + the prefill checkpoint)
    assert e.blocks_per_request == cdiv(8192, e.block_size) + 2 * 3
    tp2 = run(ZAMBA2, tensor_parallel_size=2)
    assert tp2.kv_bytes_per_token == 3 * attn_per_token // 2


def test_zamba2_asks_the_quantization_config_with_vllms_prefixes():
    """zamba2.py builds layer i with the prefix str(hybrid layers + i) (its mixer as
    ``<prefix>.mixer``) and the shared blocks with the model's (``model.qkv_proj``): a
    per-layer list in the checkpoint's names matches none of them, and vLLM leaves every
    linear in bf16."""
    mixed = {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "ignore": ["lm_head"],
        "quantized_layers": {
            "model.layers.0.mamba.in_proj": {"quant_algo": "FP8"},
            "model.layers.2.linear": {"quant_algo": "FP8"},
            "model.layers.2.shared_transformer.feed_forward.down_proj": {"quant_algo": "FP8"},
        },
    }
    plain = run(ZAMBA2)
    assert run({**ZAMBA2, "quantization_config": mixed}).worst.weights_bytes == (
        plain.worst.weights_bytes
    )
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    assert run({**ZAMBA2, "quantization_config": fp8}).worst.weights_bytes < (
        plain.worst.weights_bytes * 6 // 10
    )
