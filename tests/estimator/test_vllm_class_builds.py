"""Weights where a vLLM 0.32 model class builds something other than its config suggests
(#36, the registry matrix's MiniCPM3, Laguna, gpt-oss GPTQ, EmbeddingGemma2, Gemma 4
unified and Kimi K2.5 rows), each on a tiny config against vLLM's code:

- MiniCPM3 (minicpm3.py ``MiniCPM3Attention``): MLA's projections around a plain
  ``Attention``, so no ``W_UK_T``/``W_UV`` copies of a quantized ``kv_b_proj``;
  ``q_a_proj`` and ``kv_a_proj_with_mqa`` apart, ``q_a_proj`` built with no prefix;
- Laguna (laguna.py): one rotary cache per layer type its layers have, each
  ``head_dim x`` that type's ``partial_rotary_factor`` wide;
- GPTQ experts Marlin cannot run (hidden not a multiple of 128: gpt-oss' 2880) fall back
  to ``MoeWNA16Method`` (auto_gptq.py ``get_quant_method``, moe_wna16.py);
- EmbeddingGemma2 (embedding_gemma2.py): per-layer inputs projected from the token
  embedding with no table of their own, and a rotary cache of ``min(positions,
  max_model_len)`` rows;
- Gemma 4 unified (gemma4_unified.py): the vision embedder and the modality embedders
  built even with every modality off;
- Kimi K2.5's language model, DeepSeek-V2 (deepseek_v2.py): a ``ParallelLMHead`` of its
  own whatever ``tie_word_embeddings`` says.

And what the classes do besides their weights (#36's leftovers):

- MiniCPM3's plain ``Attention(heads, qk_head_dim, num_kv_heads=heads)`` keeps K and V of
  every head (``FullAttentionSpec``), not MLA's latent entry, at the usual block size;
- EmbeddingGemma2's ``embedding_projection`` (hidden -> ``embedding_dim``) and its default
  ``--max-model-len`` capped at 8,192 (models/config.py ``EmbeddingGemma2ModelConfig``);
- classes without ``SupportsPP`` (Whisper, HRM-Text, Zamba2) refused under pipeline
  parallelism (config/model.py ``verify_with_parallel_config``);
- Zamba2's head tied whatever the config says (zamba2.py ``tie_weights``).

Each expected figure is computed by hand from the config and the vLLM file named."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.moe_backend import wna16_experts
from gatekeeper.estimator.rank_weights import (
    RankWeights,
    attention_bytes,
    decoder_layer_bytes,
    mla_copy_bytes,
    output_projection_part,
    per_layer_embedding_bytes,
    rope_cache_bytes,
)
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.module_names import (
    mla_attention,
    output_projection,
    rope_follows_max_model_len,
    served_length_cap,
    supports_pp,
    ties_always,
    ties_head,
)
from gatekeeper.models.quantization import quant_from_config
from gatekeeper.units import GIB
from gatekeeper.vllm.flags import options_from_mapping

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")
NVFP4: dict[str, Any] = {
    "quant_method": "modelopt",
    "quantization": {"quant_algo": "NVFP4", "group_size": 16},
}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
FP8_BLOCK = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def run(config: dict[str, Any], **flags: Any) -> Estimate:
    spec = spec_from_config(config, name="test")
    mapping = {"max_model_len": 1024, "kv_cache_memory_bytes": GIB, **flags}
    return estimate(spec, options_from_mapping(mapping, where="test")[0], H100)


def groups(e: Estimate) -> dict[str, int]:
    return {g: sum(f.values()) for g, f in e.worst.weights_by_group.by_group().items()}


# -- MiniCPM3 ---------------------------------------------------------------------------

H, Q_LORA, KV_LORA, ROPE, NOPE, V, HEADS = 256, 128, 64, 16, 32, 32, 4
MLA: dict[str, Any] = {
    "hidden_size": H,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "q_lora_rank": Q_LORA,
    "kv_lora_rank": KV_LORA,
    "qk_rope_head_dim": ROPE,
    "qk_nope_head_dim": NOPE,
    "v_head_dim": V,
    "vocab_size": 1000,
    "max_position_embeddings": 1024,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}
MINICPM3 = {**MLA, "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3"}
MOE = {"moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
       "n_shared_experts": 1, "first_k_dense_replace": 1}  # fmt: skip
DEEPSEEK_V2 = {
    **MLA,
    **MOE,
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
}


def test_minicpm3_runs_plain_attention_so_a_quantized_kv_b_proj_has_no_copies():
    assert mla_attention("MiniCPM3ForCausalLM") is False
    assert mla_attention("DeepseekV2ForCausalLM") is True
    for config, copies in ((MINICPM3, 0), (DEEPSEEK_V2, HEADS * KV_LORA * (NOPE + V) * 2)):
        spec = spec_from_config({**config, "quantization_config": FP8_BLOCK}, name="test")
        c = RankWeights.of(spec, 1, 2, spec.quantization)
        assert mla_copy_bytes(c, 0) == copies, config["architectures"]


def test_minicpm3_builds_its_a_projections_apart_and_q_a_proj_asks_with_no_name():
    # ModelOpt excludes layer 0's attention; vLLM's q_a_proj there asks as "" (built with
    # no prefix) and is quantized, the rest of the layer's attention stays bf16
    quant = {**NVFP4, "quantization": {**NVFP4["quantization"],
                                       "exclude_modules": ["model.layers.0.self_attn*"]}}  # fmt: skip
    spec = spec_from_config({**MINICPM3, "quantization_config": quant}, name="test")
    c = RankWeights.of(spec, 1, 2, spec.quantization)
    nvfp4 = quant_from_config(NVFP4)
    q_a = nvfp4.linear_bytes(H, Q_LORA, 2)
    kv_a = H * (KV_LORA + ROPE) * 2
    q_b = Q_LORA * HEADS * (NOPE + ROPE) * 2
    kv_b = KV_LORA * HEADS * (NOPE + V) * 2
    o = HEADS * V * H * 2
    norms = (Q_LORA + KV_LORA) * 2
    assert attention_bytes(c, 0) == q_a + kv_a + q_b + kv_b + o + norms


def test_minicpm3_caches_k_and_v_of_every_head_not_mlas_latent():
    # minicpm3.py: Attention(heads / tp, qk_nope + qk_rope, num_kv_heads=heads / tp), V
    # zero-padded to K's width: a FullAttentionSpec, as vLLM's get_kv_cache_spec says
    # (MiniCPM3-4B: 40 x 2 x 96 x 2 = 15,360 B a layer and token, not (256 + 32) x 2 = 576)
    e = run(MINICPM3)
    assert e.kv_bytes_per_token == 2 * HEADS * 2 * (NOPE + ROPE) * 2
    assert run(MINICPM3, tensor_parallel_size=2).kv_bytes_per_token == e.kv_bytes_per_token // 2
    # vLLM 0.32: FlashAttention's 16, not MLA's 64 (use_mla is False)
    assert run(MINICPM3, vllm_version="0.32.0").block_size == 16
    with pytest.raises(ServeOptionsError, match="fp8_ds_mla"):
        run(MINICPM3, kv_cache_dtype="fp8_ds_mla")
    # MLAAttention keeps its latent entry on every rank, at MLA's block size
    assert run(DEEPSEEK_V2, tensor_parallel_size=2).kv_bytes_per_token == 2 * (KV_LORA + ROPE) * 2
    assert run(DEEPSEEK_V2, vllm_version="0.32.0").block_size == 64


# -- Laguna -----------------------------------------------------------------------------

LAGUNA: dict[str, Any] = {
    "architectures": ["LagunaForCausalLM"],
    "model_type": "laguna",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "sliding_window": 512,
    "layer_types": ["full_attention", "full_attention"],
    "mlp_layer_types": ["dense", "dense"],
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": 1e4,
            "partial_rotary_factor": 1.0,
        },
    },
    "torch_dtype": "bfloat16",
}


def test_laguna_keeps_a_rotary_cache_per_layer_type_it_has_of_that_types_width():
    full = spec_from_config(LAGUNA, name="test")
    assert rope_cache_bytes(full, 2) == 4096 * 32 * 2  # full layers only: 64 x 0.5
    both = spec_from_config({**LAGUNA, "layer_types": ["sliding_attention", "full_attention"]},
                            name="test")  # fmt: skip
    assert rope_cache_bytes(both, 2) == 4096 * (64 + 32) * 2


# -- GPTQ experts Marlin cannot run -------------------------------------------------------


def test_gptq_experts_marlin_cannot_run_are_held_as_moe_wna16():
    gptq = quant_from_config(GPTQ)
    held = wna16_experts(gptq, 2880, 2880)  # gpt-oss: 2880 % 128 != 0
    assert (held.method, held.group_size, held.zero_bits) == ("moe_wna16", 64, 0)
    assert wna16_experts(gptq, 2048, 512) is gptq  # Marlin: AutoGPTQMoEMethod, as stored
    asymmetric = wna16_experts(quant_from_config({**GPTQ, "sym": False}), 2880, 2880)
    assert asymmetric.zero_bits == 4
    awq = quant_from_config({"quant_method": "awq", "bits": 4, "group_size": 128,
                             "zero_point": True})  # fmt: skip
    assert wna16_experts(awq, 2880, 2880).zero_bits == 4


def test_gpt_oss_gptq_experts_take_moe_wna16s_layout_without_biases():
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 192,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"],
        "torch_dtype": "bfloat16",
        "quantization_config": GPTQ,
    }
    # 192 % 128 != 0: MoE-WNA16, the group halved to 64; per expert w13 (384 x 192) and
    # w2 (192 x 192) in 4 bits, bf16 scales per 64 inputs, no zeros (sym), no biases
    per_expert = 384 * 192 // 2 + 384 * 3 * 2 + 192 * 192 // 2 + 192 * 3 * 2
    router = (192 * 4 + 4) * 2  # bf16 weight and bias
    assert groups(run(config))["experts"] == 2 * (4 * per_expert + router)


# -- EmbeddingGemma2 ----------------------------------------------------------------------

EMBEDDING_GEMMA2: dict[str, Any] = {
    "architectures": ["EmbeddingGemma2Model"],
    "model_type": "embedding_gemma2",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "embedding_gemma2_text",
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": 8192,
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
        "per_layer_config": {"01": {"head_dim": 64, "num_key_value_heads": 1}},
        "hidden_size_per_layer_input": 16,
        "embedding_dim": 48,
    },
}


def test_embedding_gemma2_rotary_cache_follows_max_model_len():
    assert rope_follows_max_model_len("EmbeddingGemma2Model")
    spec = spec_from_config(EMBEDDING_GEMMA2, name="test")
    assert rope_cache_bytes(spec, 2, 512) == 512 * (32 + 64) * 2  # a cache per layer type
    assert rope_cache_bytes(spec, 2) == 8192 * (32 + 64) * 2  # the length unknown
    short, long = run(EMBEDDING_GEMMA2, max_model_len=512), run(EMBEDDING_GEMMA2)
    assert long.worst.weights_bytes - short.worst.weights_bytes == 512 * (32 + 64) * 2


def test_embedding_gemma2_projects_per_layer_inputs_with_no_table():
    spec = spec_from_config(EMBEDDING_GEMMA2, name="test")
    assert (spec.per_layer_input_size, spec.per_layer_input_vocab) == (16, 0)
    c = RankWeights.of(spec, 1, 2, None)
    # ple.per_layer_model_projection (64 -> 2 layers x 16) and its norm (16)
    assert per_layer_embedding_bytes(c) == 64 * 32 * 2 + 16 * 2
    # each layer's ple_block (per_layer_input_gate 64 -> 16, per_layer_projection 16 -> 64)
    # and the model's ple projection, asked by vLLM's names: a config excluding them
    # keeps them bf16 where the rest is NVFP4
    quant = {**NVFP4, "quantization": {**NVFP4["quantization"], "exclude_modules": [
        "language_model.ple.per_layer_model_projection*", "language_model.layers.0.ple_block*"]}}  # fmt: skip
    quantized = spec_from_config({**EMBEDDING_GEMMA2, "quantization_config": quant}, name="t")
    q = RankWeights.of(quantized, 1, 2, quantized.quantization)
    assert per_layer_embedding_bytes(q) == 64 * 32 * 2 + 16 * 2
    nvfp4 = quant_from_config(NVFP4)
    ple_bf16 = 2 * 64 * 16 * 2
    ple_nvfp4 = nvfp4.linear_bytes(64, 16, 2) + nvfp4.linear_bytes(16, 64, 2)
    attention = attention_bytes(q, 0) - attention_bytes(q, 1)  # layer 1: head_dim 64
    assert decoder_layer_bytes(q, 0) - decoder_layer_bytes(q, 1) == (
        attention + ple_bf16 - ple_nvfp4
    )


def test_embedding_gemma2_projects_its_output_to_embedding_dim():
    assert output_projection("EmbeddingGemma2Model") == "language_model.embedding_projection"
    spec = spec_from_config(EMBEDDING_GEMMA2, name="test")
    assert spec.output_projection == 48
    assert output_projection_part(RankWeights.of(spec, 2, 2, None)) == ("other", "", 64 * 48 * 2)
    # a ReplicatedLinear built with the quantization config: quantized like the rest
    quantized = spec_from_config({**EMBEDDING_GEMMA2, "quantization_config": GPTQ}, name="t")
    c = RankWeights.of(quantized, 1, 2, quantized.quantization)
    gptq = quant_from_config(GPTQ).linear_bytes(64, 48, 2)
    assert output_projection_part(c) == ("other", "gptq", gptq)
    plain = {**EMBEDDING_GEMMA2, "architectures": ["Gemma4ForCausalLM"]}
    assert spec_from_config(plain, name="t").output_projection == 0


def test_embedding_gemma2_serves_at_most_8192_tokens_unless_told():
    assert served_length_cap("EmbeddingGemma2Model") == 8192
    assert served_length_cap("LlamaForCausalLM") is None
    text = {**EMBEDDING_GEMMA2["text_config"], "max_position_embeddings": 32768}
    spec = spec_from_config({**EMBEDDING_GEMMA2, "text_config": text}, name="test")
    assert (spec.default_max_model_len, spec.max_position_embeddings) == (8192, 32768)
    options = options_from_mapping({"kv_cache_memory_bytes": GIB}, where="test")[0]
    assert estimate(spec, options, H100).max_model_len == 8192
    longer = run({**EMBEDDING_GEMMA2, "text_config": text}, max_model_len=16384)
    assert longer.max_model_len == 16384
    assert spec_from_config(EMBEDDING_GEMMA2, name="t").default_max_model_len == 8192


# -- Gemma 4 unified -----------------------------------------------------------------------

PIXELS, E, POSITIONS, TEXT_H, AUDIO = 3 * 8 * 8, 32, 10, 64, 16
GEMMA4_UNIFIED: dict[str, Any] = {
    "architectures": ["Gemma4UnifiedForConditionalGeneration"],
    "model_type": "gemma4_unified",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "text_config": {
        "model_type": "gemma4_unified_text",
        "vocab_size": 1000,
        "hidden_size": TEXT_H,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1e6,
            },
        },
    },
    "vision_config": {
        "model_type": "gemma4_unified_vision",
        "patch_size": 4,
        "pooling_kernel_size": 2,  # model patches of 8 x 8 pixels
        "mm_embed_dim": E,
        "mm_posemb_size": POSITIONS,
        "output_proj_dims": E,
    },
    "audio_config": {"model_type": "gemma4_unified_audio", "audio_embed_dim": AUDIO},
}
NO_MEDIA = {"limit_mm_per_prompt": {"image": 0, "video": 0, "audio": 0}}


def test_gemma4_unified_holds_its_vision_embedder_with_every_modality_off():
    # patch_ln1, patch_ln2, pos_norm (weight and bias); patch_dense with its bias; the
    # position table; embed_vision (E -> text) and embed_audio (AUDIO -> text)
    rest = 2 * PIXELS + 4 * E + E + POSITIONS * 2 * E + (E + AUDIO) * TEXT_H
    assert groups(run(GEMMA4_UNIFIED, **NO_MEDIA))["vision"] == (rest + PIXELS * E) * 2
    # patch_dense alone asks the quantization config
    gptq = run({**GEMMA4_UNIFIED, "quantization_config": GPTQ}, **NO_MEDIA)
    dense = quant_from_config(GPTQ).linear_bytes(PIXELS, E, 2)
    assert groups(gptq)["vision"] == rest * 2 + dense


# -- heads DeepSeek-V2 never ties ---------------------------------------------------------


def test_a_class_that_builds_its_own_head_is_untied_whatever_the_config_says():
    assert ties_head("DeepseekV2ForCausalLM") is False
    assert ties_head("KimiK25ForConditionalGeneration") is False
    assert ties_head("LlamaForCausalLM") is True
    assert ties_head("DotsOCRForCausalLM") is True  # no probe of its own: its Qwen2's
    assert not spec_from_config(DEEPSEEK_V2, name="test").tie_word_embeddings
    plain = {k: v for k, v in MLA.items() if not k.endswith(("_rank", "_head_dim"))}
    llama = {**plain, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    assert spec_from_config(llama, name="test").tie_word_embeddings
    kimi = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "tie_word_embeddings": True,  # vLLM copies it into the text config
        "torch_dtype": "bfloat16",
        "text_config": {**MLA, **MOE, "model_type": "deepseek_v3", "tie_word_embeddings": False},
    }
    e = run(kimi, **NO_MEDIA)
    assert groups(e)["lm_head"] == 1024 * H * 2  # the vocabulary padded to 64 rows


def test_zamba2_ties_its_head_whatever_the_config_says():
    assert ties_always("Zamba2ForCausalLM") and ties_always("WhisperForConditionalGeneration")
    assert not ties_always("LlamaForCausalLM") and not ties_always("DeepseekV2ForCausalLM")
    zamba2 = {
        "architectures": ["Zamba2ForCausalLM"],
        "model_type": "zamba2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "layers_block_type": ["mamba", "hybrid"],
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "n_mamba_heads": 4,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    assert spec_from_config(zamba2, name="test").tie_word_embeddings
    untied, tied = run(zamba2), run({**zamba2, "tie_word_embeddings": True})
    assert "lm_head" not in groups(untied)
    assert untied.worst.weights_bytes == tied.worst.weights_bytes


# -- pipeline parallelism a class does not support -----------------------------------------


@pytest.mark.parametrize(
    "arch", ["WhisperForConditionalGeneration", "HrmTextForCausalLM", "Zamba2ForCausalLM"]
)
def test_a_class_without_supports_pp_is_refused_under_pipeline_parallelism(arch: str):
    assert supports_pp(arch) is False
    plain = {k: v for k, v in MLA.items() if not k.endswith(("_rank", "_head_dim"))}
    # the refusal is the class's, whatever the config: a plain decoder config named as it
    config = {**plain, "architectures": [arch], "model_type": "llama"}
    with pytest.raises(ServeOptionsError, match=f"{arch}.*tensor parallelism") as refused:
        run(config, pipeline_parallel_size=2)
    assert refused.value.field == "pipeline_parallel_size"
    run(config, tensor_parallel_size=2)  # TP stays open


def test_a_class_with_supports_pp_runs_under_pipeline_parallelism():
    assert supports_pp("LlamaForCausalLM") and supports_pp("MiniCPM3ForCausalLM")
    assert supports_pp("NoSuchForCausalLM") is None  # not in the table: not refused
    plain = {k: v for k, v in MLA.items() if not k.endswith(("_rank", "_head_dim"))}
    for arch in ("LlamaForCausalLM", "NoSuchForCausalLM"):
        run({**plain, "architectures": [arch], "model_type": "llama"}, pipeline_parallel_size=2)
