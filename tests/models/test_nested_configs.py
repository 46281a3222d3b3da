"""Configs vLLM 0.32 builds whose language model or fields sit where a plain decoder's do
not (found by the registry matrix, tests/estimator/test_registry_matrix.py, which compares
each with vLLM's construction): read as vLLM reads them, or refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.spec import ModelSpec


def _spec(config: dict[str, Any]) -> ModelSpec:
    return spec_from_config(config, name=config["architectures"][0])


def test_qwen2_5_omni_sizes_the_thinkers_language_model() -> None:
    """Qwen2_5OmniConfig.get_text_config is the thinker's text_config (vLLM builds the
    thinker); the layer count, width and tied head come from there."""
    spec = _spec(
        {
            "architectures": ["Qwen2_5OmniForConditionalGeneration"],
            "model_type": "qwen2_5_omni",
            "thinker_config": {
                "tie_word_embeddings": False,
                "text_config": {"num_hidden_layers": 3, "hidden_size": 512,
                                "tie_word_embeddings": True},
            },
        }
    )  # fmt: skip
    assert (spec.num_layers, spec.hidden_size, spec.tie_word_embeddings) == (3, 512, True)


def test_bagel_sizes_its_llm_config() -> None:
    spec = _spec(
        {
            "architectures": ["BagelForConditionalGeneration"],
            "model_type": "bagel",
            "llm_config": {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 256,
                           "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000},
        }
    )  # fmt: skip
    assert (spec.num_layers, spec.hidden_size) == (2, 256)


def test_internvl_image_size_as_height_and_width() -> None:
    """InternVLVisionConfig writes image_size and patch_size as [height, width]."""
    spec = _spec({"architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl"})
    assert spec.vision is not None and spec.vision.patches_per_item == (448 // 14) ** 2


@pytest.mark.parametrize("value", [[448], [448, "448"], "448", [0, 448]])
def test_image_size_of_another_shape_is_refused(value: object) -> None:
    config = {"architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl"}
    with pytest.raises(ModelSpecError, match=r"vision_config.image_size.*\[height, width\]"):
        _spec({**config, "vision_config": {"image_size": value}})


def test_falcon_mlp_is_four_times_hidden() -> None:
    """vllm falcon.py FalconMLP: 4 x hidden, whatever ffn_hidden_size says."""
    spec = _spec({"architectures": ["FalconForCausalLM"], "model_type": "falcon"})
    assert spec.intermediate_size == 4 * spec.hidden_size and not spec.gated_mlp


def test_null_experts_per_token_is_refused_naming_the_field() -> None:
    """DeepseekV2Config defaults num_experts_per_tok to null: vLLM cannot route."""
    config = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2"}
    with pytest.raises(ModelSpecError, match=r"num_experts_per_tok: config\.json sets it to null"):
        _spec(config)
    moe = _spec({**config, "num_experts_per_tok": 6}).moe
    assert moe is not None and moe.experts_per_token == 6


def test_whisper_is_read_as_its_decoder_and_its_encoder() -> None:
    """vllm whisper.py: the decoder (decoder_* fields) and the audio encoder beside it
    (tests/estimator/test_whisper.py sizes them)."""
    spec = _spec({"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"})
    encoder = spec.encoder
    assert (spec.num_layers, spec.hidden_size, spec.max_position_embeddings) == (4, 384, 448)
    assert encoder is not None and encoder.max_source_positions == 1500


def test_another_flat_encoder_decoder_is_refused_naming_decoder_layers() -> None:
    config = {"architectures": ["BartForConditionalGeneration"], "model_type": "bart"}
    with pytest.raises(ModelSpecError, match=r"decoder_layers: .* is an encoder-decoder") as got:
        _spec(config)
    assert got.value.field == "decoder_layers"
