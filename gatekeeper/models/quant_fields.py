"""What every quantization config reader shares: typed reads of a config's fields and
its lists of module names (``quant_formats``, ``quant_groups``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gatekeeper.models.quant_spec import QuantSpec

__all__ = ["SKIP_KEYS", "Config", "config_int", "listed_names", "skip_list", "spec_fields"]

Config = Mapping[str, Any]


def config_int(config: Config, key: str, default: int) -> int:
    value = config.get(key, default)
    return default if value is None else int(value)


def listed_names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return ()


SKIP_KEYS = (
    "modules_to_not_convert",
    "ignored_layers",
    "ignore",
    "llm_int8_skip_modules",
    "exclude_modules",
    "exclude",
)


def skip_list(config: Config, keys: tuple[str, ...] = SKIP_KEYS) -> tuple[str, ...]:
    """The names listed under ``keys``, in order (each config class reads its own)."""
    return tuple(p for key in keys for p in listed_names(config.get(key)))


def spec_fields(spec: QuantSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in QuantSpec.__dataclass_fields__}
