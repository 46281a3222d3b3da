"""Encoder-decoder models: Whisper, read as vLLM's ``whisper.py`` builds it.

Of the encoder-decoders vLLM 0.32 registers, gatekeeper sizes Whisper
(``WhisperForConditionalGeneration``, served through the transcription API). Its config is
written the flat way, ``encoder_*`` and ``decoder_*`` fields beside ``d_model`` (the
published ones also say ``num_hidden_layers``: the encoder's count, transformers'
``WhisperConfig``), and is read in two parts:

- the decoder is the language model: ``decoder_layers`` layers of
  ``decoder_attention_heads`` heads (K and V with every head), ``decoder_ffn_dim`` wide,
  ``d_model`` hidden, a learned position table of ``max_target_positions`` rows (also the
  served length, 448), its token embedding a plain ``nn.Embedding`` that the head
  (``proj_out``) is always tied to (``ModelSpec.plain_embedding``); each of its layers has
  a cross-attention (``encoder_attn``) beside its self-attention (``ModelSpec.encoder``);
- the encoder is the audio tower (``EncoderSpec``), with a ``VisionSpec`` of modality
  ``audio`` for what the estimator asks of any tower: whether ``--limit-mm-per-prompt``
  turns it off (vLLM then builds no encoder, ``_mark_tower_model``) and the profile vLLM
  runs of it (an item is 30 s of audio, ``max_source_positions`` frames).

Another encoder-decoder written that way is refused, naming ``decoder_layers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.config_fields import field_value, positive
from gatekeeper.models.spec import EncoderSpec, ModelSpec, VisionSpec

__all__ = ["decoder_view", "encoder_parameters", "with_encoder"]

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


def decoder_view(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], EncoderSpec | None]:
    """``config`` as the decoder-only reader takes it, and the encoder beside it: Whisper's
    decoder fields under the names of a decoder's (``num_hidden_layers``,
    ``num_attention_heads``, ``hidden_size``, ``intermediate_size``) and its ``encoder_*``
    fields as an ``EncoderSpec``; a config that is no flat encoder-decoder as it is, with
    None. Another flat encoder-decoder is refused (``decoder_layers``)."""
    text = config.get("text_config") or config
    if not text.get("is_encoder_decoder") or text.get("decoder_layers") is None:
        return config, None
    if text.get("model_type") != "whisper" or text is not config:
        if any(text.get(k) for k in _LAYER_KEYS):
            return config, None  # a layer count of its own: read as a decoder
        arch = (config.get("architectures") or [config.get("model_type")])[0]
        raise ModelSpecError(
            f"decoder_layers: {arch} is an encoder-decoder (is_encoder_decoder: true, "
            f"encoder_layers {text.get('encoder_layers')}, decoder_layers "
            f"{text['decoder_layers']}); gatekeeper sizes Whisper's (model_type whisper) "
            "and decoder-only language models (num_hidden_layers), not this one's "
            "cross-attention nor its encoder. Admit this model by its measured memory "
            "(vllm serve's own profile), not by an estimate",
            field="decoder_layers",
            value=text["decoder_layers"],
        )

    def count(key: str) -> int:
        return positive(key, field_value(config, key, key))

    heads = count("decoder_attention_heads")
    encoder = EncoderSpec(
        num_layers=count("encoder_layers"),
        num_attention_heads=count("encoder_attention_heads"),
        intermediate_size=count("encoder_ffn_dim"),
        num_mel_bins=count("num_mel_bins"),
        max_source_positions=count("max_source_positions"),
    )
    view = {
        **config,
        "num_hidden_layers": count("decoder_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": heads,  # WhisperAttention: K and V with every head
        "hidden_size": count("d_model"),
        "intermediate_size": count("decoder_ffn_dim"),
        "tie_word_embeddings": True,  # proj_out.tie_weights(embed_tokens), whatever it says
    }
    return view, encoder


def encoder_parameters(encoder: EncoderSpec, hidden: int) -> int:
    """The audio encoder's parameters as whisper.py's ``WhisperEncoder`` builds them:
    ``conv1`` (mel bins -> hidden) and ``conv2`` (hidden -> hidden), kernel 3, with biases;
    per layer ``qkv_proj`` and ``out_proj`` with biases (K's a zero bias vLLM adds), ``fc1``
    and ``fc2`` with biases, two LayerNorms; the position table and the final LayerNorm."""
    h, f = hidden, encoder.intermediate_size
    layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 2 * 2 * h
    convs = 3 * encoder.num_mel_bins * h + h + 3 * h * h + h
    return encoder.num_layers * layer + convs + encoder.max_source_positions * h + 2 * h


def with_encoder(spec: ModelSpec, encoder: EncoderSpec) -> ModelSpec:
    """The decoder's spec with its encoder: the cross-attention in every layer, the audio
    tower (whose profile item is ``max_source_positions`` frames, each handed on as one
    position of the cross-attention's keys and values), the plain tied embedding."""
    h = spec.hidden_size
    tower = VisionSpec(
        parameters=encoder_parameters(encoder, h),
        hidden_size=h,
        intermediate_size=encoder.intermediate_size,
        gated=False,
        patches_per_item=encoder.max_source_positions,
        tokens_per_item=encoder.max_source_positions,
        output_dim=h,
        cross_attention=True,
        modalities=("audio",),
    )
    return replace(
        spec, encoder=encoder, vision=tower, plain_embedding=True, tie_word_embeddings=True
    )
