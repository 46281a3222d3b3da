"""``vllm serve``'s flags and their value grammar, from vLLM's own flag table.

The table (``gatekeeper/data/vllm_flags/<release>.json``) is generated from vLLM's
argument parser by ``scripts/vllm-flag-table.py``: every option's destination,
spellings, whether it is a switch, its value grammar, ``nargs`` (and the ``const`` of an
optional value: a bare ``--hf-token`` is ``True``), choices and default.
gatekeeper never imports vLLM. A value is read with the flag's grammar as vLLM's type
function reads it: vLLM's human-readable integers (``32k`` = 32,000, ``32K`` = 32,768,
``1.5k`` = 1,500, no decimals with a binary suffix, ``-1``/``auto`` where the flag
takes them), ``None`` for optional values, JSON for config flags, choices as vLLM spells
them. ``gatekeeper.vllm.serve_args`` reads whole command lines with it;
``serve_values`` gives the same meaning to a mapping (the admin API, settings, plan
files): keys are destinations or spellings, values typed (no float where vLLM takes an
integer, no string where it takes a switch). A flag vLLM does not have is an error
that names the nearest spellings. ``serve_options`` keeps what the estimator models.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimate.options import CompilationOptions, HfOverrides, MmLimits, ServeOptions
from gatekeeper.estimate.speculative import parse_speculative

__all__ = [
    "GATEKEEPER_KEYS",
    "MODELLED",
    "Flag",
    "FlagTable",
    "flag_table",
    "human_readable_int",
    "model_location",
    "options_from_mapping",
    "options_record",
    "serve_options",
    "serve_values",
    "shipped_releases",
]

Grammar = Literal[
    "bool", "int", "human_int", "human_int_or_auto", "float", "str", "json", "json_or_str"
]


@dataclass(frozen=True, slots=True)
class Flag:
    """One option of ``vllm serve`` as vLLM's parser defines it."""

    dest: str
    options: tuple[str, ...]
    switch: bool
    type: Grammar
    optional: bool = False
    """``None`` (the text) is a value: the flag can be unset explicitly."""
    nargs: str | int | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None
    help: str = ""
    const: Any = None
    """What an ``nargs='?'`` flag given with no value stands for (vLLM's ``--hf-token``
    alone is ``True``: use the stored token); ``None`` when it has none."""

    @property
    def name(self) -> str:
        """The long spelling: ``--max-model-len``."""
        return next((o for o in self.options if o.startswith("--")), self.options[0])

    def value(self, text: str) -> Any:
        """``text`` read with the flag's grammar; ``ValueError`` says why not."""
        if self.optional and text in ("", "None"):
            return None
        try:
            value = self._convert(text)
        except ValueError as e:
            raise ValueError(_GRAMMAR_HINTS.get(self.type, str(e))) from e
        if self.choices is not None and str(value) not in self.choices:
            near = difflib.get_close_matches(text.lower(), self.choices, n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise ValueError(f"{text!r} is not one of {', '.join(self.choices)}{hint}")
        return value

    def _convert(self, text: str) -> Any:
        kind = self.type
        if kind in ("human_int", "human_int_or_auto"):
            if kind == "human_int_or_auto" and text.strip().lower() in ("-1", "auto"):
                return -1
            return human_readable_int(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind in ("json", "json_or_str"):
            try:
                return json.loads(text)
            except RecursionError:
                raise ValueError("JSON nested too deeply") from None
            except json.JSONDecodeError:
                if kind == "json_or_str":
                    return text
                raise ValueError(f"{text!r} is not JSON") from None
        return text


_GRAMMAR_HINTS = {
    "int": "give a whole number",
    "human_int": "give a whole number, or one with vLLM's suffixes: 32k = 32,000, "
    "32K = 32,768, 20G = 20 x 2^30 (no 'GiB', no decimals with K, M, G, T)",
    "human_int_or_auto": "give a whole number (32k = 32,000, 32K = 32,768), or auto / -1",
    "float": "give a number",
    "json": "give JSON, such as '{\"key\": 1}'",
}


def human_readable_int(text: str) -> int:
    """vLLM's ``human_readable_int``: ``1k`` = 1,000, ``1K`` = 1,024, ``25.6k`` = 25,600;
    a binary suffix takes no decimals."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            try:
                return int(float(number) * 10 ** (3 * " kmgt".index(suffix)))
            except OverflowError:
                raise ValueError(f"{text!r} is too large") from None
        if "." in number:
            raise ValueError(
                f"decimals are not allowed with binary suffixes like {suffix}; "
                f"did you mean {number}{suffix.lower()}?"
            )
        return int(number) * (1 << (10 * " KMGT".index(suffix)))
    return int(value)


@dataclass(frozen=True, slots=True, eq=False)
class FlagTable:
    """The flags of one vLLM release (one object per release: compared by identity)."""

    vllm: str
    flags: Mapping[str, Flag]
    """By destination (``max_model_len``)."""
    by_option: Mapping[str, Flag] = field(default_factory=dict)
    """By spelling (``--max-model-len``, ``-tp``, ``--no-enforce-eager``)."""

    def find(self, name: str) -> Flag | None:
        """The flag named by a destination or a spelling, underscores or dashes."""
        if name in self.flags:
            return self.flags[name]
        if name.startswith("-"):
            head = name.partition(".")[0]
            return self.by_option.get(head.replace("_", "-") if head.startswith("--") else head)
        return self.flags.get(name.replace("-", "_"))

    def nearest(self, name: str) -> list[str]:
        """The spellings closest to an unknown ``name`` (at most three)."""
        key = "--" + name.lstrip("-").replace("_", "-")
        spellings = [o for o in self.by_option if o.startswith("--")]
        return difflib.get_close_matches(key, spellings, n=3, cutoff=0.6)

    def unknown(self, name: str, where: str) -> ServeOptionsError:
        near = self.nearest(name)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        return ServeOptionsError(
            f"{where}: {name!r} is not a flag of vllm serve {self.vllm}{hint}",
            field=name,
            value=name,
        )


@cache
def _shipped() -> tuple[str, ...]:
    folder = resources.files("gatekeeper").joinpath("data/vllm_flags")
    names = [p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")]
    return tuple(sorted(names, key=_version_key))


def shipped_releases() -> list[str]:
    """The vLLM releases whose flag tables ship with gatekeeper, oldest first."""
    return list(_shipped())


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def flag_table(release: str | None = None) -> FlagTable:
    """The table of ``release`` (the newest shipped one at or before it; the newest of
    all when ``None`` or older than every table)."""
    releases = shipped_releases()
    chosen = releases[-1]
    if release is not None:
        older = [r for r in releases if _version_key(r) <= _version_key(release)]
        chosen = older[-1] if older else releases[0]
    return _load(chosen)


@cache
def _load(chosen: str) -> FlagTable:
    path = resources.files("gatekeeper").joinpath(f"data/vllm_flags/{chosen}.json")
    data = json.loads(path.read_text())
    flags = {
        row["dest"]: Flag(
            dest=row["dest"],
            options=tuple(row["options"]),
            switch=row["switch"],
            type=row["type"],
            optional=row["optional"],
            nargs=row["nargs"],
            choices=tuple(row["choices"]) if row["choices"] is not None else None,
            default=row["default"],
            help=row["help"],
            const=row["const"],
        )
        for row in data["flags"]
    }
    by_option = {o: f for f in flags.values() for o in f.options}
    return FlagTable(str(data["vllm"]), flags, by_option)


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
    Returns the options and the names given (placement searches TP only when neither
    TP nor PP is among them). Raises ``ServeOptionsError`` naming the field and value."""
    if not isinstance(data, Mapping):
        raise ServeOptionsError(
            f"{where}: options must be a mapping of flags to values, not {type(data).__name__}",
            field="options",
        )
    given = {k: v for k, v in data.items() if v is not None}  # null: not given
    values = serve_values(given, flag_table(release), where=where, extra=GATEKEEPER_KEYS)
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
        if flag.switch and isinstance(key, str) and key.lstrip("-").startswith("no-"):
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
