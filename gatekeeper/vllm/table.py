"""vLLM's flag tables: one per shipped release, and how argparse reads a spelling in one.

The table (``gatekeeper/data/vllm_flags/<release>.json``) is generated from vLLM's
argument parser by ``scripts/vllm-flag-table.py``: every option's destination,
spellings, whether it is a switch, its value grammar, ``nargs`` (and the ``const`` of an
optional value: a bare ``--hf-token`` is ``True``), choices and default. A value is read
with the flag's grammar as vLLM's type function reads it (``Flag.value``): vLLM's
human-readable integers (``32k`` = 32,000, ``32K`` = 32,768), ``None`` for optional
values, JSON for config flags, choices as vLLM spells them.

``flag_table(release)`` is the table of a release (the newest shipped one at or before
it). A ``--long`` spelling is read as vLLM's ``FlexibleArgumentParser`` (an argparse
parser with ``allow_abbrev``, after it turns underscores into dashes) reads it: the
option itself when the release has it, else the one option it is a prefix of
(``--max-num-seq`` is ``--max-num-seqs``), and a prefix of several is argparse's
"ambiguous option" error with the candidates (Python's ``argparse._parse_optional`` and
``_get_option_tuples``). A flag the release lacks is an error naming the release and,
when another shipped release has the flag, which one.
"""

from __future__ import annotations

import bisect
import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION, parse_vllm_version

__all__ = [
    "Flag",
    "FlagTable",
    "Grammar",
    "flag_table",
    "human_readable_int",
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
    negative: tuple[str, ...] = ()
    """The spellings of a switch that set it false: ``--no-enforce-eager``; from 0.33
    ``--disable-prefix-caching`` too (vLLM's ``EnableDisableAction``, which still takes
    the hidden ``--no-enable-prefix-caching``)."""

    def sets_false(self, option: str) -> bool:
        """Whether the switch given as ``option`` sets the flag false."""
        return self.switch and option in self.negative

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


_HELP = "--help"
"""vLLM's serve parser has argparse's ``-h/--help`` too (registered first): a prefix of
it counts among the candidates, as in vLLM."""


@dataclass(frozen=True, slots=True, eq=False)
class FlagTable:
    """The flags of one vLLM release (one object per release: compared by identity)."""

    vllm: str
    flags: Mapping[str, Flag]
    """By destination (``max_model_len``)."""
    by_option: Mapping[str, Flag] = field(default_factory=dict)
    """By spelling (``--max-model-len``, ``-tp``, ``--no-enforce-eager``)."""

    def find(self, name: str) -> Flag | None:
        """The flag named by a destination or a spelling, underscores or dashes, a
        ``--long`` spelling (or a key as vLLM's ``--config`` file gives it) perhaps
        abbreviated; None when unknown or ambiguous."""
        if name in self.flags:
            return self.flags[name]
        if not name.startswith("-") and ("." in name or name.replace("-", "_") in self.flags):
            return self.flags.get(name.replace("-", "_"))
        option = self.option_of(name)
        return self.by_option[option] if option is not None else None

    def option_of(self, name: str) -> str | None:
        """The whole spelling ``name`` stands for (``--max-num-seq`` and ``max_num_seq``
        -> ``--max-num-seqs``, ``--no_enforce_eager`` -> ``--no-enforce-eager``); None
        for a destination, an unknown or an ambiguous name."""
        if name in self.flags:
            return None
        if not name.startswith("-"):
            name = "--" + name  # a config file's key: vLLM reads it as --KEY
        head = name.partition(".")[0]
        if head.startswith("--"):
            head = head.replace("_", "-")
        found = self.matches(head)
        return found[0] if len(found) == 1 and found[0] in self.by_option else None

    def matches(self, option: str) -> list[str]:
        """The options argparse may read ``option`` (a spelling without ``=value``) as:
        itself when the release has it (an exact match wins), else every ``--long``
        option it is a prefix of (vLLM's parser allows abbreviations); one-dash
        spellings only exactly here (argparse's own parser reads those)."""
        if option in self.by_option or option == _HELP:
            return [option]
        if not option.startswith("--") or len(option) < 3:
            return []
        spellings = _sorted_spellings(self)
        at = bisect.bisect_left(spellings, option)
        if at == len(spellings) or not spellings[at].startswith(option):
            return []  # no spelling starts so: O(log n), not a scan of every spelling
        return [o for o in (_HELP, *self.by_option) if o.startswith(option)]

    def expand(self, option: str, where: str, token: str | None = None) -> str:
        """``option`` as vLLM's argparse reads it: the whole spelling it abbreviates, or
        itself (exact, or unknown: the caller says so); raises for an ambiguous prefix,
        naming the ``token`` it came in (``--wat=1``) as argparse does."""
        found = self.matches(option)
        if len(found) > 1:
            raise self.ambiguous(option, found, where, token)
        return found[0] if found and found[0] != _HELP else option

    def ambiguous(
        self, option: str, found: list[str], where: str, token: str | None = None
    ) -> ServeOptionsError:
        """argparse's error for a prefix of several options, with the candidates."""
        return ServeOptionsError(
            f"{where}: ambiguous option: {token or option} could match {', '.join(found)}; "
            "give the whole flag",
            field=option,
            value=option,
        )

    def nearest(self, name: str) -> list[str]:
        """The spellings closest to an unknown ``name`` (at most three), a short alias
        with the long form it stands for: ``--tp`` -> ``-tp (--tensor-parallel-size)``
        alone, its letters being the alias's; else the long spellings and the aliases
        (for a name of at most four letters) ranked together by difflib's ratio."""
        letters = name.lstrip("-").partition("=")[0].replace("_", "-")
        shorts = _short_aliases(self)
        alias = "-" + letters
        if alias in shorts:
            return [f"{alias} ({shorts[alias]})"]
        scored: list[tuple[float, str]] = []
        if len(letters) <= 4:  # an alias first among equals (the sort is stable)
            scored += _close(alias, shorts)
        scored += _close("--" + letters, _long_spellings(self))
        scored.sort(key=lambda s: -s[0])
        return [f"{o} ({shorts[o]})" if o in shorts else o for _, o in scored[:3]]

    def unknown(self, name: str, where: str) -> ServeOptionsError:
        """The error for a flag this release does not have: ambiguous (the candidates),
        in another shipped release (which one), or the nearest spellings."""
        key = _spelled(name)
        found = self.matches(key)
        if len(found) > 1:
            return self.ambiguous(key, found, where)
        elsewhere = _elsewhere(self, key)
        near = self.nearest(name)
        hint = f"; did you mean {' or '.join(near)}?" if near and not elsewhere else ""
        return ServeOptionsError(
            f"{where}: {name!r} is not a flag of vllm serve {self.vllm}{elsewhere}{hint}",
            field=name,
            value=name,
        )


def _spelled(name: str) -> str:
    """A name as the ``--long`` spelling vLLM reads (``max_model_len`` -> ``--max-model-len``)."""
    if name.startswith("-") and not name.startswith("--"):
        return name.partition("=")[0]
    head = name.lstrip("-").partition("=")[0].partition(".")[0]
    return "--" + head.replace("_", "-")


def _elsewhere(table: FlagTable, option: str) -> str:
    """Where another shipped release has ``option``: the first later one that has it
    ("it came in vLLM 0.10.2"), else the last earlier one; empty when none has it."""
    if option not in _every_option():
        return ""
    mine = _version_key(table.vllm)
    releases = shipped_releases()
    later = [r for r in releases if _version_key(r) > mine and option in _load(r).by_option]
    if later:
        return (
            f" (it came in vLLM {later[0]}; name that release or a later one as the vLLM "
            "version, or leave the flag out)"
        )
    earlier = [r for r in releases if _version_key(r) < mine and option in _load(r).by_option]
    if earlier:
        return f" (vLLM had it up to {earlier[-1]} at least; leave it out)"
    return ""


@cache
def _every_option() -> frozenset[str]:
    return frozenset(o for r in shipped_releases() for o in _load(r).by_option)


@cache
def _shipped() -> tuple[str, ...]:
    folder = resources.files("gatekeeper").joinpath("data/vllm_flags")
    names = [p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")]
    return tuple(sorted(names, key=_version_key))


@cache
def _sorted_spellings(table: FlagTable) -> tuple[str, ...]:
    """``table``'s spellings and ``--help``, sorted: a prefix's matches are adjacent."""
    return tuple(sorted((_HELP, *table.by_option)))


def _close(typed: str, spellings: Iterable[str]) -> list[tuple[float, str]]:
    """(ratio, spelling) of each of ``spellings`` within difflib's 0.6 of ``typed``, in
    their order: ``difflib.get_close_matches``'s test, scores kept to rank two lists."""
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(typed)
    out = []
    for spelling in spellings:
        matcher.set_seq1(spelling)
        quick = matcher.real_quick_ratio() >= 0.6 and matcher.quick_ratio() >= 0.6
        if quick and (ratio := matcher.ratio()) >= 0.6:
            out.append((ratio, spelling))
    return out


@cache
def _long_spellings(table: FlagTable) -> tuple[str, ...]:
    return tuple(o for o in table.by_option if o.startswith("--"))


@cache
def _short_aliases(table: FlagTable) -> dict[str, str]:
    """``table``'s one-dash spellings and the long one each stands for (``-tp`` ->
    ``--tensor-parallel-size``)."""
    return {o: f.name for o, f in table.by_option.items() if not o.startswith("--")}


def shipped_releases() -> list[str]:
    """The vLLM releases whose flag tables ship with gatekeeper, oldest first."""
    return list(_shipped())


@cache
def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


@lru_cache(maxsize=64)
def flag_table(release: str | None = None) -> FlagTable:
    """The table of ``release`` (the newest shipped one at or before it; the oldest when
    older than every table); ``None`` is the release gatekeeper assumes when none is named
    (``DEFAULT_VLLM_VERSION``). ``release`` is a vLLM version as the estimator reads it
    (``0.8.5``, ``0.11.0rc1``, ``0.8.5 V0``); anything else raises ``ServeOptionsError``
    naming it. A release past the newest table is read with the newest (the estimate
    warns: ``estimator.releases.release_warning``). Remembered per ``release`` (a
    webhook review asks several times)."""
    releases = shipped_releases()
    wanted, _ = parse_vllm_version(release or DEFAULT_VLLM_VERSION)
    older = [r for r in releases if _version_key(r) <= wanted]
    return _load(older[-1] if older else releases[0])


def _negative(row: Mapping[str, Any]) -> list[str]:
    """A row's false-setting spellings: the table's own (written from 0.32 on), else the
    ``--no-`` spellings of a BooleanOptionalAction (every release before 0.33)."""
    if row.get("negative") is not None:
        return list(row["negative"])
    return [o for o in row["options"] if row["switch"] and o.startswith("--no-")]


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
            negative=tuple(_negative(row)),
        )
        for row in data["flags"]
    }
    by_option = {o: f for f in flags.values() for o in f.options}
    return FlagTable(str(data["vllm"]), flags, by_option)
