"""The sentence-transformers files beside a checkpoint's ``config.json``, as vLLM reads them.

vLLM looks for them in the model directory (``vllm/transformers_utils/config.py``):

- ``modules.json``: a module of type ``sentence_transformers.models.Pooling`` (or its
  newer path) makes ``get_pooling_config`` return a pooling config, and then
  ``ModelConfig._get_default_runner_type`` serves the model with the pooling runner,
  whatever its architecture (e5-mistral and other ``*ForCausalLM`` embedders);
- ``sentence_bert_config.json`` (or its RoBERTa, DistilBERT, ... siblings): its
  ``max_seq_length`` becomes the model's length (``get_sentence_transformer_tokenizer_config``,
  read by ``_get_and_verify_max_len`` as ``encoder_config``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import ModelSpecError

__all__ = ["POOLING_MODULE_TYPES", "PoolingFiles", "read_pooling_files"]

POOLING_MODULE_TYPES = frozenset(
    {
        "sentence_transformers.models.Pooling",
        "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
    }
)
"""vLLM's ``_ST_POOLING_MODULE_TYPES``."""
ENCODER_CONFIG_FILES = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
"""vLLM's ``sentence_transformer_config_files``, in its order."""


@dataclass(frozen=True, slots=True)
class PoolingFiles:
    """What the sentence-transformers files say that changes memory."""

    pooling: bool
    """``modules.json`` names a Pooling module."""
    max_seq_length: int | None = None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSpecError(
            f"{path.name}: {path} is not valid JSON ({e}); fix or remove the file",
            field=path.name,
            value=str(path),
        ) from e


def _has_pooling(modules: Any, path: Path) -> bool:
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelSpecError(
            f"modules.json: {path} is not a list of modules; sentence-transformers writes "
            '[{"idx": 0, "name": "0", "path": "", "type": "..."}, ...]. Fix or remove it',
            field="modules.json",
            value=str(path),
        )
    return any(m.get("type") in POOLING_MODULE_TYPES for m in modules)


def _max_seq_length(directory: Path) -> int | None:
    for name in ENCODER_CONFIG_FILES:
        path = directory / name
        if not path.is_file():
            continue
        encoder = _json(path)
        if not encoder:
            continue  # vLLM reads the next file when this one is empty
        value = encoder.get("max_seq_length") if isinstance(encoder, dict) else None
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelSpecError(
                f"max_seq_length: {path} says {value!r}; it must be a positive number of "
                "tokens. Fix the file",
                field="max_seq_length",
                value=value if isinstance(value, str | int | float) else repr(value),
            )
        return value
    return None


def read_pooling_files(directory: Path) -> PoolingFiles | None:
    """The sentence-transformers files in ``directory``; None when it has none."""
    modules = directory / "modules.json"
    pooling = modules.is_file() and _has_pooling(_json(modules), modules)
    length = _max_seq_length(directory)
    if not pooling and length is None:
        return None
    return PoolingFiles(pooling=pooling, max_seq_length=length)
