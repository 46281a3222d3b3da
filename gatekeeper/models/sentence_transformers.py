"""The sentence-transformers files beside a checkpoint's ``config.json``, as vLLM reads them.

vLLM looks for them in the model directory (``vllm/transformers_utils/config.py``):

- ``modules.json``: a module of type ``sentence_transformers.models.Pooling`` (or its
  newer path) makes ``get_pooling_config`` return a pooling config, and then
  ``ModelConfig._get_default_runner_type`` serves the model with the pooling runner,
  whatever its architecture (e5-mistral and other ``*ForCausalLM`` embedders);
- ``sentence_bert_config.json`` (or its RoBERTa, DistilBERT, ... siblings): its
  ``max_seq_length`` becomes the model's length (``get_sentence_transformer_tokenizer_config``,
  read by ``_get_and_verify_max_len`` as ``encoder_config``).

Beside them, the tokenizer's ``tokenizer_config.json``: its ``model_max_length`` caps the
length of a pooling model with absolute position embeddings (``ModelConfig.get_and_verify_max_len``
reads it through ``try_get_tokenizer_config`` only when ``runner_type == "pooling"`` and
``hf_config.position_embedding_type == "absolute"``; ``_get_and_verify_max_len`` takes the
smaller of it and the config's length, before a ``max_seq_length`` replaces both).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.errors import ModelSpecError

__all__ = [
    "ENCODER_CONFIG_FILES",
    "POOLING_MODULE_TYPES",
    "TOKENIZER_CONFIG",
    "PoolingFiles",
    "pooling_files",
    "read_pooling_files",
]

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
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True, slots=True)
class PoolingFiles:
    """What the sentence-transformers files say that changes memory."""

    pooling: bool
    """``modules.json`` names a Pooling module."""
    max_seq_length: int | None = None
    tokenizer_max_length: int | None = None
    """``tokenizer_config.json``'s ``model_max_length``: a pooling model with absolute
    positions is served at most this long."""

    def pooling_cap(self, config: Mapping[str, Any], longest: int) -> int | None:
        """The tokenizer's cap on ``longest`` when vLLM runs ``config`` as a pooling model:
        only with absolute positions (``hf_config.position_embedding_type``, the class
        default filled in), only when no ``max_seq_length`` replaces the length anyway,
        and only when it is smaller."""
        cap = self.tokenizer_max_length
        if cap is None or self.max_seq_length is not None or cap >= longest:
            return None
        return cap if config.get("position_embedding_type") == "absolute" else None


Load = Callable[[str], Any]
"""A file beside the config by its name: its parsed JSON, or None when there is no such file."""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSpecError(
            f"{path.name}: {path} is not valid JSON ({e}); fix or remove the file",
            field=path.name,
            value=str(path),
        ) from e


def _has_pooling(modules: Any, path: str) -> bool:
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelSpecError(
            f"modules.json: {path} is not a list of modules; sentence-transformers writes "
            '[{"idx": 0, "name": "0", "path": "", "type": "..."}, ...]. Fix or remove it',
            field="modules.json",
            value=path,
        )
    return any(m.get("type") in POOLING_MODULE_TYPES for m in modules)


def _max_seq_length(load: Load, where: str) -> int | None:
    for name in ENCODER_CONFIG_FILES:
        encoder = load(name)
        if not encoder:
            continue  # absent, or empty: vLLM reads the next file
        value = encoder.get("max_seq_length") if isinstance(encoder, dict) else None
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelSpecError(
                f"max_seq_length: {where}/{name} says {value!r}; it must be a positive number "
                "of tokens. Fix the file",
                field="max_seq_length",
                value=value if isinstance(value, str | int | float) else repr(value),
            )
        return value
    return None


def _tokenizer_max_length(load: Load, where: str) -> int | None:
    """``model_max_length`` of ``tokenizer_config.json`` (transformers writes 10^30 for
    "no limit", which then caps nothing)."""
    tokenizer = load(TOKENIZER_CONFIG)
    value = tokenizer.get("model_max_length") if isinstance(tokenizer, dict) else None
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        raise ModelSpecError(
            f"model_max_length: {where}/{TOKENIZER_CONFIG} says {value!r}; it must be a "
            "positive number of tokens. Fix the file, or remove the key to take the config's "
            "length",
            field="model_max_length",
            value=value if isinstance(value, str | int | float) else repr(value),
        )
    return int(value)


def pooling_files(load: Load, where: str) -> PoolingFiles | None:
    """What the sentence-transformers files and the tokenizer config that ``load`` finds
    say (``where`` names their folder in errors); None when it finds none of them."""
    modules = load("modules.json")
    pooling = modules is not None and _has_pooling(modules, f"{where}/modules.json")
    length = _max_seq_length(load, where)
    tokenizer = _tokenizer_max_length(load, where)
    if not pooling and length is None and tokenizer is None:
        return None
    return PoolingFiles(pooling=pooling, max_seq_length=length, tokenizer_max_length=tokenizer)


def read_pooling_files(directory: Path) -> PoolingFiles | None:
    """The sentence-transformers files and the tokenizer config in ``directory``; None
    when it has none of them."""

    def load(name: str) -> Any:
        path = directory / name
        return _json(path) if path.is_file() else None

    return pooling_files(load, str(directory))
