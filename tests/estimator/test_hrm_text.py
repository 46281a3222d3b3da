"""HRM-Text as vLLM 0.32's ``hrm_text.py`` builds it: two stacks of
``num_layers_per_stack`` layers (``model.L_module``, ``model.H_module``), weightless norms,
a gated MHA (``gqkv_proj``: gate, q, k, v); and one KV cache per recurrence step a layer
runs at: ``H_cycles x L_cycles`` for a low-stack layer, ``H_cycles`` for a high-stack one.

Each expected figure is computed by hand from the config and ``hrm_text.py``."""

from __future__ import annotations

from typing import Any

from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.estimator.weights import layer_bytes
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.quantization import quant_from_config
from gatekeeper.units import GIB
from gatekeeper.vllm.flags import options_from_mapping

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")

H, HEADS, HEAD_DIM, INTER = 64, 4, 16, 128
HRM: dict[str, Any] = {
    "architectures": ["HrmTextForCausalLM"],
    "model_type": "hrm_text",
    "hidden_size": H,
    "num_hidden_layers": 2,  # no num_layers_per_stack: the per-stack count (transformers)
    "num_attention_heads": HEADS,
    "num_key_value_heads": 2,  # hrm_text.py: MHA whatever this says
    "head_dim": HEAD_DIM,
    "intermediate_size": INTER,
    "H_cycles": 2,
    "L_cycles": 3,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
LAYER = H * 4 * HEADS * HEAD_DIM + HEADS * HEAD_DIM * H + H * 2 * INTER + INTER * H


def run(config: dict[str, Any], **flags: Any) -> Estimate:
    spec = spec_from_config(config, name="hrm")
    options = options_from_mapping(
        {"max_model_len": 2048, "kv_cache_memory_bytes": 4 * GIB, **flags}, where="test"
    )[0]
    return estimate(spec, options, H100)


def test_hrm_text_builds_two_stacks_of_weightless_norm_layers():
    spec = spec_from_config(HRM, name="hrm")
    assert spec.num_layers == 4  # L_module and H_module, 2 layers each
    # gqkv_proj H -> 4 x heads x head_dim, o_proj, the gated MLP; no norm weights
    assert layer_bytes(spec, 0, tp=1, dtype_bytes=2, quant=None) == 2 * LAYER
    e = run(HRM)
    embedding = 1024 * H  # 1000 rows padded to 64; lm_head untied, the same
    rope = 2048 * HEAD_DIM  # one rotary cache: positions x head_dim
    z_l_init = H  # (the size of the final norm counted for every model; HRM has none)
    assert e.worst.weights_bytes == 2 * (4 * LAYER + 2 * embedding + rope + z_l_init)


def test_hrm_text_keeps_a_kv_cache_per_recurrence_step():
    e = run(HRM)
    page = HEADS * 2 * HEAD_DIM * 2  # MHA: 4 KV heads, K and V, bf16
    # low stack: 2 layers x (2 x 3) steps; high stack: 2 layers x 2 steps
    assert e.kv_bytes_per_token == (2 * 6 + 2 * 2) * page
    # a config written by transformers: num_hidden_layers is the steps' layer count
    written = {**HRM, "num_hidden_layers": 2 * 2 * (3 + 1), "num_layers_per_stack": 2}
    assert run(written).kv_bytes_per_token == e.kv_bytes_per_token
    assert run(written).worst.weights_bytes == e.worst.weights_bytes


def test_hrm_text_names_the_high_stack_as_vllm_asks_for_it():
    """vLLM asks the quantization config with model.L_module.layers.N and
    model.H_module.layers.N (the names table's stacks) and the attention's gqkv_proj."""
    spec = spec_from_config(HRM, name="hrm")

    def modelopt_fp8(*ignore: str) -> Any:
        return quant_from_config(
            {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head", *ignore]}
        )

    everything = modelopt_fp8()
    quantized = layer_bytes(spec, 0, tp=1, dtype_bytes=2, quant=everything)
    assert quantized < LAYER + 100  # fp8: a byte an element, and the scales
    assert layer_bytes(spec, 3, tp=1, dtype_bytes=2, quant=everything) == quantized
    low_only = modelopt_fp8("model.H_module*")
    sizes = [layer_bytes(spec, i, tp=1, dtype_bytes=2, quant=low_only) for i in range(4)]
    assert sizes == [quantized, quantized, 2 * LAYER, 2 * LAYER]
    # the attention's input is gqkv_proj (H -> gate, q, k, v)
    no_gqkv = modelopt_fp8("*gqkv_proj")
    gqkv = H * 4 * HEADS * HEAD_DIM
    assert layer_bytes(spec, 0, tp=1, dtype_bytes=2, quant=no_gqkv) > quantized + gqkv - 100
