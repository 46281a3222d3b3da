"""Weight bytes of every quantization vLLM loads, against hand computations.

Each expected figure is written out from the tensors the vLLM method's ``create_weights``
registers (the file is named next to it, under vLLM 0.32's
``model_executor/layers/quantization/``; bitsandbytes from vLLM 0.21's
``bitsandbytes.py`` and ``model_loader/bitsandbytes_loader.py``), not from gatekeeper.

The model is a tiny Llama (hidden 1024, 16 heads of 64, 4 KV heads, MLP 4096, vocab
32000, untied) and its Mixtral twin (4 experts of 2048). Per decoder layer, TP=1, the
projections ``[out, in]`` are q 1024x1024, k and v 256x1024, o 1024x1024, gate and up
4096x1024, down 1024x4096; two RMSNorm weights (2 x 1024 x 2 B = 4096 B) stay bf16.
The bf16 layer: (2 x 1,048,576 + 2 x 262,144 + 3 x 4,194,304) x 2 B + 4096 = 30,412,800 B.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gatekeeper.errors import ModelSpecError
from gatekeeper.estimator.weights import layer_bytes, lm_head_bytes, weight_plan
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.quantization import quant_from_config, quant_from_flag
from gatekeeper.models.spec import CheckpointTensor, CheckpointWeights, ModelSpec

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
MIXTRAL = {
    **LLAMA,
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "intermediate_size": 2048,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
BF16_LAYER = 30_412_800
NORMS = 4096
LM_HEAD_BF16 = 32000 * 1024 * 2  # ParallelLMHead, vocab 32000 (a multiple of 64) x 1024
# (numel of each projection: q, k, v, o, gate, up, down)
PROJECTIONS = [(1024, 1024), (1024, 256), (1024, 256), (1024, 1024)] + [(1024, 4096)] * 2
PROJECTIONS += [(4096, 1024)]


def spec(config: dict[str, Any], quant: dict[str, Any] | None = None) -> ModelSpec:
    full = {**config, "quantization_config": quant} if quant else config
    return spec_from_config(full, name="tiny")


def layer(s: ModelSpec, i: int = 0, quant: Any = None) -> int:
    return layer_bytes(s, i, tp=1, dtype_bytes=2, quant=quant or s.quantization)


NVFP4_CONFIG = {  # a ModelOpt NVFP4 config.json (nvidia/*-FP4 layout)
    "config_groups": {
        "group_0": {
            "input_activations": {
                "dynamic": False,
                "num_bits": 4,
                "type": "float",
                "group_size": 16,
            },
            "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16},
            "targets": ["Linear"],
        }
    },
    "ignore": ["lm_head"],
    "quant_algo": "NVFP4",
    "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
    "producer": {"name": "modelopt", "version": "0.29.0"},
    "quant_method": "modelopt",
}


def nvfp4(i: int, o: int) -> int:
    # KNvfp4Static: weight uint8 [o, i/2]; weight_scale fp8 [o, i/16]; weight_scale_2 fp32 [1]
    # KNvfp4Dynamic: input_scale fp32 [1]
    return o * i // 2 + o * i // 16 + 4 + 4


def test_modelopt_nvfp4_config_json_sizes_linears_at_4_5_bits_and_keeps_lm_head_bf16():
    s = spec(LLAMA, NVFP4_CONFIG)
    # q 589,832 + k 147,464 + v 147,464 + o 589,832 + gate, up, down 2,359,304 each + norms
    assert sum(nvfp4(i, o) for i, o in PROJECTIONS) == 589_832 * 2 + 147_464 * 2 + 2_359_304 * 3
    assert layer(s) == 8_552_504 + NORMS == 8_556_600
    assert lm_head_bytes(s, tp=1, dtype_bytes=2, quant=s.quantization) == LM_HEAD_BF16


def test_modelopt_hf_quant_config_json_with_exclude_modules_wildcards():
    hf_quant = {
        "producer": {"name": "modelopt", "version": "0.23.0"},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.layers.1.mlp*"],
        },
    }
    q = quant_from_config(hf_quant)
    s = spec(LLAMA)
    assert layer(s, 0, q) == 8_556_600
    # layer 1: attention NVFP4, the MLP ("model.layers.1.mlp*") bf16: 3 x 4,194,304 x 2 B
    attention = 589_832 * 2 + 147_464 * 2
    assert layer(s, 1, q) == attention + 3 * 4_194_304 * 2 + NORMS == 26_644_512


@pytest.mark.parametrize(
    ("algo", "per_projection"),
    [
        # KFp8StaticTensor: weight fp8 [o, i], weight_scale fp32 [1], input_scale fp32 [1]
        ("FP8", lambda i, o: o * i + 4 + 4),
        # KFp8StaticChannel: weight fp8 [o, i], weight_scale fp32 [o]
        ("FP8_PER_CHANNEL_PER_TOKEN", lambda i, o: o * i + o * 4),
        # KFp8Block128: weight fp8 [o, i], weight_scale fp32 [ceil(o/128), 1, i/128, 1]
        ("FP8_PB_WO", lambda i, o: o * i + -(-o // 128) * (i // 128) * 4),
        # KMxfp8Static: weight fp8 [o, i], weight_scale uint8 (e8m0) [o, i/32]
        ("MXFP8", lambda i, o: o * i + o * i // 32),
    ],
)
def test_modelopt_fp8_and_mxfp8(algo, per_projection):
    s = spec(LLAMA, {"quant_method": "modelopt", "quant_algo": algo, "ignore": ["lm_head"]})
    assert layer(s) == sum(per_projection(i, o) for i, o in PROJECTIONS) + NORMS


def test_modelopt_fp8_figures_written_out():
    s = spec(LLAMA, {"quant_method": "modelopt", "quant_algo": "FP8"})
    # 15,204,352 fp8 bytes + 7 projections x 8 B of per-tensor scales + norms
    assert layer(s) == 15_204_352 + 56 + NORMS == 15_208_504
    mx = spec(LLAMA, {"quant_method": "modelopt", "quant_algo": "MXFP8"})
    assert layer(mx) == 15_204_352 + 15_204_352 // 32 + NORMS == 15_683_584


def test_modelopt_unknown_algo_is_a_clear_error_not_a_crash():
    with pytest.raises(ValueError, match="quant_algo 'INT3' is not supported"):
        quant_from_config({"quant_method": "modelopt", "quant_algo": "INT3"})


BNB_4BIT = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "llm_int8_skip_modules": None,
}


def bnb4(i: int, o: int) -> int:
    # uint8 [i*o/2, 1] (quant_ratio 2 for bf16) + fp32 absmax per 64 (double quant undone
    # by _dequantize_dq) + the 16-entry fp32 code
    return i * o // 2 + i * o // 64 * 4 + 64


def test_bitsandbytes_4bit_with_and_without_double_quant():
    s = spec(LLAMA, BNB_4BIT)
    # 15,204,352 weights: 7,602,176 B packed + 950,272 B absmax + 7 x 64 B codes + norms
    assert layer(s) == 7_602_176 + 950_272 + 448 + NORMS == 8_556_992
    single = spec(LLAMA, {**BNB_4BIT, "bnb_4bit_use_double_quant": False})
    assert layer(single) == layer(s)
    # VocabParallelEmbedding and ParallelLMHead are not LinearBase: bf16
    assert lm_head_bytes(s, tp=1, dtype_bytes=2, quant=s.quantization) == LM_HEAD_BF16


def test_bitsandbytes_8bit_and_skip_modules():
    s = spec(LLAMA, {"quant_method": "bitsandbytes", "load_in_8bit": True})
    # Int8Params int8 [o, i] + SCB fp32 per output row: rows 1024+256+256+1024+4096x2+1024
    assert layer(s) == 15_204_352 + (1024 * 3 + 512 + 8192) * 4 + NORMS == 15_255_552
    skipped = spec(LLAMA, {**BNB_4BIT, "llm_int8_skip_modules": ["mlp"]})
    assert layer(skipped) == sum(bnb4(i, o) for i, o in PROJECTIONS[:4]) + 3 * 4_194_304 * 2 + NORMS


def test_bitsandbytes_in_flight_is_4bit_nf4():
    q = quant_from_flag("bitsandbytes", None)
    assert q is not None and q.source == "runtime"
    assert layer(spec(LLAMA), 0, q) == 8_556_992


def bnb_tensors(prefix: str, i: int, o: int) -> list[CheckpointTensor]:
    """A pre-quantized (double-quant nf4) projection as transformers saves it."""
    n = i * o
    w = f"{prefix}.weight"
    return [
        CheckpointTensor(w, "U8", (n // 2, 1), n // 2),
        CheckpointTensor(f"{w}.absmax", "U8", (n // 64,), n // 64),
        CheckpointTensor(f"{w}.nested_absmax", "F32", (n // 64 // 256,), n // 64 // 256 * 4),
        CheckpointTensor(f"{w}.nested_quant_map", "F32", (256,), 1024),
        CheckpointTensor(f"{w}.quant_map", "F32", (16,), 64),
        CheckpointTensor(f"{w}.quant_state.bitsandbytes__nf4", "U8", (100,), 100),
    ]


def test_bitsandbytes_pre_quantized_checkpoint_keeps_embeddings_16bit():
    s = spec(LLAMA, BNB_4BIT)
    names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
    names += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    tensors = [
        CheckpointTensor("model.embed_tokens.weight", "BF16", (32000, 1024), LM_HEAD_BF16),
        CheckpointTensor("lm_head.weight", "BF16", (32000, 1024), LM_HEAD_BF16),
        CheckpointTensor("model.norm.weight", "BF16", (1024,), 2048),
    ]
    for k in range(2):
        tensors += [
            CheckpointTensor(f"model.layers.{k}.input_layernorm.weight", "BF16", (1024,), 2048)
        ]
        tensors += [
            CheckpointTensor(
                f"model.layers.{k}.post_attention_layernorm.weight", "BF16", (1024,), 2048
            )
        ]
        for name, (i, o) in zip(names, PROJECTIONS, strict=True):
            tensors += bnb_tensors(f"model.layers.{k}.{name}", i, o)
    ckpt = CheckpointWeights(
        sum(t.num_bytes for t in tensors), tuple(tensors), "safetensors headers"
    )
    s = dataclasses.replace(s, checkpoint=ckpt)
    plan = weight_plan(s, tp=1, pp=1, dtype_bytes=2, quant=s.quantization)
    rope = 4096 * 64 * 2  # cos/sin cache, positions x rotary_dim x bf16
    # embed + lm_head bf16, final norm, two layers as in the architecture's 4-bit figure
    assert plan.max_bytes == 2 * LM_HEAD_BF16 + 2048 + 2 * 8_556_992 + rope == 148_712_320
    arch = dataclasses.replace(s, checkpoint=None)
    assert (
        weight_plan(arch, tp=1, pp=1, dtype_bytes=2, quant=s.quantization).max_bytes
        == plan.max_bytes
    )


INT4_EXPERTS_FP8_DENSE = {
    "quant_method": "compressed-tensors",
    "format": "mixed-precision",
    "config_groups": {
        "group_0": {  # listed first: the old reader sized everything with it
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "dynamic": True,
            },
        },
        "group_1": {  # vLLM's Mixtral: block_sparse_moe.experts.N.w1/w3/w2, as on the hub
            "targets": ["re:.*block_sparse_moe\\.experts\\..*"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "strategy": "group",
                "group_size": 128,
                "symmetric": True,
            },
        },
    },
    "ignore": ["lm_head", "re:.*block_sparse_moe\\.gate$"],
}


def test_compressed_tensors_int4_experts_and_fp8_dense_layers():
    s = spec(MIXTRAL, INT4_EXPERTS_FP8_DENSE)
    # attention, W8A8 FP8 channel (compressed_tensors_w8a8_fp8.py): fp8 [o, i] + fp32 [o, 1]
    attention = (1024 * 1024 + 1024 * 4) * 2 + (256 * 1024 + 256 * 4) * 2
    # experts, WNA16 (compressed_tensors_moe_wna16.py): int32 [E, 2I, H/8] + bf16 [E, 2I, H/128]
    # + int32 [E, H, I/8] + bf16 [E, H, I/128] (+ weight_shape int64[2] per projection)
    gate_up = 2048 * 1024 // 2 + 2048 * (1024 // 128) * 2 + 16
    down = 1024 * 2048 // 2 + 1024 * (2048 // 128) * 2 + 16
    experts = 4 * (2 * gate_up + down)
    router = 4 * 1024 * 2  # mlp.gate ignored: bf16
    assert layer(s) == attention + experts + router + NORMS == 15_620_288
    # the old reading (every module FP8) was 1.7x: 4 experts x 3 x 2,097,152 x 1 B + scales
    fp8_experts = 4 * (2 * (2048 * 1024 + 2048 * 4) + 1024 * 2048 + 1024 * 4)
    assert (attention + fp8_experts + router + NORMS) / layer(s) > 1.7


@pytest.mark.parametrize(
    ("weights", "acts", "per_projection"),
    [
        # W4A16 group 128 asym: int32 [o, i/8], bf16 scales [o, i/128], int32 zeros [o/8, i/128]
        (
            {
                "num_bits": 4,
                "type": "int",
                "strategy": "group",
                "group_size": 128,
                "symmetric": False,
            },
            None,
            lambda i, o: o * i // 2 + o * (i // 128) * 2 + o // 8 * (i // 128) * 4 + 16,
        ),
        # W8A8 int8 channel, static per-tensor input: int8 [o, i], fp32 [o, 1], fp32 [1]
        (
            {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
            {
                "num_bits": 8,
                "type": "int",
                "strategy": "tensor",
                "dynamic": False,
                "symmetric": True,
            },
            lambda i, o: o * i + o * 4 + 4,
        ),
        # FP8 block 128x128: fp8 [o, i], fp32 [ceil(o/128), ceil(i/128)]
        (
            {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
            {
                "num_bits": 8,
                "type": "float",
                "strategy": "group",
                "group_size": 128,
                "dynamic": True,
            },
            lambda i, o: o * i + -(-o // 128) * -(-i // 128) * 4,
        ),
        # NVFP4 (w4a4_nvfp4): uint8 [o, i/2], fp8 [o, i/16], global scales fp32 [1] x 2
        (
            {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            {
                "num_bits": 4,
                "type": "float",
                "strategy": "tensor_group",
                "group_size": 16,
                "dynamic": "local",
            },
            lambda i, o: o * i // 2 + o * i // 16 + 8,
        ),
    ],
)
def test_compressed_tensors_schemes(weights, acts, per_projection):
    group: dict[str, Any] = {"targets": ["Linear"], "weights": weights}
    if acts:
        group["input_activations"] = acts
    s = spec(
        LLAMA,
        {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": group},
            "ignore": ["lm_head"],
        },
    )
    assert layer(s) == sum(per_projection(i, o) for i, o in PROJECTIONS) + NORMS
    assert lm_head_bytes(s, tp=1, dtype_bytes=2, quant=s.quantization) == LM_HEAD_BF16


def test_compressed_tensors_lm_head_targeted_by_name_is_quantized():
    group = {
        "targets": ["Linear", "lm_head"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
    }
    s = spec(LLAMA, {"quant_method": "compressed-tensors", "config_groups": {"g": group}})
    # ParallelLMHead gets the scheme when a target names it: fp8 [32000, 1024] + fp32 [32000]
    assert lm_head_bytes(s, tp=1, dtype_bytes=2, quant=s.quantization) == 32000 * 1024 + 32000 * 4


def test_compressed_tensors_without_a_linear_target_leaves_other_linears_bf16():
    group = {
        "targets": ["re:.*mlp\\.(gate|up|down)_proj$"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
    }
    s = spec(LLAMA, {"quant_method": "compressed-tensors", "config_groups": {"g": group}})
    attention = (1024 * 1024 * 2 + 256 * 1024 * 2) * 2
    assert layer(s) == attention + 3 * (4_194_304 + 4) + NORMS


def test_experts_int8_quantizes_experts_only():
    q = quant_from_flag("experts_int8", None)
    s = spec(MIXTRAL)
    # Int8OnlineMoEMethod: w13 int8 [E, 2I, H] + fp32 [E, 2I]; w2 int8 [E, H, I] + fp32 [E, H]
    experts = 4 * (2 * 2048 * 1024 + 2048 * 2 * 4 + 1024 * 2048 + 1024 * 4)
    attention = (1024 * 1024 * 2 + 256 * 1024 * 2) * 2  # LinearBase: UnquantizedLinearMethod
    assert layer(s, 0, q) == attention + experts + 4 * 1024 * 2 + NORMS == 30_502_912


def test_moe_wna16_experts_and_gptq_linears():
    config = {
        "quant_method": "moe_wna16",
        "linear_quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "sym": True,
    }
    s = spec(MIXTRAL, config)
    # linears as GPTQ 4-bit g128: int32 [i/8, o] + int32 zeros [i/128, o/8] + bf16 scales [i/128, o]
    gptq = sum(o * i // 2 + (i // 128) * o // 2 + (i // 128) * o * 2 for i, o in PROJECTIONS[:4])
    # MoeWNA16Method: uint8 [E, 2I, H/2] + bf16 scales [E, 2I, H/128]; [E, H, I/2] + [E, H, I/128]
    experts = 4 * (2048 * 2 * 1024 // 2 + 2048 * 2 * 8 * 2 + 1024 * 2048 // 2 + 1024 * 16 * 2)
    assert layer(s) == gptq + experts + 4 * 1024 * 2 + NORMS


QUARK_FP8 = {
    "quant_method": "quark",
    "export": {"kv_cache_group": [], "pack_method": "reorder"},
    "global_quant_config": {
        "weight": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False},
        "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False},
    },
    "layer_quant_config": {},
}


@pytest.mark.parametrize(
    "exclude",
    [
        ["lm_head", "re:.*mlp\\.down_proj$"],
        ["lm_head", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"],
    ],
)
def test_quark_fp8_per_tensor_with_exclude(exclude):
    s = spec(LLAMA, {**QUARK_FP8, "exclude": exclude})
    # quark_w8a8_fp8.py: fp8 [o, i] + weight_scale fp32 [1] + input_scale fp32 [1]
    quantized = sum(o * i + 8 for i, o in PROJECTIONS[:6])
    assert layer(s) == quantized + 4096 * 1024 * 2 + NORMS


def test_quark_exclude_is_exact_or_regex_not_a_wildcard():
    # quark/utils.py:should_ignore_layer matches a name or a re: regex; "*.mlp.down_proj"
    # names no module, so vLLM quantizes down_proj too
    s = spec(LLAMA, {**QUARK_FP8, "exclude": ["lm_head", "*.mlp.down_proj"]})
    assert layer(s) == sum(o * i + 8 for i, o in PROJECTIONS) + NORMS


def test_mxfp4_quantizes_only_experts_and_pads_them_to_256():
    s = spec({**MIXTRAL, "intermediate_size": 2000}, {"quant_method": "mxfp4"})
    # Mxfp4MoEMethod: intermediate rounded up to 2048; uint8 [E, 2I, H/2] + uint8 [E, 2I, H/32]
    experts = 4 * (
        2 * (2048 * 1024 // 2 + 2048 * 1024 // 32) + 1024 * 2048 // 2 + 1024 * 2048 // 32
    )
    attention = (1024 * 1024 * 2 + 256 * 1024 * 2) * 2
    assert layer(s) == attention + experts + 4 * 1024 * 2 + NORMS


def test_a_modelopt_directory_is_read_with_its_hf_quant_config_json(tmp_path):
    import json

    from gatekeeper.models.source import load_model_dir

    hf_quant = {
        "producer": {"name": "modelopt", "version": "0.23.0"},
        "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]},
    }
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    s = load_model_dir(tmp_path)
    assert s.quantization is not None
    assert layer(s, 0, s.quantization) == 8_556_600  # as from the config's own section
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    with pytest.raises(ModelSpecError, match=r"hf_quant_config\.json"):
        load_model_dir(tmp_path)


def test_gptq_act_order_is_sized_but_refused_by_vllm_0_32():
    """vLLM 0.32 refuses a GPTQ checkpoint with ``desc_act: true`` and a group size
    (``gptq_utils.normalize_and_validate_gptq_desc_act``; the conformance check records
    its error); earlier releases load it with an int32 ``g_idx`` per input."""
    from gatekeeper.estimator import GpuTarget, ServeOptions, estimate

    config = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}
    s = spec(LLAMA, config)
    gpu = GpuTarget(total_bytes=80 * 2**30)
    refused = estimate(s, ServeOptions(vllm_version="0.32.0"), gpu)
    assert not refused.fits and any("act-order" in r for r in refused.reasons)
    assert estimate(s, ServeOptions(vllm_version="0.21.0"), gpu).fits
    assert estimate(spec(LLAMA, {**config, "group_size": -1}), ServeOptions(), gpu).fits
    # one int32 g_idx[in] per module: qkv_proj, o_proj, gate_up_proj (in 1024), down (4096)
    assert layer(s) == layer(spec(LLAMA, {**config, "desc_act": False})) + 4 * (3 * 1024 + 4096)
