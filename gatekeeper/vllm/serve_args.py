"""A ``vllm serve`` command line read as vLLM's ``FlexibleArgumentParser`` reads it, over
vLLM's own flag table (``gatekeeper.vllm.flags``):

- ``vllm serve MODEL`` or ``--model MODEL``; a leading ``vllm``/``serve`` is optional;
- ``--config FILE.yaml`` (that spelling, once): its keys become flags, placed after the model and before the
  command line's own (the command line wins), switches from booleans (``--no-`` for
  false), JSON from nested mappings;
- underscores or dashes in names (``--max_model_len``), ``--flag=value``, ``-O3``;
- a ``--long`` flag abbreviated as argparse allows (``--max-num-seq 8``,
  ``--gpu-memory-util=0.8``; exact spellings win; a prefix of several flags is
  argparse's "ambiguous option" error with the candidates);
- dotted JSON fields (``--compilation-config.mode 3``, ``--hf-overrides.a.b 1``),
  merged into one JSON value per flag;
- each value with its flag's grammar, a bare ``nargs='?'`` flag as its ``const``
  (``--hf-token`` alone is ``True``); an unknown flag is an error naming the nearest
  spellings.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.vllm.flags import Flag, FlagTable, flag_table, human_readable_int

__all__ = ["ServeCommand", "model_first", "parse_serve_args"]


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """A ``vllm serve`` command line as vLLM reads it."""

    model: str | None
    values: Mapping[str, Any]
    """The flags given (by destination), with vLLM's values; defaults are not here."""
    vllm: str


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise ServeOptionsError(f"vllm serve: {message}")


@cache
def _argparser(table: FlagTable) -> _Parser:
    parser = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    parser.add_argument("model_tag", nargs="?", default=None)
    for flag in table.flags.values():
        if flag.switch:
            positive = [o for o in flag.options if not flag.sets_false(o)]
            negative = [o for o in flag.options if flag.sets_false(o)]
            parser.add_argument(*positive, dest=flag.dest, action="store_const", const=True)
            if negative:
                parser.add_argument(*negative, dest=flag.dest, action="store_const", const=False)
        else:
            parser.add_argument(*flag.options, dest=flag.dest, nargs=flag.nargs, const=flag.const)
    parser.set_defaults(**dict.fromkeys(table.flags))
    return parser


def parse_serve_args(
    argv: Sequence[str], table: FlagTable | None = None, *, where: str = "vllm serve"
) -> ServeCommand:
    """``argv`` (what follows ``vllm serve``, or the whole command line) as vLLM reads it.

    Raises ``ServeOptionsError`` naming the flag and the value: an unknown flag (with the
    nearest spellings), a value outside the flag's grammar or choices, a missing value.
    """
    table = table or flag_table()
    args = model_first(argv)
    if args.count("--config") > 1:
        raise ServeOptionsError(f"{where}: more than one --config file; vLLM takes one")
    if "--config" in args:
        args = _with_config_file(args, table)
    args = _whole_spellings(_normalised(args, table, where), table, where)
    if not args or (len(args) == 1 and not args[0].startswith("-")):
        # no flags: what argparse would read, without building vLLM's parser (~500 flags)
        return ServeCommand(model=args[0] if args else None, values={}, vllm=table.vllm)
    ns, unknown = _argparser(table).parse_known_args(args)
    if unknown:
        raise _unread(unknown, args, table, where)
    values: dict[str, Any] = {}
    for dest, raw in vars(ns).items():
        if dest == "model_tag" or raw is None:
            continue
        flag = table.flags[dest]
        value = raw if flag.switch else _read(flag, raw, where)
        if value is not None:  # an optional flag set to None is vLLM's default
            values[dest] = value
    from_flag = values.pop("model", None)
    model = ns.model_tag or from_flag
    values.pop("config", None)
    if model is None and "--config" in argv:  # vLLM's _pull_args_from_config says so too
        raise ServeOptionsError(
            f"{where}: no model specified; name it first (vllm serve MODEL) or as `model:` "
            "in the --config file",
            field="model",
        )
    return ServeCommand(model=model, values=values, vllm=table.vllm)


def _unread(unknown: list[str], args: list[str], table: FlagTable, where: str) -> ServeOptionsError:
    """The error for what argparse left: an unknown flag (the first), else a stray word
    (after ``--`` a flag's spelling is a word too)."""
    words = set(args[args.index("--") + 1 :]) if "--" in args else set()
    first = next((u for u in unknown if u.startswith("-") and u not in words), unknown[0])
    if not first.startswith("-") or first in words:
        return ServeOptionsError(
            f"{where}: unexpected argument {first!r}; the model goes first, once",
            field="model",
            value=first,
        )
    return table.unknown(first.split("=", 1)[0], where)


def _read(flag: Flag, raw: Any, where: str) -> Any:
    if not isinstance(raw, str | list):
        return raw  # a bare nargs='?' flag: its const, which vLLM's argparse does not convert
    try:
        if isinstance(raw, list):
            return [flag.value(item) for item in raw]
        return flag.value(raw)
    except ValueError as e:
        raise ServeOptionsError(
            f"{where}: {flag.name} {raw!r}: {e}", field=flag.dest, value=raw
        ) from None


def model_first(argv: Sequence[str]) -> list[str]:
    """``argv`` without a leading ``vllm serve`` (or ``/usr/bin/vllm serve``), and with
    ``--model MODEL`` / ``--model=MODEL`` moved to the front, as vLLM moves it."""
    args = list(argv)
    while args and (args[0] in ("vllm", "serve") or args[0].endswith("/vllm")):
        args = args[1:]
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            return [args[i + 1], *args[:i], *args[i + 2 :]]
        if arg.startswith("--model="):
            return [arg.removeprefix("--model="), *args[:i], *args[i + 1 :]]
    return args


def _with_config_file(args: list[str], table: FlagTable) -> list[str]:
    """vLLM's ``--config FILE.yaml``: the file's flags after the model, before the rest."""
    i = args.index("--config")  # vLLM expands only this spelling, not --config=FILE
    if i + 1 >= len(args):
        raise ServeOptionsError("--config: no file given; pass a YAML file of flags")
    path, rest = args[i + 1], args[:i] + args[i + 2 :]
    from_file = _config_args(Path(path), table)
    if rest and not rest[0].startswith("-"):
        return [rest[0], *from_file, *rest[1:]]
    return [*from_file, *rest]


def _config_args(path: Path, table: FlagTable) -> list[str]:
    if path.suffix not in (".yaml", ".yml"):
        raise ServeOptionsError(
            f"--config: {str(path)!r} must be a .yaml or .yml file (vLLM reads only YAML)",
            field="config",
            value=str(path),
        )
    import yaml  # only for --config: not loaded on every start of the CLI (#39)

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ServeOptionsError(
            f"--config: {str(path)!r} cannot be read as YAML ({e})", field="config", value=str(path)
        ) from e
    if not isinstance(data, dict):
        raise ServeOptionsError(
            f"--config: {str(path)!r} must hold a mapping of flags to values",
            field="config",
            value=str(path),
        )
    out: list[str] = []
    for key, value in data.items():
        name = f"--{key}"
        if isinstance(value, bool):
            negative = f"--no-{key}"
            if value:
                out.append(name)
            elif negative in table.by_option:  # vLLM looks the spelling up as written
                out.append(negative)
        elif isinstance(value, list):
            if value:
                out += [name, *map(str, value)]
        elif isinstance(value, dict):
            out += [name, json.dumps(value)]
        else:
            out += [name, str(value)]
    return out


def _normalised(args: list[str], table: FlagTable, where: str) -> list[str]:
    """Dashes for underscores in names, ``-O3``, and dotted JSON fields merged."""
    out: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, rest = key[2:].partition(".")
            key = "--" + head.replace("_", "-") + dot + rest
            arg = key + eq + value
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2:3] == "=" else arg[2:]
            out += ["--optimization-level", level]
            i += 1
            continue
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in ("0", "1", "2", "3"):
            arg = "--optimization-level"
        if arg.startswith("-") and "." in arg.partition("=")[0]:
            name, eq, text = arg.partition("=")
            if not eq:
                if i + 1 >= len(args):
                    raise ServeOptionsError(f"{where}: {name} needs a value", field=name)
                text, i = args[i + 1], i + 1
            _merge_dotted(dotted, name, text)
        else:
            out.append(arg)
        i += 1
    for flag_name, fields in dotted.items():
        out += [flag_name, json.dumps(fields)]
    return out


def _whole_spellings(args: list[str], table: FlagTable, where: str) -> list[str]:
    """Each ``--long`` option as the whole spelling it abbreviates, as vLLM's argparse
    reads it (``allow_abbrev``: ``--max-num-seq 8`` is ``--max-num-seqs 8``, exact
    spellings win, a prefix of several is argparse's "ambiguous option" error); after
    ``--`` everything is a value, as in argparse. One-dash options are argparse's own
    (``_argparser`` reads them as vLLM's parser does)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = table.expand(name, where, arg) + eq + value
        out.append(arg)
    return out


def _merge_dotted(dotted: dict[str, dict[str, Any]], name: str, text: str) -> None:
    if name.endswith("+"):
        name, text = name[:-1], json.dumps(text.split(","))
    key, *keys = name.split(".")
    value: Any
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        try:
            value = human_readable_int(text)
        except ValueError:
            value = text
    node = dotted.setdefault(key, {})
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}  # a later, deeper field replaces a value, as vLLM merges
        node = node[k]
    old = node.get(keys[-1])
    if isinstance(old, list) and isinstance(value, list):
        value = old + value  # repeated `+` lists are joined, as vLLM joins them
    node[keys[-1]] = value
