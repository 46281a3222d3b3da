"""How each vLLM quantization config matches a module against the names it lists.

Every function takes the module's vLLM name (``model.layers.0.self_attn.qkv_proj``, see
``module_names``) and ``packed``, the model class's ``packed_modules_mapping``: a fused
module is matched through its checkpoint shards, and vLLM refuses a fused module whose
shards disagree (a ``ModelSpecError`` here). The modes, by config class (vLLM 0.32,
``model_executor/layers/quantization/``):

- ``exact`` (``Fp8Config``, ``FBGEMMFp8Config``, ``Mxfp4Config``): the whole name, or for
  routed experts any listed name containing it (``utils/quant_utils.py:is_layer_skipped``);
  so ``gate`` names the router ``mlp.gate`` and nothing else;
- ``substring`` (AutoAWQ; and GPTQ's ``modules_in_block_to_quantize``, which lists what
  *is* quantized): a listed string anywhere in the name, fused shards expanded;
- ``contains`` (``MoeWNA16Config``): a listed string anywhere in the name, no expansion;
- ``compressed-tensors`` and ``quark``: the exact name or a ``re:`` regex matched from the
  start (``compressed_tensors/utils.py:should_ignore_layer``,
  ``utils/config_utils.py:is_equal_or_regex_match``); Quark also ignores routed experts
  when any child is listed (``quark/utils.py:should_ignore_layer``, ``check_children``);
- ``modelopt``: exact with fused shards, then a plain substring (also after dropping a
  ``language_model.`` prefix), then a shell wildcard (``modelopt.py:is_layer_excluded``);
- ``gptq``: a ``-:`` regex of ``dynamic`` (``utils/gptq_utils.py:get_dynamic_override``)
  or, for ``modules_to_not_convert`` (which vLLM reads from the checkpoint's tensors as
  its unquantized layers), a substring.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatch

from gatekeeper.errors import ModelSpecError

__all__ = ["Packed", "equal_or_regex", "fused_agreement", "override", "shards", "skipped"]

Packed = Mapping[str, Sequence[str]]


def shards(name: str, packed: Packed) -> list[str] | None:
    """The checkpoint shards of a fused module (vLLM's ``prefix.replace(proj, shard)``),
    or None when ``name`` is not fused."""
    proj = name.rsplit(".", 1)[-1]
    if proj not in packed:
        return None
    return [name.replace(proj, shard) for shard in packed[proj]]


def fused_agreement(name: str, results: Iterable[bool], what: str) -> bool:
    """vLLM's rule for a fused module: every shard the same, else it refuses to load."""
    seen = set(results)
    if len(seen) > 1:
        raise ModelSpecError(
            f"quantization_config: the shards of {name} are not all {what} (vLLM requires "
            "all shards of a fused layer to share one scheme and refuses to load it); "
            "list every shard of the fused module or none",
            field="quantization_config",
            value=name,
        )
    return seen.pop() if seen else False


def equal_or_regex(value: str, target: str, *, use_fnmatch: bool = False) -> bool:
    """``is_equal_or_regex_match``: ``re:`` matched from the start, else equality (or a
    shell wildcard with ``use_fnmatch``)."""
    if target.startswith("re:"):
        return re.match(target[3:], value) is not None
    return target == value or (use_fnmatch and fnmatch(value, target))


def _is_layer_skipped(name: str, ignored: Sequence[str], packed: Packed, mode: str) -> bool:
    def match(prefix: str) -> bool:
        if mode == "exact":
            return prefix in ignored
        if mode == "suffix":
            return any(prefix == i or prefix.endswith(f".{i}") for i in ignored)
        return any(i in prefix for i in ignored)

    parts = shards(name, packed)
    if parts is not None:
        return match(name) or fused_agreement(name, map(match, parts), "skipped")
    if "experts" in name and mode == "exact":
        return any(name in i for i in ignored if "experts" in i)
    return match(name)


def _should_ignore(name: str, ignore: Sequence[str], packed: Packed) -> bool:
    if any(equal_or_regex(name, p) for p in ignore):
        return True
    parts = shards(name, packed)
    if parts is None:
        return False
    return fused_agreement(
        name, (any(equal_or_regex(s, p) for p in ignore) for s in parts), "ignored"
    )


def _quark_ignored(name: str, ignore: Sequence[str], packed: Packed, experts: bool) -> bool:
    children = experts and any(
        p == name or p.startswith(name + ".") for p in ignore if not p.startswith("re:")
    )
    return children or _should_ignore(name, ignore, packed)


def _modelopt_excluded(name: str, exclude: Sequence[str], packed: Packed) -> bool:
    if not exclude:
        return False
    if _is_layer_skipped(name, exclude, packed, "exact"):
        return True
    bare = name.removeprefix("language_model.") if name.startswith("language_model.") else None
    for pattern in exclude:
        if pattern != name and (pattern in name or (bare is not None and pattern in bare)):
            return True
    return any(fnmatch(name, p) for p in exclude)


def _gptq_skipped(name: str, patterns: Sequence[str], packed: Packed) -> bool:
    if any(re.match(p[2:], name) for p in patterns if p.startswith("-:")):
        return True
    plain = [p for p in patterns if not p.startswith("-:")]
    return bool(plain) and _is_layer_skipped(name, plain, packed, "substring")


def skipped(
    mode: str, name: str, patterns: Sequence[str], packed: Packed, *, experts: bool = False
) -> bool:
    """Whether the config's ``patterns`` leave module ``name`` unquantized, by ``mode``."""
    if not patterns:
        return False
    if mode in ("exact", "substring", "suffix"):
        return _is_layer_skipped(name, patterns, packed if not experts else {}, mode)
    if mode == "contains":
        return any(p in name for p in patterns)
    if mode == "endswith":  # fp_quant.py: prefix.endswith(module)
        return any(name.endswith(p) for p in patterns)
    if mode == "compressed-tensors":
        return _should_ignore(name, patterns, packed)
    if mode == "quark":
        return _quark_ignored(name, patterns, packed, experts)
    if mode == "modelopt":
        return _modelopt_excluded(name, patterns, packed)
    if mode == "gptq":
        return _gptq_skipped(name, patterns, packed)
    if mode == "bnb":  # bitsandbytes.py:is_layer_skipped_bnb: a component or an ancestor
        parts = name.split(".")
        ancestors = {".".join(parts[: i + 1]) for i in range(len(parts))}
        return any(p in parts or p in ancestors for p in patterns)
    raise ValueError(f"unknown skip-list match mode {mode!r}")


def _ct_target(name: str, targets: Sequence[str], packed: Packed) -> str | None:
    """``find_matched_target`` by name (the class-name step is the caller's default)."""
    for target in targets:
        if equal_or_regex(name, target):
            return target
    fused = next((key for key in packed if name.endswith(key)), None)
    if fused is None:
        return None
    found = [
        next((t for t in targets if equal_or_regex(name.replace(fused, s), t)), None)
        for s in packed[fused]
    ]
    return found[0] if all(found) else None


def _quark_layer(name: str, patterns: Sequence[str]) -> str | None:
    """``get_layer_quant_config_from_name``: the name inside a plain pattern, or a
    shell wildcard."""
    for pattern in patterns:
        if (name in pattern) if "*" not in pattern else fnmatch(name, pattern):
            return pattern
    return None


def _candidates(name: str) -> list[str]:
    out = [name]
    if name.endswith(".lm_head"):
        out.append("lm_head")
    a, b = "language_model.model.", "model.language_model."
    if name.startswith(a):
        out.append(b + name[len(a) :])
    elif name.startswith(b):
        out.append(a + name[len(b) :])
    return out


_FUSED_SHARDS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""``_resolve_quant_algo``'s own shards of the two usual fused projections (its step 4)."""


def _modelopt_layer(name: str, keys: Sequence[str], packed: Packed) -> str | None:
    """``ModelOptMixedPrecisionConfig._resolve_quant_algo``: the key itself, the fused
    module's shards, then a key below the module (routed experts) or beside ``experts``,
    then ``qkv_proj``'s or ``gate_up_proj``'s usual shards beside it (packed or not)."""
    for candidate in _candidates(name):
        if candidate in keys:
            return candidate
    proj = name.rsplit(".", 1)[-1]
    base = name.rsplit(".", 1)[0]
    listed = [
        f"{b}.{s}" for b in _candidates(base) for s in packed.get(proj, ()) if f"{b}.{s}" in keys
    ]
    if listed:
        return listed[0]
    for candidate in _candidates(name):
        found = next((k for k in keys if k.startswith(candidate + ".")), None)
        if found is not None:
            return found
    if name.endswith(".experts"):
        parent = name.rsplit(".experts", 1)[0] + "."
        found = next((k for k in keys if k.startswith(parent)), None)
        if found is not None:
            return found
    # a fused projection the class does not pack (StableLM, GPT-J, Gemma 3's bare model):
    # vLLM looks for q/k/v or gate/up shards beside it whatever packed_modules_mapping says
    for candidate in _candidates(name) if proj in _FUSED_SHARDS else ():
        parent = candidate.rsplit(".", 1)[0]
        listed = [f"{parent}.{s}" for s in _FUSED_SHARDS[proj] if f"{parent}.{s}" in keys]
        if listed:
            return listed[0]
    return None


def override(mode: str, name: str, patterns: Sequence[str], packed: Packed) -> str | None:
    """The pattern of the config's per-module list that names module ``name``, if any."""
    if not patterns:
        return None
    if mode == "compressed-tensors":
        return _ct_target(name, patterns, packed)
    if mode == "quark":
        parts = shards(name, packed)
        if parts is None or parts == [name]:
            return _quark_layer(name, patterns)
        found = [_quark_layer(s, patterns) for s in parts]
        fused_agreement(name, (f is not None for f in found), "listed")
        return found[0]
    if mode == "modelopt":
        return _modelopt_layer(name, patterns, packed)
    if mode == "gptq":
        return next((p for p in patterns if re.match(p.removeprefix("+:"), name)), None)
    return next((p for p in patterns if equal_or_regex(name, p, use_fnmatch=True)), None)
