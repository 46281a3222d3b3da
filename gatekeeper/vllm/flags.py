"""``vllm serve``'s flags given as a mapping, and the estimator's options from flags.

vLLM's own flag table per release and the value grammar are ``gatekeeper.vllm.table``'s
(re-exported here). ``gatekeeper.vllm.serve_args`` reads whole command lines with it;
``serve_values`` gives the same meaning to a mapping (the admin API, settings, plan
files): keys are destinations or spellings (a ``--long`` spelling, or a key as vLLM's
``--config`` file gives it, may be abbreviated as vLLM's argparse allows), values typed
(no float where vLLM takes an integer, no string where it takes a switch). A flag the
release does not have is an error naming the release and the nearest spellings (or the
release that has it). ``serve_options`` keeps what the estimator models.
gatekeeper never imports vLLM.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import CompilationOptions, HfOverrides, MmLimits, ServeOptions
from gatekeeper.estimator.speculative import parse_speculative
from gatekeeper.vllm.table import Flag as Flag
from gatekeeper.vllm.table import FlagTable as FlagTable
from gatekeeper.vllm.table import flag_table as flag_table
from gatekeeper.vllm.table import human_readable_int as human_readable_int
from gatekeeper.vllm.table import shipped_releases as shipped_releases

# The table's names above are re-exported (explicitly, ``X as X``): the doors imported
# them from here before ``gatekeeper.vllm.table`` was split off.
__all__ = [
    "GATEKEEPER_KEYS",
    "MODELLED",
    "model_location",
    "options_from_mapping",
    "options_record",
    "serve_options",
    "serve_values",
]

GATEKEEPER_KEYS = ("vllm_version", "embedded")
"""Serving options that are gatekeeper's own, not vLLM flags."""
MODELLED = tuple(f.name for f in fields(ServeOptions) if f.name not in GATEKEEPER_KEYS)
"""The flags the estimator models today (``ServeOptions``' fields); every other flag is
read and checked only."""


def serve_options(values: Mapping[str, Any]) -> ServeOptions:
    """The estimator's ``ServeOptions`` from flag values (``parse_serve_args`` or
    ``serve_values``): the modelled flags, vLLM's ``-1``/``auto`` max length as unset."""
    picked = {k: values[k] for k in (*MODELLED, *GATEKEEPER_KEYS) if values.get(k) is not None}
    if picked.get("max_model_len") == -1:
        del picked["max_model_len"]
    for name, read in _JSON_OPTIONS.items():
        if name in picked:
            picked[name] = _json_option(name, picked[name], read)
    if picked.get("limit_mm_per_prompt") is not None and not picked["limit_mm_per_prompt"].counts:
        del picked["limit_mm_per_prompt"]  # {}: vLLM's default
    if isinstance(picked.get("cudagraph_capture_sizes"), list):
        picked["cudagraph_capture_sizes"] = tuple(picked["cudagraph_capture_sizes"])
    if "optimization_level" in picked:
        picked["optimization_level"] = str(picked["optimization_level"])
    return ServeOptions(**picked)


def canonical_json(value: object) -> str:
    """A JSON value as one canonical text (sorted keys, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


_JSON_OPTIONS: dict[str, Callable[[Mapping[str, Any], str], Any]] = {
    "speculative_config": parse_speculative,
    "limit_mm_per_prompt": MmLimits.from_mapping,
    "hf_overrides": HfOverrides.from_mapping,
    "compilation_config": CompilationOptions.from_mapping,
}
"""Flags whose values are JSON objects, read into the estimator's typed options here (the
estimator parses no JSON); each keeps its canonical text for the command line."""


def _json_option(name: str, value: Any, read: Callable[[Mapping[str, Any], str], Any]) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return value  # already read (an options object handed back in)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            value = None
    if not isinstance(value, Mapping):
        raise ServeOptionsError(
            f"{name}: give a JSON object, such as '{{\"key\": 1}}'", field=name, value=str(value)
        )
    return read(value, canonical_json(value))


def model_location(options: ServeOptions) -> dict[str, Any]:
    """The look-up's keyword arguments the options carry (``resolve_model``'s
    ``revision``, ``download_dir`` and ``hf_overrides``), only those given: the model as
    the worker will load it."""
    out: dict[str, Any] = {}
    if options.revision:
        out["revision"] = options.revision
    if options.download_dir:
        out["download_dir"] = options.download_dir
    if options.hf_overrides is not None:
        out["hf_overrides"] = json.loads(options.hf_overrides.text)
    return out


def options_record(options: ServeOptions) -> dict[str, Any]:
    """``options`` as a mapping the doors read back (``options_from_mapping``): JSON-valued
    flags as their JSON, lists as lists. For deployment records."""
    out: dict[str, Any] = {}
    for f in fields(ServeOptions):
        value = getattr(options, f.name)
        if hasattr(value, "text"):
            value = json.loads(value.text)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def options_from_mapping(
    data: Mapping[str, Any], *, where: str, release: str | None = None
) -> tuple[ServeOptions, frozenset[str]]:
    """The one door for serving options given as a mapping (the admin API, settings'
    ``[[models]]``, plan files, deployment records): checked with vLLM's grammar, and
    limited to what gatekeeper models, because gatekeeper launches with these options.
    Read with the flags of the release the mapping names (``vllm_version``), else of
    ``release`` (the sidecar's configured version), else the newest shipped table.
    Returns the options and the names given (placement searches TP only when neither
    TP nor PP is among them). Raises ``ServeOptionsError`` naming the field and value."""
    if not isinstance(data, Mapping):
        raise ServeOptionsError(
            f"{where}: options must be a mapping of flags to values, not {type(data).__name__}",
            field="options",
        )
    given = {k: v for k, v in data.items() if v is not None}  # null: not given
    named = given.get("vllm_version")
    table = flag_table(named if isinstance(named, str) else release)
    values = serve_values(given, table, where=where, extra=GATEKEEPER_KEYS)
    unmodelled = sorted(set(values) - set(MODELLED) - set(GATEKEEPER_KEYS))
    if unmodelled:
        first = unmodelled[0]
        raise ServeOptionsError(
            f"{where}: {first} is a vllm serve flag that gatekeeper reads but does not size "
            f"memory for yet, so it cannot launch with it; the flags it launches with are "
            f"{', '.join(MODELLED)}",
            field=first,
            value=values[first],
        )
    return serve_options(values), frozenset(values)


def serve_values(
    data: Mapping[str, Any],
    table: FlagTable | None = None,
    *,
    where: str,
    extra: Iterable[str] = (),
) -> dict[str, Any]:
    """A mapping of flags (destinations or spellings) to typed values, checked with the
    grammar vLLM applies to the same flags on a command line, by destination.

    JSON values must have the flag's type (``null`` means not given, vLLM's default): a switch takes ``true``/``false``; an integer
    flag a whole number (or a string in vLLM's grammar, ``"32k"``), never ``4096.5``, a
    boolean, NaN or infinity; a float flag a finite number; a choice one of vLLM's
    spellings. ``extra`` names keys that are gatekeeper's own and pass through.
    """
    table = table or flag_table()
    allowed_extra = set(extra)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ServeOptionsError(f"{where}: option names are strings, not {key!r}")
        if key in allowed_extra:
            out[key] = value
            continue
        flag = table.find(key)
        if flag is None:
            raise table.unknown(key, where)
        value = _typed(flag, value, where)
        if flag.sets_false(table.option_of(key) or ""):
            value = not value  # {"--no-enforce-eager": true} means enforce_eager false
        out[flag.dest] = value
    return out


def _shown(value: Any) -> str:
    """A value as its sender wrote it: JSON (``true``, ``"no"``, ``["a"]``), not a repr."""
    try:
        return json.dumps(value, allow_nan=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _typed(flag: Flag, value: Any, where: str) -> Any:
    def bad(advice: str) -> ServeOptionsError:
        return ServeOptionsError(
            f"{where}: {flag.dest} = {_shown(value)} is invalid: {advice}",
            field=flag.dest,
            value=value,
        )

    if value is None:
        return None  # null: not given, vLLM's default
    if isinstance(flag.const, bool) and value is flag.const:
        return value  # {"hf_token": true} is a bare --hf-token
    if flag.switch:
        if not isinstance(value, bool):
            raise bad("give true or false")
        return value
    if flag.nargs in ("+", "*") and isinstance(value, list):
        return [_typed(_single(flag), item, where) for item in value]
    if isinstance(value, str):
        try:
            return flag.value(value)
        except ValueError as e:
            raise bad(str(e)) from None
    problem = _type_problem(flag, value)
    if problem:
        raise bad(problem)
    if flag.choices is not None and str(value) not in flag.choices:
        raise bad(f"give one of {', '.join(flag.choices)}")  # a JSON number is checked too
    return float(value) if flag.type == "float" else value


def _type_problem(flag: Flag, value: Any) -> str | None:
    """Why a JSON ``value`` (not a string) does not fit ``flag``, or None."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if flag.type in ("int", "human_int", "human_int_or_auto"):
        whole = number and isinstance(value, int)
        return None if whole else 'give a whole number (vLLM\'s forms such as "32k" also work)'
    if flag.type == "float":
        if not number:
            return "give a number"
        try:
            finite = math.isfinite(float(value))
        except OverflowError:
            finite = False
        return None if finite else "give a finite number"
    if flag.type in ("json", "json_or_str"):
        return None if isinstance(value, dict | list) else "give a JSON object"
    return "give a string"


def _single(flag: Flag) -> Flag:
    return Flag(flag.dest, flag.options, flag.switch, flag.type, flag.optional, None, flag.choices)
