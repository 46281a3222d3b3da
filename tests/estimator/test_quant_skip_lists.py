"""Skip lists and per-module lists matched as vLLM matches them, per method, on vLLM's
module names (#26).

vLLM asks a quantization config about each module by its own model class's name for it
(``model.layers.0.self_attn.qkv_proj``, ``language_model.model.layers.0.mlp.gate_up_proj``,
``model.layers.0.mlp.experts``), after rewriting the config's lists with the class's
``hf_to_vllm_mapper`` (``model_loader/utils.py:configure_quant_config``), and each config
class matches in its own way (``quantization/utils/quant_utils.py:is_layer_skipped`` exact
for ``Fp8Config``, substring for AWQ; ``compressed_tensors/utils.py:should_ignore_layer``
exact or ``re:``; ModelOpt exact, substring and wildcard). Expected figures are written
from each method's ``create_weights`` (see test_quantization_weights.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.errors import ModelSpecError
from gatekeeper.estimator.weights import layer_bytes
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.quant_match import override, skipped
from gatekeeper.models.spec import ModelSpec

H, HEADS, KV, D, INTER, EXPERT, E = 1024, 16, 4, 64, 4096, 512, 4

QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": H,
    "intermediate_size": INTER,
    "moe_intermediate_size": EXPERT,
    "num_experts": E,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV,
    "head_dim": D,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
LLAMA: dict[str, Any] = {
    **QWEN3_MOE,
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
}
for key in ("moe_intermediate_size", "num_experts", "num_experts_per_tok"):
    del LLAMA[key]

ATTENTION = [(H, HEADS * D), (H, KV * D), (H, KV * D), (HEADS * D, H)]  # (in, out): q k v o
MLP = [(H, INTER), (H, INTER), (INTER, H)]  # gate, up, down
EXPERTS = [(H, EXPERT), (H, EXPERT), (EXPERT, H)]  # per expert


def fp8_block(i: int, o: int) -> int:
    """Fp8LinearMethod, weight_block_size [128, 128]: fp8 [o, i] + fp32 [o/128, i/128]."""
    return o * i + -(-o // 128) * -(-i // 128) * 4


def fp8_tensor(i: int, o: int) -> int:
    """Fp8LinearMethod per tensor, dynamic activations: fp8 [o, i] + fp32 weight_scale."""
    return o * i + 4


def bf16(i: int, o: int) -> int:
    return o * i * 2


def spec(config: dict[str, Any], quant: dict[str, Any] | None = None) -> ModelSpec:
    return spec_from_config({**config, "quantization_config": quant} if quant else config, name="t")


def layer(s: ModelSpec, i: int = 0) -> int:
    return layer_bytes(s, i, tp=1, dtype_bytes=2, quant=s.quantization)


NORMS = 2 * H * 2
QK_NORM = 2 * D * 2
ROUTER = E * H * 2
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def test_fp8_moe_ignoring_its_router_gate_keeps_every_expert_in_fp8():
    """The regression: Fp8Config matches ``gate`` exactly, so it names no module of
    vLLM's Qwen3-MoE (whose router ``model.layers.N.mlp.gate`` is a ``GateLinear`` built
    with the quantization config, qwen3_moe.py), least of all every expert's
    ``gate_proj``; the old substring reading kept the experts in bf16."""
    s = spec(QWEN3_MOE, {**FP8_BLOCK, "ignored_layers": ["gate"]})
    experts = E * sum(fp8_block(i, o) for i, o in EXPERTS)
    attention = sum(fp8_block(i, o) for i, o in ATTENTION)
    router = fp8_block(H, E)
    assert layer(s) == attention + experts + router + NORMS + QK_NORM
    bf16_experts = E * sum(bf16(i, o) for i, o in EXPERTS)
    assert layer(s) < attention + bf16_experts + router + NORMS + QK_NORM - 6_000_000
    named = spec(QWEN3_MOE, {**FP8_BLOCK, "ignored_layers": ["model.layers.0.mlp.gate"]})
    assert layer(named, 0) == layer(s, 0) - router + ROUTER  # the full name: bf16


def test_fp8_dense_mlp_is_not_skipped_by_a_router_name():
    s = spec(LLAMA, {**FP8_BLOCK, "ignored_layers": ["gate", "model.layers.0.mlp.gate"]})
    assert layer(s) == sum(fp8_block(i, o) for i, o in ATTENTION + MLP) + NORMS


def test_fp8_exact_names_of_every_shard_skip_the_fused_module():
    """Llama-3.1-405B-FP8 style: each shard of qkv_proj and gate_up_proj listed."""
    names = ["q_proj", "k_proj", "v_proj", "o_proj"]
    listed = [f"model.layers.0.self_attn.{n}" for n in names]
    listed += [f"model.layers.0.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    s = spec(LLAMA, {**FP8_BLOCK, "ignored_layers": listed})
    assert layer(s, 0) == sum(bf16(i, o) for i, o in ATTENTION + MLP) + NORMS
    assert layer(s, 1) == sum(fp8_block(i, o) for i, o in ATTENTION + MLP) + NORMS


def test_fbgemm_modules_to_not_convert_exact_names():
    listed = [f"model.layers.1.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    s = spec(LLAMA, {"quant_method": "fbgemm_fp8", "modules_to_not_convert": listed})
    row = sum(o * i + o * 4 for i, o in ATTENTION)  # fp8 [o, i] + fp32 per row
    assert layer(s, 1) == row + sum(bf16(i, o) for i, o in MLP) + NORMS
    assert layer(s, 0) == row + sum(o * i + o * 4 for i, o in MLP) + NORMS


def test_a_fused_module_listed_in_part_is_refused_as_vllm_refuses_it():
    s = spec(LLAMA, {**FP8_BLOCK, "ignored_layers": ["model.layers.0.self_attn.q_proj"]})
    with pytest.raises(ModelSpecError, match=r"model\.layers\.0\.self_attn\.qkv_proj"):
        layer(s)


def test_fp8_routed_experts_are_skipped_by_a_listed_expert_name():
    """``is_layer_skipped`` exact mode: ``model.layers.1.mlp.experts`` is skipped when a
    listed name containing ``experts`` contains it."""
    listed = [f"model.layers.1.mlp.experts.{e}.{p}" for e in range(E) for p in ("gate_proj",)]
    s = spec(QWEN3_MOE, {**FP8_BLOCK, "ignored_layers": listed})
    attention = sum(fp8_block(i, o) for i, o in ATTENTION) + fp8_block(H, E) + NORMS + QK_NORM
    assert layer(s, 1) == attention + E * sum(bf16(i, o) for i, o in EXPERTS)
    assert layer(s, 0) == attention + E * sum(fp8_block(i, o) for i, o in EXPERTS)


def awq(i: int, o: int) -> int:
    """AWQ 4-bit g128: int32 qweight [i, o/8], qzeros [i/128, o/8], bf16 scales [i/128, o]."""
    return i * o // 2 + i // 128 * o // 2 + i // 128 * o * 2


def test_awq_skips_by_substring():
    config = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    s = spec(LLAMA, {**config, "modules_to_not_convert": ["self_attn"]})
    assert (
        layer(s) == sum(bf16(i, o) for i, o in ATTENTION) + sum(awq(i, o) for i, o in MLP) + NORMS
    )
    gate = spec(LLAMA, {**config, "modules_to_not_convert": ["gate"]})  # gate_up_proj too
    assert (
        layer(gate) == sum(awq(i, o) for i, o in ATTENTION + MLP[2:]) + 2 * bf16(H, INTER) + NORMS
    )


CT_FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}


def ct_fp8(i: int, o: int) -> int:
    return o * i + o * 4  # W8A8 FP8 channel: fp8 [o, i] + fp32 [o, 1]


def ct(targets: list[str], ignore: list[str] | None = None) -> dict[str, Any]:
    return {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"targets": targets, "weights": CT_FP8_CHANNEL}},
        "ignore": ignore or [],
    }


def test_compressed_tensors_ignore_is_exact_or_regex_with_fused_shards():
    qkv = [f"model.layers.0.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]
    s = spec(LLAMA, ct(["Linear"], ["lm_head", *qkv]))
    assert (
        layer(s, 0)
        == sum(bf16(i, o) for i, o in ATTENTION[:3])
        + sum(ct_fp8(i, o) for i, o in ATTENTION[3:] + MLP)
        + NORMS
    )
    regex = spec(LLAMA, ct(["Linear"], ["re:.*mlp\\.down_proj$"]))
    assert (
        layer(regex, 1)
        == sum(ct_fp8(i, o) for i, o in ATTENTION + MLP[:2]) + bf16(INTER, H) + NORMS
    )
    substring = spec(LLAMA, ct(["Linear"], ["self_attn"]))  # neither a name nor a regex
    assert layer(substring) == sum(ct_fp8(i, o) for i, o in ATTENTION + MLP) + NORMS


def test_compressed_tensors_targets_name_fused_modules_through_their_shards():
    shards = [f"model.layers.1.mlp.{n}" for n in ("gate_proj", "up_proj")]
    s = spec(LLAMA, ct(shards))
    assert (
        layer(s, 1)
        == sum(bf16(i, o) for i, o in ATTENTION + MLP[2:])
        + sum(ct_fp8(i, o) for i, o in MLP[:2])
        + NORMS
    )
    assert layer(s, 0) == sum(bf16(i, o) for i, o in ATTENTION + MLP) + NORMS


def test_modelopt_exclude_is_exact_substring_or_wildcard():
    base = {"quant_method": "modelopt", "quant_algo": "FP8"}
    per_tensor = [o * i + 8 for i, o in ATTENTION + MLP]  # + weight_scale, input_scale
    s = spec(LLAMA, {**base, "ignore": ["lm_head", "gate"]})  # substring: gate_up_proj
    assert layer(s) == sum(per_tensor[:4]) + 2 * bf16(H, INTER) + per_tensor[6] + NORMS
    wild = spec(LLAMA, {**base, "ignore": ["lm_head", "model.layers.1.self_attn*"]})
    assert layer(wild, 1) == sum(bf16(i, o) for i, o in ATTENTION) + sum(per_tensor[4:]) + NORMS


def test_modelopt_mixed_finds_unpacked_fused_modules_through_their_usual_shards():
    # modelopt.py _resolve_quant_algo, step 4: qkv_proj / gate_up_proj of a class with no
    # packed_modules_mapping (StableLM, GPT-J) by the q/k/v and gate/up shards beside them
    keys = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"]
    assert override("modelopt", "model.layers.0.self_attn.qkv_proj", keys, {}) == keys[0]
    assert override("modelopt", "model.layers.0.mlp.gate_up_proj", keys, {}) == keys[1]
    assert override("modelopt", "model.layers.1.self_attn.qkv_proj", keys, {}) is None
    # a head vLLM builds with no prefix (EXAONE MoE) is "", which "lm_head" does not exclude
    assert not skipped("modelopt", "", ["lm_head"], {})
    assert skipped("modelopt", "lm_head", ["lm_head"], {})


def gptq(i: int, o: int, bits: int = 4) -> int:
    """GPTQ b-bit g128: int32 qweight [i*b/32, o], qzeros [i/128, o*b/32], bf16 scales."""
    return i * o * bits // 8 + i // 128 * o * bits // 8 + i // 128 * o * 2


def test_gptq_dynamic_rules_and_modules_in_block_to_quantize():
    config = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    dynamic = {"-:.*\\.1\\.self_attn.*": {}, "+:.*down_proj": {"bits": 8}}
    s = spec(LLAMA, {**config, "dynamic": dynamic})
    q4 = sum(gptq(i, o) for i, o in ATTENTION + MLP[:2])
    assert layer(s, 0) == q4 + gptq(INTER, H, 8) + NORMS
    attention_bf16 = sum(bf16(i, o) for i, o in ATTENTION)
    assert (
        layer(s, 1)
        == attention_bf16 + sum(gptq(i, o) for i, o in MLP[:2]) + gptq(INTER, H, 8) + NORMS
    )
    only_mlp = [["mlp.gate_proj", "mlp.up_proj"], ["mlp.down_proj"]]  # GPTQModel's nesting
    listed = spec(LLAMA, {**config, "modules_in_block_to_quantize": only_mlp})
    assert layer(listed) == attention_bf16 + sum(gptq(i, o) for i, o in MLP) + NORMS


# --- multimodal wrappers: names as the checkpoints spell them -------------------------

QWEN25_VL: dict[str, Any] = {
    **LLAMA,
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 1,
                      "out_hidden_size": H, "fullatt_block_indexes": [1]},
}  # fmt: skip
GEMMA3: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {**LLAMA, "model_type": "gemma3_text", "architectures": None,
                    "sliding_window": 512, "query_pre_attn_scalar": D},
    "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                      "num_attention_heads": 1, "image_size": 64, "patch_size": 16},
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "down_proj"),
    [
        # transformers >= 4.52 save multimodal checkpoints as model.language_model.layers.N
        (QWEN25_VL, "model.language_model.layers.0.mlp.down_proj"),
        (QWEN25_VL, "model.layers.0.mlp.down_proj"),  # earlier Qwen2.5-VL checkpoints
        (GEMMA3, "model.language_model.layers.0.mlp.down_proj"),
        (GEMMA3, "language_model.model.layers.0.mlp.down_proj"),  # earlier Gemma 3
    ],
    ids=["qwen2.5-vl-new", "qwen2.5-vl-old", "gemma3-new", "gemma3-old"],
)
def test_multimodal_per_layer_targets_are_mapped_to_vllms_names(config, down_proj):
    """A config_groups target naming the language model's layer 0 ``down_proj`` is
    quantized (it was sized bf16: the names were matched as the checkpoint spells them)."""
    s = spec(config, ct([down_proj]))
    plain = spec(config)
    delta = bf16(INTER, H) - ct_fp8(INTER, H)
    assert layer(plain, 0) - layer(s, 0) == delta
    assert layer(s, 1) == layer(plain, 1)


def test_gemma3_does_not_map_a_bare_model_prefix():
    """gemma3_mm.py's mapper has no ``model.`` rename (Qwen2.5-VL's has): vLLM leaves
    ``model.layers.0`` unmatched, so the layer stays bf16."""
    s = spec(GEMMA3, ct(["model.layers.0.mlp.down_proj"]))
    assert layer(s, 0) == layer(spec(GEMMA3), 0)


def test_multimodal_fp8_ignored_layers_and_ct_regexes_on_vllm_names():
    listed = [f"model.language_model.layers.1.mlp.{n}" for n in ("gate_proj", "up_proj")]
    s = spec(QWEN25_VL, {**FP8_BLOCK, "ignored_layers": listed})
    assert layer(spec(QWEN25_VL), 1) - layer(s, 1) == bf16(INTER, H) - fp8_block(INTER, H) + sum(
        bf16(i, o) - fp8_block(i, o) for i, o in ATTENTION
    )
    # a regex is matched, unmapped, against vLLM's own name (re.match from the start)
    vllm_name = spec(QWEN25_VL, ct(["re:language_model\\.model\\.layers\\.0\\.mlp\\.down_proj"]))
    hf_name = spec(QWEN25_VL, ct(["re:model\\.language_model\\.layers\\.0\\.mlp\\.down_proj"]))
    assert layer(vllm_name, 0) < layer(hf_name, 0) == layer(spec(QWEN25_VL), 0)
