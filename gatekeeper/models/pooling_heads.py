"""The heads a pooling class builds beside its encoder, as vLLM's own build shows them.

vLLM's pooling classes hold more than the encoder: BERT's sequence classifier its pooler
(``bert.pooler.dense``, hidden x hidden) and ``classifier`` (``num_labels`` x hidden),
RoBERTa's ``classifier.dense`` and ``classifier.out_proj``, ModernBERT's ``pooling``
(dense and norm) or its token classifier's ``head``, BERT's MLM head (``mlm_head``: dense,
norm and a ``decoder`` of vocab x hidden of its own), BGE-M3's ``colbert_linear`` and
``sparse_linear``, SigLIP's text ``head``, CLIP's ``text_projection``, Jamba's ``score``.
They are plain linears no quantization config is asked about, whole on every TP rank; the
classifiers in ``ModelConfig.head_dtype`` (float32 for a pooling model,
``config/model.py`` ``_get_head_dtype``), the others in the model dtype. Jamba's sequence
classifier also keeps the causal LM's ``lm_head``, where a class the runner converts
builds none (``adapters.py``, ``_create_pooling_model_cls``).

The names table (``gatekeeper/data/vllm_models/<release>.json``) says of each class vLLM
built as a pooling model ``built.pooling`` and, in ``built.heads``, each head parameter:
its name, each dimension as the config field it follows (``hidden_size``,
``text_config.projection_size``; ``num_labels`` is ``len(id2label)``, as transformers
reads it) or a number, and its dtype (``head``, ``model``). Here the dimensions are read
from the model's config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gatekeeper.models.config_fields import MAX_SIZE, bad_field
from gatekeeper.models.module_names import module_names
from gatekeeper.models.spec import HeadTensor

__all__ = ["pooling_heads", "pooling_lm_head"]

DEFAULT_LABELS = 2
"""transformers' ``PretrainedConfig`` without ``id2label`` or ``num_labels``."""


def _built(architecture: str) -> dict[str, Any]:
    built: dict[str, Any] = module_names(architecture).extra.get("built") or {}
    return built if built.get("pooling") else {}


def pooling_lm_head(architecture: str) -> bool:
    """Whether vLLM's pooling class for ``architecture`` keeps an LM head (Jamba's
    sequence classifier); False where the class is not a pooling one, which a pooling
    runner converts without its head."""
    return bool(_built(architecture).get("lm_head"))


def _field(config: Mapping[str, Any], path: str) -> int | None:
    """The whole number at ``path`` (``text_config.projection_size``), None if absent."""
    *outer, key = path.split(".")
    node: Any = config
    for k in outer:
        node = node.get(k) if isinstance(node, Mapping) else None
    if not isinstance(node, Mapping):
        return None
    value = node.get(key)
    if key == "num_labels" and value is None:
        labels = node.get("id2label")
        value = len(labels) if isinstance(labels, Mapping) and labels else DEFAULT_LABELS
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SIZE:
        raise bad_field(path, value, f"expected a whole number from 1 to {MAX_SIZE:,}")
    return value


def pooling_heads(
    config: Mapping[str, Any], architecture: str
) -> tuple[tuple[HeadTensor, ...], tuple[str, ...]]:
    """The head parameters vLLM's pooling class for ``architecture`` builds, sized from
    ``config``, and a note for any left out because the config lacks a field they
    follow (empty for a class that is not a pooling one)."""
    heads, missing = [], []
    for name, dims, dtype in _built(architecture).get("heads") or ():
        sizes = [d if isinstance(d, int) else _field(config, str(d)) for d in dims]
        if any(s is None for s in sizes):
            missing.append(f"{name} ({', '.join(str(d) for d in dims)})")
            continue
        heads.append(HeadTensor(str(name), math.prod(s for s in sizes if s), str(dtype)))
    notes: tuple[str, ...] = ()
    if missing:
        notes = (
            f"the pooling heads' {'; '.join(missing)} are not counted in the weights: "
            "config.json has no such field",
        )
    return tuple(heads), notes
