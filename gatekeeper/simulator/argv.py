"""A ``vllm serve`` command line rewritten as vLLM's ``FlexibleArgumentParser`` rewrites
it before argparse reads it (``vllm/utils/argparse_utils.py``), in its order:

- ``--model MODEL`` (or ``--model=MODEL``) moves to the front as the model tag;
- ``--config FILE.yaml`` (that spelling, once): the file's keys become flags after the
  model and before the rest of the command line, so the command line wins (``true`` a
  switch, ``false`` its ``--no-`` form when there is one, a list its items, a mapping JSON);
- ``--max_model_len`` is ``--max-model-len`` (underscores before the first dot), ``-O3``,
  ``-O=3`` and ``-O 3`` are ``--optimization-level 3``, ``--help=TOPIC`` is ``--help``;
- dotted JSON fields (``--compilation-config.mode 3``, ``--hf-overrides.a.b 1``,
  ``--x.sizes+ 1,2``) merge into one JSON value per flag, each value JSON, else a
  human-readable integer, else text.

What vLLM refuses here it refuses with a ``ValueError`` (a traceback, exit 1), not
argparse's exit 2; so does this module.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any

import yaml

from gatekeeper.simulator.flags import human_readable_int

__all__ = ["rewrite"]

_LEVELS = {"0", "1", "2", "3"}
_NAME = re.compile(r"(?<=--)[^.]*")
"""What lies between the leading ``--`` and the first dot: where underscores become dashes."""


def rewrite(argv: Sequence[str], spellings: Container[str]) -> list[str]:
    """``argv`` (what follows ``vllm serve``) as argparse gets it from vLLM; ``spellings``
    are the parser's option strings (for a config file's ``false``)."""
    args = _model_first(list(argv))
    if "--config" in args:
        args = _with_config(args, spellings)
    return _dotted_merged(_respelled(args))


def _model_first(args: list[str]) -> list[str]:
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            return [args[i + 1], *args[:i], *args[i + 2 :]]
        if arg.startswith("--model="):
            return [arg.removeprefix("--model="), *args[:i], *args[i + 1 :]]
    named = any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)
    config = any(re.match(r"^--config(=.+|$)", a) for a in args)
    if args and args[0].startswith("-") and named and not config:
        raise ValueError(
            "`model` should be provided as the first positional argument when using "
            "`vllm serve`. i.e. `vllm serve <model> --<arg> <value>`."
        )
    return args


def _with_config(args: list[str], spellings: Container[str]) -> list[str]:
    if args.count("--config") > 1:
        raise ValueError("More than one config file specified!")
    i = args.index("--config")
    if i == len(args) - 1:
        raise ValueError("No config file specified! Please check your command-line arguments.")
    from_file = _config_args(args[i + 1], spellings)
    rest = args[:i] + args[i + 2 :]
    if not args[0].startswith("-"):  # the model on the command line wins
        return [args[0], *from_file, *rest[1:]]
    if "--model" not in from_file:
        raise ValueError(
            "No model specified! Please specify model either as a positional argument or in "
            "a config file."
        )
    return [*from_file, *rest]


def _config_args(path: str, spellings: Container[str]) -> list[str]:
    extension = path.split(".")[-1]
    if extension not in ("yaml", "yml"):
        raise ValueError(f"Config file must be of a yaml/yml type. {extension} supplied")
    try:
        config = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"Unable to read the config file at {path}: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"The config file at {path} must hold a mapping of flags to values")
    out: list[str] = []
    for key, value in config.items():
        if isinstance(value, bool):
            if value:
                out.append(f"--{key}")
            elif f"--no-{key}" in spellings:
                out.append(f"--no-{key}")
        elif isinstance(value, list):
            if value:
                out += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out


def _respelled(args: list[str]) -> list[str]:
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            out.append("--help")
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            key = _NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
            out.append(key + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in _LEVELS:
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def _dotted_merged(args: list[str]) -> list[str]:
    out: list[str] = []
    merged: dict[str, dict[str, Any]] = {}
    taken = -1  # the index of a value a dotted field took
    for i, arg in enumerate(args):
        name, eq, text = arg.partition("=")
        if i == taken:
            continue
        if not (arg.startswith("-") and "." in name):
            out.append(arg)
            continue
        if not eq:
            if i + 1 == len(args):
                raise ValueError(f"{name} has no value; give one after it")
            text, taken = args[i + 1], i + 1
        if name.endswith("+"):
            name, text = name[:-1], json.dumps(text.split(","))
        flag, *keys = name.split(".")
        value = _field_value(text)
        for key in reversed(keys):
            value = {key: value}
        _update(merged.setdefault(flag, {}), value)
    for flag, value in merged.items():
        out += [flag, json.dumps(value)]
    return out


def _field_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return human_readable_int(text)  # --x.field 80g
    except (ValueError, argparse.ArgumentTypeError):
        return text


def _update(original: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's recursive merge: mappings merge, lists join, anything else is replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(original.get(key), dict):
            _update(original[key], value)
        elif isinstance(value, list) and isinstance(original.get(key), list):
            original[key] += value
        else:
            original[key] = value
