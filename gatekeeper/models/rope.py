"""Rotary positions and the length vLLM serves a config at.

Pure: the text part of a parsed ``config.json`` in. ``rope_cache`` is the rotary cos/sin
cache vLLM's ``get_rope`` builds (its size counts as weights); ``derived_max_len`` is the
``--max-model-len`` vLLM takes when none is given (``vllm/config/model.py``
``_get_and_verify_max_len``, with ``ModelArchConfigConvertorBase.derive_max_model_len_and_key``
in ``vllm/transformers_utils/model_arch_config_convertor.py``):

- the smallest of the length keys the config has; ``model_max_length`` (Command-R) wins
  over the others when set; none of them: 2048;
- times the RoPE scaling ``factor`` of every rope type that does not already count it
  (not ``su``, ``longrope``, ``llama3``, ``yarn``, ``deepseek_yarn``,
  ``deepseek_llama_scaling``), except for Gemma 3, whose length is already scaled;
- a sentence-transformers ``max_seq_length`` (``sentence_bert_config.json``) replaces it;
- LongRoPE serves ``original_max_position_embeddings`` by default (Phi-3/4 128K: 4096),
  while a ``--max-model-len`` up to the derived length is still accepted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gatekeeper.models.spec import AttentionShape, MlaSpec

__all__ = [
    "DEFAULT_MAX_LEN",
    "LENGTH_KEYS",
    "derived_max_len",
    "rope_cache",
    "rope_parameters",
    "rope_widths",
]

LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
"""vLLM's ``possible_keys``, in its order."""
DEFAULT_MAX_LEN = 2048
HALF_ROTARY_BY_DEFAULT: dict[str, float] = {"glm4v_text": 0.5, "glm_ocr_text": 0.5}
"""Text model types whose config class writes no ``partial_rotary_factor`` while vLLM's
attention defaults it to 0.5: glm4.py Glm4Attention (``rope_parameters.setdefault(
"partial_rotary_factor", 0.5)``), the language model glm4_1v.py and glm_ocr.py build."""
_FACTOR_ALREADY_COUNTED = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)


def rope_parameters(cfg: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The config's rope dicts, one per layer type when nested (vLLM's
    ``iter_rope_parameters``; transformers 5 writes ``rope_parameters``, older configs
    ``rope_scaling``, which vLLM's ``patch_rope_parameters`` turns into it)."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping) or not rope:
        return
    nested = [v for v in rope.values() if isinstance(v, Mapping)]
    if nested:
        yield from (v for v in nested if v)
    else:
        yield rope


def _kind(rope: Mapping[str, Any]) -> str:
    return str(rope.get("rope_type") or rope.get("type") or "default")


def derived_max_len(
    cfg: Mapping[str, Any], model_type: str, max_seq_length: int | None = None
) -> tuple[int, int, bool]:
    """(the longest ``--max-model-len`` vLLM accepts, the one it serves at when none is
    given, whether the config names a length); see the module docstring."""
    present = [int(cfg[k]) for k in LENGTH_KEYS if cfg.get(k) is not None]
    length = float(min(present)) if present else float(DEFAULT_MAX_LEN)
    if cfg.get("model_max_length"):
        length = float(cfg["model_max_length"])
    ropes = list(rope_parameters(cfg))
    if ropes and "gemma3" not in model_type:
        factor = 1.0
        for rope in ropes:
            if _kind(rope) not in _FACTOR_ALREADY_COUNTED:
                factor = rope.get("factor", factor)
        length *= float(factor) if factor is not None else 1.0
    if max_seq_length is not None:
        length = float(max_seq_length)
    default = length
    if any(_kind(rope) == "longrope" for rope in ropes):
        default = float(cfg.get("original_max_position_embeddings") or length)
    return int(length), int(default), bool(present) or max_seq_length is not None


def rope_cache(
    cfg: Mapping[str, Any], head_dim: int, mla: MlaSpec | None, max_pos: int
) -> tuple[int, int, int]:
    """(rotary_dim, cache positions, number of caches) of the rotary cos/sin cache."""
    # transformers 5 keeps rope_scaling and partial_rotary_factor in rope_parameters
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    factor = (
        cfg.get("partial_rotary_factor")
        or scaling.get("partial_rotary_factor")
        or HALF_ROTARY_BY_DEFAULT.get(str(cfg.get("model_type")), 1.0)
    )
    rotary = mla.qk_rope_head_dim if mla else int(head_dim * float(factor))
    local = _local_rope(cfg)
    if isinstance(scaling.get("full_attention"), Mapping):
        scaling = scaling["full_attention"]  # per layer type: the full layers' cache scales
    kind = str(scaling.get("rope_type") or scaling.get("type") or "")
    if kind == "linear":
        # LinearScalingRotaryEmbedding caches max_position x factor positions; Gemma 3's
        # sliding layers keep a second, unscaled cache of their own local theta
        positions = int(max_pos * float(scaling.get("factor") or 1.0))
        return rotary, positions + (max_pos if local else 0), 1
    if local:
        return rotary, max_pos, 2
    multimodal = _mrope_positions(cfg, scaling)
    if kind in ("yarn", "deepseek_yarn"):
        original = int(scaling.get("original_max_position_embeddings") or max_pos)
        return rotary, int(original * float(scaling.get("factor") or 1.0)) * multimodal, 1
    if kind == "longrope":
        original = int(
            cfg.get("original_max_position_embeddings")
            or scaling.get("original_max_position_embeddings")
            or max_pos
        )
        return rotary, original + max_pos, 1
    return rotary, max_pos * multimodal, 1


MROPE_POSITIONS_UNSCALED = frozenset(
    {"qwen3_vl_text", "qwen3_vl_moe_text", "qwen3_5_text", "qwen3_5_moe_text"}
)
"""Text model types whose decoder layers pass ``mrope_positions_factor`` to ``get_rope``:
1 unless video pruning is on (vllm qwen3_vl.py ``mrope_positions_factor``, used by
qwen3_vl.py, qwen3_vl_moe.py and qwen3_5.py)."""


def _mrope_positions(cfg: Mapping[str, Any], scaling: Mapping[str, Any]) -> int:
    """Multimodal rotary positions (``mrope_section``): vLLM's ``get_rope`` builds
    ``MRotaryEmbedding`` with ``mrope_positions_factor=4`` by default, a cache of 4 x the
    positions (a video's position ids run past its token count), but where the model
    passes its own factor."""
    if "mrope_section" not in scaling:
        return 1
    return 1 if str(cfg.get("model_type")) in MROPE_POSITIONS_UNSCALED else 4


def _local_rope(cfg: Mapping[str, Any]) -> bool:
    """Sliding-window layers with a rotary cache of their own (Gemma 3's
    ``rope_local_base_freq``, transformers 5's per-layer-type ``rope_parameters``)."""
    per_type = cfg.get("rope_parameters")
    two = isinstance(per_type, Mapping) and {"sliding_attention", "full_attention"} <= set(per_type)
    return bool(cfg.get("rope_local_base_freq")) or two


def rope_widths(
    cfg: Mapping[str, Any], shapes: Sequence[AttentionShape], head_dim: int = 0
) -> tuple[int, ...]:
    """The width of each layer type's rotary cache where each type has its own
    ``rope_parameters`` and layers their own head_dim (``shapes``; Gemma 4) or all
    ``head_dim`` (Laguna): vLLM's attention builds ``get_rope(head_dim,
    rope_parameters=config.rope_parameters[layer_type])`` for the types its layers have,
    one cache per distinct set, ``head_dim x partial_rotary_factor`` wide (the type's, else
    the config's: laguna.py), except the "proportional" rope (``Gemma4RotaryEmbedding``),
    which spans the whole head and pads the unrotated part. Without ``shapes`` only for
    unscaled ("default") ropes, whose caches all hold the config's positions. () when the
    caches share one width (``rope_cache`` then says it)."""
    per_type, types = cfg.get("rope_parameters"), cfg.get("layer_types")
    if not isinstance(per_type, Mapping) or not isinstance(types, list):
        return ()
    if not shapes:
        ropes = [r for t, r in per_type.items() if t in types]
        if (
            not head_dim
            or not ropes
            or any(not isinstance(r, Mapping) or _kind(r) != "default" for r in ropes)
        ):
            return ()
        shapes = [AttentionShape(head_dim, 1, head_dim)] * len(types)
    dims = {str(t): shapes[i].head_dim for i, t in enumerate(types) if i < len(shapes)}
    caches: dict[tuple[str, int], int] = {}
    for kind, rope in per_type.items():
        if kind not in dims or not isinstance(rope, Mapping):
            continue
        whole = _kind(rope) == "proportional"
        partial = rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor")
        factor = 1.0 if whole else float(partial or 1.0)
        caches[(repr(sorted(rope.items())), dims[kind])] = int(dims[kind] * factor)
    return tuple(caches.values())
