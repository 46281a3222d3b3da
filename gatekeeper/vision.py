"""Parameter count of a multimodal model's vision tower and projector.

The estimate follows the common ViT layout: per block ``4h^2 + 4h`` for attention
(with biases), ``2hi`` (or ``3hi`` for gated MLPs) for the MLP and four norm
vectors; a patch embedding of ``channels x patch^2 x temporal x h``; and a projector
into the language model (a 2-layer merger over ``merge^2`` patches when the config
has ``out_hidden_size``, else one ``vision_output_dim x text_hidden`` matrix).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["vision_parameters"]

_GATED_ACTS = frozenset({"silu", "swiglu"})


def vision_parameters(vision: Mapping[str, Any] | None, text_hidden: int) -> int:
    """Parameters of the vision tower described by ``vision_config`` (0 when absent)."""
    if not vision:
        return 0
    h = int(vision.get("hidden_size") or vision.get("embed_dim") or 0)
    if h <= 0:
        return 0
    i = int(vision.get("intermediate_size") or 4 * h)
    blocks = int(vision.get("depth") or vision.get("num_hidden_layers") or 0)
    blocks += int(vision.get("num_global_layers") or 0)
    mlp = (3 if str(vision.get("hidden_act", "")) in _GATED_ACTS else 2) * h * i
    per_block = 4 * h * h + 4 * h + mlp + i + h + 4 * h
    patch = int(vision.get("patch_size") or 14)
    channels = int(
        vision.get("num_channels") or vision.get("in_chans") or vision.get("in_channels") or 3
    )
    temporal = int(vision.get("temporal_patch_size") or 1)
    patch_embed = channels * patch * patch * temporal * h
    return blocks * per_block + patch_embed + _projector(vision, h, text_hidden)


def _projector(vision: Mapping[str, Any], h: int, text_hidden: int) -> int:
    if vision.get("out_hidden_size"):
        merge = int(vision.get("spatial_merge_size") or 2)
        wide = h * merge * merge
        return wide * wide + wide * int(vision["out_hidden_size"])
    if vision.get("vision_output_dim"):
        return int(vision["vision_output_dim"]) * text_hidden
    return h * text_hidden
