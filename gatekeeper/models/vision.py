"""The vision tower of a multimodal model: its parameters and the shape of the
multimodal profile vLLM runs at start-up.

Parameters follow the common ViT layout: per block ``4h^2 + 4h`` for attention (with
biases), ``2hi`` (or ``3hi`` for gated MLPs) for the MLP and four norm vectors; a patch
embedding of ``channels x patch^2 x temporal x h``; and a projector into the language
model (a 2-layer merger over ``merge^2`` patches when the config has
``out_hidden_size``, else one ``vision_output_dim x text_hidden`` matrix).

The profile size per item is the largest image the processor accepts:

- Qwen2/2.5-VL: ``max_pixels`` 12,845,056 -> 65,536 patches of 14x14, 16,384 tokens
  after the 2x2 merge;
- Mllama: ``max_num_tiles`` tiles of ``(560/14)^2 + 1`` patches, fed to cross-attention;
- Gemma 3: ``(896/14)^2`` = 4,096 patches pooled to ``mm_tokens_per_image`` (256) tokens;
- Llama 4: 16 tiles plus a global view of ``(336/14)^2`` patches, pixel-shuffled by
  ``pixel_shuffle_ratio^2``;
- Gemma 4 unified (``gemma4_unified_vision``): no encoder, an embedder of one
  ``num_soft_tokens``-token item (280), a token per 48-pixel model patch;
- Gemma 4 (``gemma4_vision``, transformers' ``Gemma4VisionModel`` as vLLM builds it):
  ``default_output_length`` soft tokens (280), each pooled from ``pooling_kernel_size^2``
  patches (2,520 patches). Its blocks have no biases, a gated MLP and per-head q/k norms;
  the patch embedder a ``2 x position_embedding_size x h`` position table;
  ``standardize`` adds two vectors; the embedder one ``h x text_hidden`` projection;
- otherwise ``(image_size/patch)^2`` patches (each side its own: [height, width]), one token each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gatekeeper.models.spec import VisionSpec

__all__ = ["vision_spec"]

_GATED_ACTS = frozenset({"silu", "swiglu"})
QWEN_VL_MAX_PIXELS = 12_845_056
LLAMA4_MAX_TILES = 16


def vision_spec(
    vision: Mapping[str, Any] | None, top: Mapping[str, Any], text_hidden: int
) -> VisionSpec | None:
    """The vision tower described by ``vision_config`` (None when absent)."""
    if not vision:
        return None
    if vision.get("model_type") == "gemma4_unified_vision":
        return _gemma4_unified(vision, top, text_hidden)
    h = int(vision.get("hidden_size") or vision.get("embed_dim") or 0)
    if h <= 0:
        return None
    if vision.get("model_type") == "gemma4_vision":
        return _gemma4(vision, top, h, text_hidden)
    i = int(vision.get("intermediate_size") or 4 * h)
    gated = str(vision.get("hidden_act", "")) in _GATED_ACTS
    blocks = int(vision.get("depth") or vision.get("num_hidden_layers") or 0)
    blocks += int(vision.get("num_global_layers") or 0)
    per_block = 4 * h * h + 4 * h + (3 if gated else 2) * h * i + i + h + 4 * h
    patch = _sides(vision.get("patch_size"), 14)
    channels = int(vision.get("num_channels") or vision.get("in_chans") or 3)
    temporal = int(vision.get("temporal_patch_size") or 1)
    parameters = blocks * per_block + channels * patch[0] * patch[1] * temporal * h
    parameters += _projector(vision, h, text_hidden)
    patches, tokens, cross = _profile_item(vision, top, patch)
    # a patch wider than the largest image still makes one (and the profile divides by it)
    patches, tokens = max(1, patches), max(1, tokens)
    return VisionSpec(
        parameters=parameters,
        hidden_size=h,
        intermediate_size=i,
        gated=gated,
        patches_per_item=patches,
        tokens_per_item=tokens,
        output_dim=int(vision.get("vision_output_dim") or h),
        cross_attention=cross,
        modalities=_modalities(top),
    )


def _gemma4(
    vision: Mapping[str, Any], top: Mapping[str, Any], h: int, text_hidden: int
) -> VisionSpec:
    """Gemma 4's tower (transformers modeling_gemma4.py Gemma4VisionModel; vllm
    gemma4_mm.py: ``AutoModel.from_config`` and ``Gemma4MultimodalEmbedder``)."""
    i = int(vision.get("intermediate_size") or 4 * h)
    head_dim = int(vision.get("head_dim") or 0)
    per_block = 4 * h * h + 2 * head_dim + 3 * h * i + 4 * h  # q/k/v/o, q/k norms, MLP, norms
    patch = int(vision.get("patch_size") or 16)
    table = 2 * int(vision.get("position_embedding_size") or 0) * h
    parameters = int(vision.get("num_hidden_layers") or 0) * per_block + table
    parameters += 3 * patch * patch * h + (2 * h if vision.get("standardize") else 0)
    tokens = int(vision.get("default_output_length") or 280)
    pooled = int(vision.get("pooling_kernel_size") or 3) ** 2
    return VisionSpec(
        parameters=parameters + h * text_hidden,
        hidden_size=h,
        intermediate_size=i,
        gated=True,
        patches_per_item=tokens * pooled,
        tokens_per_item=tokens,
        output_dim=h,
        modalities=_modalities(top),
        replicated=True,
    )


def _gemma4_unified(
    vision: Mapping[str, Any], top: Mapping[str, Any], text_hidden: int
) -> VisionSpec:
    """Gemma 4 unified's encoder-free vision embedder (vllm gemma4_unified.py
    ``Gemma4UnifiedVisionEmbedder``: ``patch_ln1`` over a ``model_patch_size^2 x 3``-pixel
    patch (``patch_size x pooling_kernel_size`` = 48 pixels a side), ``patch_dense`` to
    ``mm_embed_dim`` with a bias, ``patch_ln2``, an ``mm_posemb_size x 2 x mm_embed_dim``
    position table and ``pos_norm``, LayerNorms with biases) and the ``embed_vision`` and
    ``embed_audio`` projections (``Gemma4MultimodalEmbedder``: ``output_proj_dims`` -> the
    text hidden size, built without the quantization config). ``__init__`` builds them all
    outside ``_mark_tower_model``, so vLLM holds them even with every modality off
    (``language_model_only``); ``patch_dense`` alone asks the quantization config."""
    side = int(vision.get("patch_size") or 16) * int(vision.get("pooling_kernel_size") or 3)
    pixels = 3 * side * side
    e = int(vision.get("mm_embed_dim") or 3840)
    table = int(vision.get("mm_posemb_size") or 1120) * 2 * e
    audio = top.get("audio_config")
    audio_in = (
        int(
            audio.get("output_proj_dims")
            or audio.get("hidden_size")
            or audio.get("audio_embed_dim")
            or 640
        )
        if isinstance(audio, Mapping)
        else 0
    )
    projections = (int(vision.get("output_proj_dims") or 3840) + audio_in) * text_hidden
    norms = 2 * pixels + 2 * e + 2 * e  # patch_ln1, patch_ln2, pos_norm: weight and bias
    tokens = int(vision.get("num_soft_tokens") or vision.get("default_output_length") or 280)
    return VisionSpec(
        parameters=norms + pixels * e + e + table + projections,
        hidden_size=e,
        intermediate_size=0,
        gated=False,
        patches_per_item=tokens,
        tokens_per_item=tokens,
        output_dim=e,
        modalities=_modalities(top),
        replicated=True,
        built_without_media=True,
        quantized_linears=(("vision_embedder.patch_dense", pixels, e),),
    )


def _modalities(top: Mapping[str, Any]) -> tuple[str, ...]:
    """Images, and videos for the models whose config names a video token (Qwen2-VL and
    Qwen2.5-VL, LLaVA-OneVision ...)."""
    keys = ("video_token_id", "video_token_index", "video_token")
    return ("image", "video") if any(top.get(k) is not None for k in keys) else ("image",)


def _sides(value: Any, default: int) -> tuple[int, int]:
    """``image_size`` / ``patch_size``: one side, or [height, width] (InternVL's vision
    config; vllm interns1_vit.py divides each side by its own)."""
    if isinstance(value, list):
        return int(value[0]), int(value[1])
    return int(value or default), int(value or default)


def _profile_item(
    vision: Mapping[str, Any], top: Mapping[str, Any], patch: tuple[int, int]
) -> tuple[int, int, bool]:
    """(encoder patches, language-model tokens, cross-attention) of the largest image."""
    model_type = str(top.get("model_type", ""))
    image = _sides(vision.get("image_size"), 0)
    rows, columns = image[0] // patch[0], image[1] // patch[1]
    if model_type in ("qwen2_vl", "qwen2_5_vl", "qwen2_5_omni"):
        merge = int(vision.get("spatial_merge_size") or 2)
        patches = QWEN_VL_MAX_PIXELS // (patch[0] * patch[1])
        return patches, patches // (merge * merge), False
    if model_type == "mllama":
        patches = int(vision.get("max_num_tiles") or 4) * (rows * columns + 1)
        return patches, patches, True
    if model_type.startswith("llama4"):
        patches = (LLAMA4_MAX_TILES + 1) * rows * columns
        ratio = float(vision.get("pixel_shuffle_ratio") or 1.0)
        return patches, int(patches * ratio * ratio), False
    patches = rows * columns if rows * columns else 1024
    tokens = int(top.get("mm_tokens_per_image") or patches)
    return patches, tokens, False


def _projector(vision: Mapping[str, Any], h: int, text_hidden: int) -> int:
    if vision.get("out_hidden_size"):
        merge = int(vision.get("spatial_merge_size") or 2)
        wide = h * merge * merge
        return wide * wide + wide * int(vision["out_hidden_size"])
    if vision.get("vision_output_dim"):
        return int(vision["vision_output_dim"]) * text_hidden
    return h * text_hidden
