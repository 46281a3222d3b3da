"""A ``config.json`` as vLLM sees it: filled with its transformers config class's defaults.

vLLM loads a config with ``AutoConfig.from_pretrained``, so a field the file leaves out
takes the default of the model type's config class (``Gemma3TextConfig``'s 8 heads of
256 and vocabulary of 262,208; ``LlamaConfig``'s 2,048 positions; ``GPT2Config``'s tied
embeddings). ``class_defaults`` builds that class offline (``AutoConfig.for_model``: no
network, no torch) and adds the fields the file lacks; what the file says always wins, so
the result is read as the plain file would be.

transformers is imported only here and only when a config is filled (about a second;
the catalog's configs are written out whole and never need it). Where transformers has
no class, vLLM's registry may name one of its own (``vllm/transformers_utils/config.py``,
``_CONFIG_REGISTRY``): the aliases of a transformers class are followed (``kimi_k2``,
``deepseek_v32`` -> ``DeepseekV3Config``); vLLM's other classes are not mirrored and
such a config is read as written. A config whose class is remote code (``auto_map``,
``--trust-remote-code``) is also read as written: ``ClassDefaults.remote_code`` names the
class so that a missing field can say where it is defined.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["VLLM_CONFIG_ALIASES", "ClassDefaults", "class_defaults"]

VLLM_CONFIG_ALIASES: dict[str, str] = {"kimi_k2": "deepseek_v3", "deepseek_v32": "deepseek_v3"}
"""Model types vLLM reads with a transformers class under another name
(vllm/transformers_utils/config.py, ``_CONFIG_REGISTRY``: both map to ``DeepseekV3Config``)."""


@dataclass(frozen=True, slots=True)
class ClassDefaults:
    """A config with its class's defaults added, and where they came from."""

    config: dict[str, Any]
    config_class: str = ""
    """The transformers class whose defaults were added ("" when none was)."""
    remote_code: str = ""
    """``auto_map``'s config class when the model defines its config in remote code."""
    note: str = ""
    """Why no defaults were added, when a class exists but refused the config."""


def _merged(written: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` overlaid with ``written`` (nested configs merged key by key)."""
    out = dict(defaults)
    for key, value in written.items():
        below = defaults.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping) and key.endswith("_config"):
            out[key] = _merged(value, below)
        else:
            out[key] = value
    return out


class _NoTorchAdvice(logging.Filter):
    """transformers says at import that PyTorch is absent: configs need none."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "PyTorch was not found" not in record.getMessage()


def _config_mapping() -> Any:
    logging.getLogger("transformers").addFilter(_NoTorchAdvice())
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING


def _remote_class(config: Mapping[str, Any]) -> str:
    auto_map = config.get("auto_map")
    if isinstance(auto_map, Mapping):
        return str(auto_map.get("AutoConfig") or next(iter(auto_map.values()), ""))
    return ""


def class_defaults(config: Mapping[str, Any]) -> ClassDefaults:
    """``config`` with the defaults of its model type's transformers config class."""
    model_type = str(config.get("model_type") or "")
    remote = _remote_class(config)
    if not model_type:
        return ClassDefaults(dict(config), remote_code=remote)
    mapping = _config_mapping()
    name = VLLM_CONFIG_ALIASES.get(model_type, model_type)
    if name not in mapping:
        return ClassDefaults(dict(config), remote_code=remote)
    cls = mapping[name]
    # a copy: config classes rewrite the dicts they are given (rope_scaling)
    fields = copy.deepcopy({k: v for k, v in config.items() if k != "model_type"})
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = cls(**fields).to_dict()
    except Exception as e:  # a third-party class may refuse a config in any way
        why = " ".join(str(e).split())
        note = f"config read as written: transformers' {cls.__name__} refused it ({why})"
        return ClassDefaults(dict(config), remote_code=remote, note=note)
    finally:
        hf_logging.set_verbosity(level)
    return ClassDefaults(_merged(config, _flat(config, built)), config_class=cls.__name__)


def _flat(written: Mapping[str, Any], built: dict[str, Any]) -> dict[str, Any]:
    """A flat config stays flat: the ``text_config`` a composite class builds from it
    (Qwen2.5-VL) gives its defaults to the top level, whose model type is kept."""
    text = built.get("text_config")
    if "text_config" in written or not isinstance(text, Mapping):
        return built
    inner = {k: v for k, v in text.items() if k != "model_type"}
    return {**{k: v for k, v in built.items() if k != "text_config"}, **inner}
