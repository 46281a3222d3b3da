"""Whisper (``WhisperForConditionalGeneration``) as vLLM 0.32 builds and runs it: the
decoder and the audio encoder of ``vllm/model_executor/models/whisper.py``, and the KV
cache of its self- and cross-attention (``v1/kv_cache_interface.py``: ``FullAttentionSpec``
and ``CrossAttentionSpec``, grouped by ``v1/core/kv_cache_utils.py``).

Every expected figure is written out from openai/whisper-large-v3's config.json and
vLLM's construction, not from gatekeeper's functions; vLLM's own build of this config on
the meta device (``gatekeeper/vllm/meta_build.py``) is quoted beside them.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import accounting_for
from gatekeeper.estimator.overhead import BatchShape, encoder_peak_bytes
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.module_names import module_names
from gatekeeper.models.spec import CheckpointTensor, CheckpointWeights, ModelSpec
from gatekeeper.units import GIB
from gatekeeper.vllm.flags import options_from_mapping

H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")

WHISPER_LARGE_V3: dict[str, Any] = {  # openai/whisper-large-v3, config.json
    "_name_or_path": "openai/whisper-large-v3",
    "activation_dropout": 0.0,
    "activation_function": "gelu",
    "apply_spec_augment": False,
    "architectures": ["WhisperForConditionalGeneration"],
    "attention_dropout": 0.0,
    "begin_suppress_tokens": [220, 50257],
    "bos_token_id": 50257,
    "classifier_proj_size": 256,
    "d_model": 1280,
    "decoder_attention_heads": 20,
    "decoder_ffn_dim": 5120,
    "decoder_layerdrop": 0.0,
    "decoder_layers": 32,
    "decoder_start_token_id": 50258,
    "dropout": 0.0,
    "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "encoder_layerdrop": 0.0,
    "encoder_layers": 32,
    "eos_token_id": 50257,
    "init_std": 0.02,
    "is_encoder_decoder": True,
    "mask_feature_length": 10,
    "mask_feature_min_masks": 0,
    "mask_feature_prob": 0.0,
    "mask_time_length": 10,
    "mask_time_min_masks": 2,
    "mask_time_prob": 0.05,
    "max_length": 448,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "median_filter_width": 7,
    "model_type": "whisper",
    "num_hidden_layers": 32,
    "num_mel_bins": 128,
    "pad_token_id": 50256,
    "scale_embedding": False,
    "torch_dtype": "float16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "use_weighted_layer_sum": False,
    "vocab_size": 51866,
}
D, F, HEADS, LAYERS, VOCAB, FP16 = 1280, 5120, 20, 32, 51866, 2
NO_AUDIO = {"limit_mm_per_prompt": {"audio": 0}}


def _spec(config: dict[str, Any] = WHISPER_LARGE_V3) -> ModelSpec:
    return spec_from_config(config, name="openai/whisper-large-v3")


def run(config: dict[str, Any] = WHISPER_LARGE_V3, **flags: Any) -> Estimate:
    options = options_from_mapping({"vllm_version": "0.32.0", **flags}, where="test")[0]
    return estimate(_spec(config), options, H100)


def test_the_config_reads_as_its_decoder_beside_its_audio_encoder() -> None:
    spec = _spec()
    # the decoder (WhisperDecoder): decoder_* fields, K and V with every head; the
    # published num_hidden_layers (32) is the encoder's count, read from encoder_layers
    assert (spec.num_layers, spec.num_attention_heads, spec.num_kv_heads) == (32, 20, 20)
    assert (spec.hidden_size, spec.head_dim, spec.intermediate_size) == (1280, 64, 5120)
    # vLLM's length keys hold max_target_positions, not max_source_positions (1,500)
    assert spec.max_position_embeddings == 448 and spec.torch_dtype == "float16"
    # WhisperMLP fc1/fc2 ungated, every linear biased, three LayerNorms a layer, a learned
    # position table and no rotary cache; proj_out tied to an nn.Embedding
    assert not spec.gated_mlp and spec.attention_bias and spec.output_bias and spec.mlp_bias
    assert (spec.norms_per_layer, spec.learned_position_embeddings, spec.rotary_dim) == (6, 448, 0)
    assert spec.tie_word_embeddings and spec.plain_embedding
    encoder = spec.encoder
    assert encoder is not None and (encoder.num_layers, encoder.num_mel_bins) == (32, 128)
    assert spec.vision is not None and spec.vision.modalities == ("audio",)
    assert spec.vision.tokens_per_item == 1500


def test_weights_are_whisper_pys_decoder_and_encoder() -> None:
    # a decoder layer: self_attn qkv_proj 3d x d + 3d (vLLM adds K's zero bias) and
    # out_proj d x d + d; encoder_attn q_proj d x d + d, kv_proj 2d x d + 2d, out_proj
    # d x d + d; fc1 d x f + f, fc2 f x d + d; three LayerNorms, 6d
    layer = 8 * D * D + 2 * D * F + 15 * D + F
    # nn.Embedding (vocabulary unpadded) and the 448-row position table; the final
    # LayerNorm; proj_out shares the embedding (tie_weights)
    decoder = LAYERS * layer + VOCAB * D + 448 * D + 2 * D
    # the encoder: per layer qkv_proj 3d^2 + 3d, out_proj d^2 + d, fc1, fc2, 2 LayerNorms;
    # conv1 128 mel bins x d x 3 + d, conv2 d x d x 3 + d, 1,500 positions, a LayerNorm
    encoder_layer = 4 * D * D + 4 * D + 2 * D * F + F + D + 4 * D
    encoder = LAYERS * encoder_layer + 3 * 128 * D + D + 3 * D * D + D + 1500 * D + 2 * D
    # vLLM's build: 3,087,227,904 B, of which 1,024 are its 64 attention layers' float32
    # q/k/v/prob scales; 1,813,208,064 B without the encoder
    assert (decoder + encoder) * FP16 == 3_087_226_880
    assert decoder * FP16 == 1_813_207_040
    full = run()
    assert full.worst.weights_bytes == (decoder + encoder) * FP16
    assert full.worst.weights_by_group.by_group()["vision"] == {"float16": encoder * FP16}
    # no audio: vLLM builds no encoder (_mark_tower_model) and profiles none
    text_only = run(**NO_AUDIO)
    assert text_only.worst.weights_bytes == decoder * FP16
    assert text_only.worst.activation_peak_bytes <= full.worst.activation_peak_bytes


def test_tensor_parallel_splits_the_linears_and_keeps_the_torch_modules_whole() -> None:
    # a decoder layer's linears split by 2 (their biases too, but row-parallel out_proj's
    # and fc2's, and the LayerNorms); the nn.Embedding, the position tables, the convs whole
    layer = 4 * D * D + D * F + 12 * D + F // 2
    decoder = LAYERS * layer + (VOCAB + 448) * D + 2 * D
    encoder_layer = 2 * D * D + D * F + 15 * D // 2 + F // 2
    encoder = LAYERS * encoder_layer + 3 * 128 * D + D + 3 * D * D + D + 1500 * D + 2 * D
    # vLLM's build at TP 2: 1,618,525,184 B and 973,937,664 without the encoder (+1,024)
    assert run(tensor_parallel_size=2).worst.weights_bytes == (decoder + encoder) * FP16
    assert run(tensor_parallel_size=2, **NO_AUDIO).worst.weights_bytes == decoder * FP16


def test_quantization_is_asked_with_the_names_whisper_py_builds_its_layers_with() -> None:
    # make_layers hands layer N ".decoder.layers.N" and whisper.py's lambda builds it with
    # ".layers" after that, so a quantizer's exclusions by checkpoint name
    # (model.decoder.layers.0.self_attn*, model.encoder*) match nothing: vLLM's build of
    # this config quantizes every linear but proj_out (976,973,312 B; gatekeeper 1,536 B
    # less: the attention and KV-cache scales)
    names = module_names("WhisperForConditionalGeneration")
    assert names.layer(3) == ".decoder.layers.3.layers"
    assert names.encoder is not None and names.encoder.layer(3) == ".encoder.layers.3.layers"
    modelopt = {
        "quant_method": "modelopt",
        "quantization": {
            "quant_algo": "NVFP4",
            "group_size": 16,
            "exclude_modules": ["lm_head", "model.decoder.layers.0.self_attn*",
                                "model.encoder*", "proj_out*"],
        },
    }  # fmt: skip
    got = run({**WHISPER_LARGE_V3, "quantization_config": modelopt})
    groups = got.worst.weights_by_group.by_group()
    # in float16, only the biases: self_attn 3d + d and encoder_attn 3d + d per layer
    assert groups["attention"]["float16"] == LAYERS * 8 * D * FP16
    assert got.worst.weights_bytes == 976_971_776


def test_the_kv_cache_holds_self_attention_per_token_and_cross_attention_per_request() -> None:
    got = run()
    # 20 heads x (64 + 64) x 2 B per token and layer; the 32 self-attention layers
    # (FullAttentionSpec) and the 32 cross-attention layers (CrossAttentionSpec) form two
    # groups of 32 of one page, sharing the pool: a block is 32 x 5,120 x 16 B
    assert got.kv_block_bytes == 32 * 5120 * 16
    assert got.kv_bytes_per_token == 32 * 5120  # a decoder token's: self-attention only
    # a request holds cdiv(448, 16) self-attention blocks, and the cross-attention's
    # cdiv(max_num_encoder_input_tokens, 16), which SchedulerConfig sets to
    # max_num_batched_tokens (8,192 on an H100: 512 blocks), as CrossAttentionSpec's
    # max_memory_usage_bytes has vLLM count it
    assert got.max_num_batched_tokens == 8192
    assert got.blocks_per_request == 28 + 512
    blocks = got.worst.num_blocks
    assert got.kv_cache_tokens == int(blocks / 540 * 448)  # get_kv_cache_capacity
    # vLLM's own groups for a whisper-tiny config at 2,048 batched tokens: 70.01x
    # concurrency of 10,922 blocks, 10,922 / (28 + 128)
    assert run(max_num_batched_tokens=2048).blocks_per_request == 28 + 128


def test_vllm_refuses_a_batch_shorter_than_an_audio_item_or_the_length() -> None:
    # encoder-decoders run without chunked prefill nor chunked multimodal input
    # (SchedulerConfig.__post_init__): compute_mm_encoder_budget refuses 1,500 encoder
    # positions in fewer batched tokens, verify_max_model_len fewer than max_model_len
    with pytest.raises(ServeOptionsError, match=r"max_num_batched_tokens: 1024 is below one audio"):
        run(max_num_batched_tokens=1024)
    assert run(max_num_batched_tokens=1024, **NO_AUDIO).fits
    with pytest.raises(
        ServeOptionsError, match=r"max_num_batched_tokens: 256 is below max_model_len"
    ):
        run(max_num_batched_tokens=256, **NO_AUDIO)


def test_the_encoder_profile_runs_the_items_the_encoder_budget_holds() -> None:
    # MultiModalBudget: 8,192 // 1,500 = 5 items of 1,500 frames (max_num_reqs capped to
    # max_num_batched_tokens // 1,500 without chunked prefill, one audio a prompt); each
    # frame's MLP (fc1 out, activation, fc2 in: 2f) and three hidden-wide tensors, and
    # the 1,500 x d outputs kept for the decoder (counted twice: approximated)
    spec = _spec()
    shape = BatchShape(max_num_seqs=1024, max_num_batched_tokens=8192, chunked_prefill=False)
    frames = 5 * 1500
    expected = (frames * (2 * F + 3 * D) + 2 * frames * D) * FP16
    assert encoder_peak_bytes(accounting_for("0.32.0"), spec, shape, FP16) == expected
    # below the sampler's 1,024 requests x 51,904 padded logits at vLLM's defaults, so the
    # profile's peak is the same with the encoder off
    assert run().worst.activation_peak_bytes == run(**NO_AUDIO).worst.activation_peak_bytes


def _checkpoint(d: int, f: int, mel: int, encoder: int, decoder: int) -> CheckpointWeights:
    """A Whisper checkpoint's tensors as transformers writes them (fp16; q, k, v apart, K
    without a bias, fc1/fc2 on the layer, proj_out left out: tied)."""
    shapes: dict[str, tuple[int, ...]] = {
        "model.encoder.conv1.weight": (d, mel, 3), "model.encoder.conv1.bias": (d,),
        "model.encoder.conv2.weight": (d, d, 3), "model.encoder.conv2.bias": (d,),
        "model.encoder.embed_positions.weight": (1500, d),
        "model.encoder.layer_norm.weight": (d,), "model.encoder.layer_norm.bias": (d,),
        "model.decoder.embed_tokens.weight": (1000, d),
        "model.decoder.embed_positions.weight": (448, d),
        "model.decoder.layer_norm.weight": (d,), "model.decoder.layer_norm.bias": (d,),
    }  # fmt: skip
    attention = {"q_proj": True, "k_proj": False, "v_proj": True, "out_proj": True}
    for side, count in (("encoder", encoder), ("decoder", decoder)):
        kinds = ["self_attn"] + (["encoder_attn"] if side == "decoder" else [])
        for i in range(count):
            p = f"model.{side}.layers.{i}"
            for kind in kinds:
                for proj, bias in attention.items():
                    shapes[f"{p}.{kind}.{proj}.weight"] = (d, d)
                    shapes.update({f"{p}.{kind}.{proj}.bias": (d,)} if bias else {})
                for part in ("weight", "bias"):
                    shapes[f"{p}.{kind}_layer_norm.{part}"] = (d,)
            shapes.update({f"{p}.fc1.weight": (f, d), f"{p}.fc1.bias": (f,),
                           f"{p}.fc2.weight": (d, f), f"{p}.fc2.bias": (d,)})  # fmt: skip
            shapes.update({f"{p}.final_layer_norm.{part}": (d,) for part in ("weight", "bias")})
    tensors = tuple(
        CheckpointTensor(name, "F16", shape, math.prod(shape) * FP16)
        for name, shape in shapes.items()
    )
    return CheckpointWeights(sum(t.num_bytes for t in tensors), tensors, "model.safetensors")


def test_a_checkpoints_tensors_keep_the_encoder_layers_past_the_decoders() -> None:
    # distil-whisper's shape: more encoder layers (4) than decoder layers (2); the
    # encoder's layers are the tower's, not decoder layers past the last one
    config = {**WHISPER_LARGE_V3, "d_model": 64, "decoder_attention_heads": 4,
              "encoder_attention_heads": 4, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128,
              "encoder_layers": 4, "decoder_layers": 2, "num_hidden_layers": 4,
              "num_mel_bins": 80, "vocab_size": 1000}  # fmt: skip
    checkpoint = _checkpoint(64, 128, 80, encoder=4, decoder=2)
    spec = spec_from_config(config, name="distil", checkpoint=checkpoint)
    options = options_from_mapping({"vllm_version": "0.32.0"}, where="test")[0]
    from_tensors = estimate(spec, options, H100).worst.weights_bytes
    from_config = run(config).worst.weights_bytes
    # vLLM adds a zero bias for K (load_weights: _create_fake_bias_for_k_proj), which the
    # checkpoint does not store: 4 encoder and 2 x 2 decoder attentions of 64
    assert from_config - from_tensors == (4 + 2 * 2) * 64 * FP16
    no_audio = options_from_mapping({"vllm_version": "0.32.0", **NO_AUDIO}, where="test")[0]
    decoder_only = estimate(spec, no_audio, H100).worst.weights_bytes
    assert decoder_only == run(config, **NO_AUDIO).worst.weights_bytes - 2 * 2 * 64 * FP16
