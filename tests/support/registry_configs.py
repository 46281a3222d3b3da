"""A config.json for every architecture vLLM registers, from its config class's defaults.

Runs in the vLLM environment (stdlib, transformers, vllm); gatekeeper never imports it::

    .venv-vllm-cpu/bin/python tests/support/registry_configs.py [ARCH ...]   # JSON lines

``config_for(arch)`` answers a config dict (``architectures`` set to the registry name) or
a ``Reason`` saying why there is none offline. The config class is found, in this order:

- transformers' auto model mappings (``MODEL_*_MAPPING_NAMES`` inverted: the class name,
  then the class name case-insensitively) -> the model type -> ``CONFIG_MAPPING``;
- the vLLM module the registry names, when it is a transformers model type or a key of
  vLLM's own ``_CONFIG_REGISTRY`` (``vllm/transformers_utils/configs``).

The class's defaults are kept (on the meta device the full size costs no memory), except
the layer count, cut to the fewest layers that keep every per-layer feature: every value
of each per-layer list (``layer_types``, ``layers_block_type`` ...) and the layers an
interval, period, offset or ``first_k_dense_replace`` puts apart; lists of layer indexes
keep the indexes below the new count. A multimodal config's ``text_config`` is cut the
same way. ``checkpoint_names(config)`` is the checkpoint's module names: transformers'
model class for the config on the meta device, experts fused by transformers 5 written
back per expert as published checkpoints carry them.
"""

from __future__ import annotations

import json
import re
import sys
from functools import cache
from typing import Any

__all__ = ["ARCHITECTURES", "Reason", "checkpoint_names", "config_for", "linear_names"]

MIN_LAYERS = 4
"""The fewest layers a cut config keeps (a dense layer, a sparse one, ...)."""


class Reason(str):
    """Why an architecture has no config offline (a ``str``, so it prints as itself)."""


def _registry() -> dict[str, tuple[str, str]]:
    from vllm.model_executor.models.registry import _VLLM_MODELS  # type: ignore[import-not-found, unused-ignore]

    return dict(_VLLM_MODELS)


@cache
def _model_types() -> dict[str, list[str]]:
    """transformers' model class name -> the model types whose auto mappings name it."""
    from transformers.models.auto import modeling_auto  # type: ignore[import-not-found, unused-ignore]

    out: dict[str, list[str]] = {}
    for name in sorted(vars(modeling_auto)):
        if not (name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES")):
            continue
        for model_type, classes in getattr(modeling_auto, name).items():
            for cls in classes if isinstance(classes, (list, tuple)) else [classes]:
                types = out.setdefault(cls, [])
                if model_type not in types:
                    types.append(model_type)
    return out


ARCHITECTURES: list[str] = []


def architectures() -> list[str]:
    if not ARCHITECTURES:
        ARCHITECTURES.extend(_registry())
    return ARCHITECTURES


_DRAFTER = re.compile(r"(MTP|Eagle|EAGLE|DFlash|DSpark|Peagle|Medusa|MLPSpeculator|Draft)")


def config_class(arch: str) -> tuple[Any, str] | Reason:
    """The config class for ``arch`` and where it was found, or why there is none."""
    from transformers import CONFIG_MAPPING  # type: ignore[import-not-found, unused-ignore]
    from vllm.transformers_utils.config import _CONFIG_REGISTRY  # type: ignore[import-not-found, unused-ignore]

    registry = _registry()
    if arch not in registry:
        return Reason(f"{arch} is not in vLLM's registry")
    module, _ = registry[arch]
    types = _model_types()
    lower = {k.lower(): v for k, v in types.items()}
    if module == "transformers":
        return Reason(
            "Transformers backend class: wraps any transformers model, no config of its own"
        )
    if _DRAFTER.search(arch) or module.endswith(("_mtp", "_eagle", "_eagle3", "_dflash")):
        return Reason(
            "drafter/MTP head: built only beside its target model, not a standalone model"
        )
    for found, how in (
        (types.get(arch), "transformers"),
        (lower.get(arch.lower()), "transformers (case)"),
    ):
        for model_type in found or ():
            if model_type in CONFIG_MAPPING:
                return CONFIG_MAPPING[model_type], f"{how}: {model_type}"
            if model_type in _CONFIG_REGISTRY:
                return _CONFIG_REGISTRY[model_type], f"vLLM: {model_type}"
    found_by_module = _by_module(arch, module)
    if found_by_module is not None:
        return found_by_module
    return Reason(
        f"no config class offline: vLLM module {module!r} is neither a transformers model type "
        "nor in vLLM's config registry (a remote-code family)"
    )


def _by_module(arch: str, module: str) -> tuple[Any, str] | None:
    """The config class the registry's module name says: a transformers model type or a
    key of vLLM's ``_CONFIG_REGISTRY``; for vLLM's own packages (``vllm.models.kimi_k3``)
    the package's name, or the key it starts (``minimax_m3`` -> ``minimax_m3_vl`` for a
    ``*ForConditionalGeneration``)."""
    from transformers import CONFIG_MAPPING  # type: ignore[import-not-found, unused-ignore]
    from vllm.transformers_utils.config import _CONFIG_REGISTRY  # type: ignore[import-not-found, unused-ignore]

    name = module.split(".")[2] if module.startswith("vllm.models.") else module
    if name in _CONFIG_REGISTRY:
        return _CONFIG_REGISTRY[name], f"vLLM: {name}"
    if name in CONFIG_MAPPING:
        return CONFIG_MAPPING[name], f"transformers (module): {name}"
    if name == module:
        return None
    vl = arch.endswith("ForConditionalGeneration")
    for key in sorted(_CONFIG_REGISTRY):
        if key.startswith(f"{name}_") and key.endswith("_vl") == vl and "mtp" not in key:
            return _CONFIG_REGISTRY[key], f"vLLM: {key}"
    return None


_LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
_APART = re.compile(
    r"(first_k_dense_replace|first_k_dense|_period$|_offset$|_interval$|pattern$|"
    r"^decoder_sparse_step$|^moe_layer_freq$|^sparse_step$|^dense_layers$)"
)


def _layer_count(config: dict[str, Any]) -> tuple[str, int] | None:
    for key in _LAYER_COUNTS:
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return key, config[key]
    return None


def _needed(config: dict[str, Any], n: int) -> int:
    """The fewest layers that keep every per-layer feature of a config of ``n`` layers."""
    need = MIN_LAYERS
    for key, value in config.items():
        if isinstance(value, list) and len(value) == n and n > 1:
            firsts: dict[str, int] = {}
            for i, v in enumerate(value):
                firsts.setdefault(json.dumps(v, sort_keys=True), i)
            need = max(need, max(firsts.values()) + 1)
        elif (
            isinstance(value, list) and value and all(type(v) is int and 0 <= v < n for v in value)
        ):
            if key.endswith(("layers", "idxs", "indices", "ids")):
                need = max(need, min(value) + 1)  # one of the listed layers stays
        elif type(value) is int and 0 < value < n and _APART.search(key):
            need = max(need, value + 1)
        elif _per_layer(value, n):
            need = max(need, min(int(k) for k in value) + 1)  # one of the listed layers stays
    return need


def _per_layer(value: Any, n: int) -> bool:
    """A dict keyed by layer index (``per_layer_config``: ``{"05": {...}, "11": ...}``)."""
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(k, str) and k.isdigit() and int(k) < n for k in value)
    )


_NESTED_NOISE = ("_name_or_path", "output_attentions", "transformers_version")
"""What ``to_dict`` writes into a nested config that no checkpoint carries (vLLM's strict
sub-configs refuse it: DBRX's ``attn_config``)."""


def _shrink(config: dict[str, Any], nested: bool = False) -> dict[str, Any]:
    out = {k: v for k, v in config.items() if not (nested and k in _NESTED_NOISE)}
    for key, value in out.items():
        if isinstance(value, dict) and key.endswith("_config"):
            out[key] = _shrink(value, nested=True)
    counted = _layer_count(out)
    if counted is None:
        return out
    key, n = counted
    new = min(n, _needed(out, n))
    if new == n:
        return out
    for k, value in list(out.items()):
        if _per_layer(value, n):
            out[k] = {i: v for i, v in value.items() if int(i) < new}
        elif isinstance(value, list) and len(value) == n:
            out[k] = value[:new]
        elif (
            isinstance(value, list) and value and all(type(v) is int and 0 <= v < n for v in value)
        ) and k.endswith(("layers", "idxs", "indices", "ids")):
            out[k] = [v for v in value if v < new]
    out[key] = new
    return out


@cache
def _config_for(arch: str) -> dict[str, Any] | Reason:
    found = config_class(arch)
    if isinstance(found, Reason):
        return found
    cls, _ = found
    try:
        config = cls().to_dict()
    except Exception as exc:
        return Reason(
            f"{cls.__name__}() failed with its defaults: {type(exc).__name__}: {exc}"[:300]
        )
    for key, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if config.get(key) is None and isinstance(sub, type):
            try:  # a tower left None by the defaults (Gemma 4's vision_config): its defaults
                config[key] = sub().to_dict()
            except Exception:
                continue
    config = _shrink(config)
    _route_tokens(config)
    for drop in ("transformers_version", "_name_or_path", "auto_map", "quantization_config"):
        config.pop(drop, None)
    config["architectures"] = [arch]
    config["torch_dtype"] = "bfloat16"
    out: dict[str, Any] = json.loads(json.dumps(config, default=str))
    return out


PUBLISHED_TOP_K = 6
"""What the published checkpoints of the families whose config class leaves
``num_experts_per_tok`` null set it to (deepseek-moe-16b, DeepSeek-V2, Kimi-VL-A3B: 6)."""


def _route_tokens(config: dict[str, Any]) -> None:
    """Set a null ``num_experts_per_tok`` (here and in nested ``*_config``) as the published
    checkpoints do: vLLM builds experts with a null top_k but cannot route a token with them,
    and gatekeeper refuses such a config naming the field (``test_nested_configs``); the
    matrix compares the structure, which the top_k does not change."""
    if "num_experts_per_tok" in config and config["num_experts_per_tok"] is None:
        config["num_experts_per_tok"] = PUBLISHED_TOP_K
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config"):
            _route_tokens(value)


def config_for(arch: str) -> dict[str, Any] | Reason:
    """``arch``'s config.json (a fresh dict), or a ``Reason`` it has none offline."""
    got = _config_for(arch)
    return got if isinstance(got, Reason) else json.loads(json.dumps(got))


def checkpoint_names(config: dict[str, Any]) -> dict[str, list[int]] | Reason:
    """Every parameter name a checkpoint of ``config`` carries, as transformers' model class
    (the one named in ``architectures``, else the auto causal LM for its type) names it on
    the meta device; experts transformers 5 fuses into 3D tensors are written back per
    expert (``experts.E.gate_proj``/``up_proj``/``down_proj``), as published checkpoints
    (and the quantizers' lists) carry them."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    import transformers  # type: ignore[import-not-found, unused-ignore]
    from transformers import AutoConfig  # type: ignore[import-not-found, unused-ignore]

    arch = config["architectures"][0]
    cls = getattr(transformers, arch, None)
    if cls is None:
        return Reason(f"transformers {transformers.__version__} has no model class {arch}")
    try:
        hf = AutoConfig.for_model(**config)
        with torch.device("meta"):
            model = cls._from_config(hf)
    except Exception as exc:
        return Reason(
            f"transformers' {arch} failed on the meta device: {type(exc).__name__}: {exc}"[:300]
        )
    names: dict[str, list[int]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names |= _per_expert(name, list(param.shape))
    return names


def _per_expert(name: str, shape: list[int]) -> dict[str, list[int]]:
    """A fused 3D expert tensor as the per-expert 2D weights a checkpoint carries."""
    parent, _, leaf = name.rpartition(".")
    parts = {
        "gate_up_proj": ("gate_proj", "up_proj"),
        "down_proj": ("down_proj",),
        "gate_proj": ("gate_proj",),
        "up_proj": ("up_proj",),
    }.get(leaf)
    if len(shape) != 3 or not parent.endswith("experts") or parts is None:
        return {name: shape}
    return {f"{parent}.{e}.{p}.weight": shape[1:] for e in range(shape[0]) for p in parts}


def linear_names(names: dict[str, list[int]]) -> list[str]:
    """The modules of ``names`` a quantizer quantizes: 2D ``.weight`` tensors, less the
    embeddings and norms (the LM head is left to each config's own list)."""
    out = []
    for name, shape in names.items():
        if not name.endswith(".weight") or len(shape) != 2:
            continue
        module = name.removesuffix(".weight")
        leaf = module.rsplit(".", 1)[-1]
        if "embed" in leaf or "norm" in leaf or leaf in ("wte", "wpe", "ln_f"):
            continue
        out.append(module)
    return out


def main(argv: list[str]) -> int:
    for arch in argv or architectures():
        got = config_for(arch)
        row: dict[str, Any] = {"architecture": arch}
        row |= {"reason": str(got)} if isinstance(got, Reason) else {"config": got}
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
