"""``vllm serve``'s flags for the simulator, from vLLM's own flag table.

The table is package data, ``gatekeeper/data/vllm_flags/<release>.json``, written from
vLLM's argument parser by ``scripts/vllm-flag-table.py``: for every option its
destination, spellings, whether it is a switch, its value grammar, ``nargs``, choices and
default. The simulator reads the file itself (``importlib.resources``) and builds an
argparse parser from it: every spelling, switches with their ``--no-`` forms, ``nargs``,
choices (as the table spells them), defaults, and each value read with the grammar
vLLM's type function has (``human_readable_int``: ``32k`` = 32,000, ``32K`` = 32,768;
``-1``/``auto`` where the flag takes them; ``None`` for optional values; JSON; JSON or a
string). It imports nothing of ``gatekeeper.vllm``, which reads the same file for the
sidecar: the two share vLLM's data, not code.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "Row",
    "build_parser",
    "human_readable_int",
    "human_readable_int_or_auto",
    "option_strings",
    "table",
]

Row = Mapping[str, Any]
"""One flag of the table, as the JSON has it."""


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


@cache
def table(release: str) -> tuple[str, tuple[Row, ...]]:
    """The shipped table of ``release`` (the newest at or before it, else the oldest):
    the vLLM release it was written from and its flags."""
    folder = resources.files("gatekeeper").joinpath("data/vllm_flags")
    names = [p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")]
    shipped = sorted(names, key=_version_key)
    if not shipped:
        raise RuntimeError("no vLLM flag table in gatekeeper/data/vllm_flags; reinstall gatekeeper")
    older = [r for r in shipped if _version_key(r) <= _version_key(release)]
    chosen = older[-1] if older else shipped[0]
    data = json.loads(folder.joinpath(f"{chosen}.json").read_text())
    return str(data["vllm"]), tuple(data["flags"])


def option_strings(rows: Iterable[Row]) -> frozenset[str]:
    """Every spelling of every flag (``--max-model-len``, ``-tp``, ``--no-enforce-eager``)."""
    return frozenset(o for row in rows for o in row["options"])


# The value grammars, as vLLM's type functions read them (vllm/utils/argparse_utils.py,
# vllm/engine/arg_utils.py). argparse names a function in its message: "invalid json value".


def human_readable_int(value: str) -> int:
    """vLLM's sizes: ``1k`` = 1,000, ``1K`` = 1,024, ``25.6k`` = 25,600; no decimals with a
    binary suffix."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "_kmgt".index(suffix)))
        try:
            return int(number) << (10 * "_KMGT".index(suffix))
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean "
                f"to use {number}{suffix.lower()} instead?"
            ) from e
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """``human_readable_int``, or ``-1`` for ``-1``/``auto`` (derive it from the model)."""
    value = value.strip()
    return -1 if value == "-1" or value.lower() == "auto" else human_readable_int(value)


def _json(text: str) -> Any:
    return json.loads(text)


def _json_or_str(text: str) -> Any:
    """vLLM's ``union_dict_and_str``: JSON when it looks like an object, else the text."""
    return json.loads(text) if re.match(r"(?s)^\s*{.*}\s*$", text) else text


_GRAMMARS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "human_int": human_readable_int,
    "human_int_or_auto": human_readable_int_or_auto,
    "float": float,
    "json": _json,
    "json_or_str": _json_or_str,
    "str": str,
}


def _converter(row: Row) -> Callable[[str], Any]:
    convert = _GRAMMARS.get(row["type"], str)
    if not row["optional"]:
        return convert

    def optional(text: str) -> Any:
        return None if text in ("", "None") else convert(text)

    optional.__name__ = getattr(convert, "__name__", "value").lstrip("_")
    return optional


class _Choices(tuple[str, ...]):
    """vLLM's choices as the table spells them: a value is one when its text is (the
    table writes ``None`` and numbers as text)."""

    __slots__ = ()

    def __contains__(self, value: object, /) -> bool:
        return super().__contains__(str(value))


def _default(row: Row, convert: Callable[[str], Any]) -> Any:
    """The table's default as argparse should hold it. A default the table could only
    write as text (a config object's repr) reads as unset: argparse would otherwise run
    it through the flag's grammar."""
    default = row["default"]
    if default == argparse.SUPPRESS:
        return argparse.SUPPRESS  # argparse compares by identity
    if not isinstance(default, str):
        return default
    try:
        return convert(default)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return None


def build_parser(rows: Iterable[Row], *, description: str) -> argparse.ArgumentParser:
    """``vllm serve``'s parser from the table's ``rows``: ``model_tag`` first, then every
    flag. Abbreviations are accepted, as vLLM's argparse accepts them."""
    parser = argparse.ArgumentParser(
        prog="vllm serve", usage="vllm serve [model_tag] [options]", description=description
    )
    parser.add_argument(
        "model_tag", nargs="?", default=None, help="The model tag to serve (or --model)."
    )
    for row in rows:
        _add(parser, row)
    return parser


def _add(parser: argparse.ArgumentParser, row: Row) -> None:
    options, dest, default = row["options"], row["dest"], row["default"]
    help_text = str(row["help"]).replace("%", "%%")
    if row["switch"]:
        said = row.get("negative")  # the table's own from 0.32 (0.33's --disable-x too)
        negative = list(said) if said is not None else [o for o in options if o.startswith("--no-")]
        positive = [o for o in options if o not in negative]
        # A switch without a --no- form that defaults to true is a store_false.
        const = not (default is True and not negative)
        parser.add_argument(
            *positive, dest=dest, action="store_const", const=const, default=default, help=help_text
        )
        if negative:
            parser.add_argument(
                *negative, dest=dest, action="store_const", const=False, default=default
            )
        return
    convert = _converter(row)
    extra: dict[str, Any] = {}
    if row["choices"] is not None:
        extra["choices"] = _Choices(row["choices"])
    if row["nargs"] == "?":
        extra["const"] = True  # the flag alone (--hf-token: the token of `hf auth login`)
    parser.add_argument(
        *options,
        dest=dest,
        type=convert,
        nargs=row["nargs"],
        default=_default(row, convert),
        help=help_text,
        **extra,
    )
