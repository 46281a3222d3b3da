"""The help of the serving commands (``estimate``, ``check``, ``deploy``), in the style
of ``vllm serve``'s (``FlexibleArgumentParser.format_help`` in vLLM's
``vllm/utils/argparse_utils.py``): ``--help`` summarises the groups, with the flags
gatekeeper models listed; ``--help=all`` shows every flag; ``--help=GROUP`` one group;
``--help=WORD`` the flags whose spelling contains the word (``--help=kv-cache``).

vLLM groups its flags by config class (``ModelConfig``, ``CacheConfig``, ...); the flag
table gatekeeper ships does not keep those, so the groups here say what gatekeeper does
with a flag: ``modelled`` (in the memory estimate, ``gatekeeper.vllm.flags.MODELLED``),
``model-source`` (where the model is found), ``checked`` (read and checked as vLLM would,
not modelled), and ``gatekeeper`` (the command's own options).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Collection, Sequence

from gatekeeper.models.source import MODEL_SOURCE_FLAGS
from gatekeeper.vllm.flags import MODELLED, flag_table
from gatekeeper.vllm.table import Flag, FlagTable

__all__ = ["GROUPS", "group_flags", "overview", "release_in", "search_help"]

GROUPS = {
    "modelled": "vllm serve flags gatekeeper models in its memory estimate",
    "model-source": "vllm serve flags that say where the model comes from",
    "checked": "every other vllm serve flag: read and checked, not modelled",
    "gatekeeper": "this command's own options",
}
"""The groups ``--help=GROUP`` shows, with what each holds."""


def group_flags(table: FlagTable) -> dict[str, list[Flag]]:
    """The release's flags by group (``modelled``, ``model-source``, ``checked``)."""
    modelled = [d for d in MODELLED if d not in MODEL_SOURCE_FLAGS]
    source = [d for d in MODEL_SOURCE_FLAGS if d in table.flags]
    used = {*modelled, *source}
    return {
        "modelled": [table.flags[d] for d in modelled if d in table.flags],
        "model-source": [table.flags[d] for d in source],
        "checked": sorted(
            (f for d, f in table.flags.items() if d not in used), key=lambda f: f.name
        ),
    }


def overview(table: FlagTable) -> str:
    """The epilog of ``--help``: the groups, and the modelled flags by name."""
    groups = group_flags(table)
    modelled = ", ".join(f.name for f in groups["modelled"])
    lines = [
        f"vllm serve flags (vLLM {table.vllm}'s {len(table.flags)}): any is accepted as vLLM "
        "reads it",
        "(--max-model-len 32k, --max_model_len, -tp 2, --config FILE.yaml), and a whole pasted",
        "`vllm serve MODEL ...` command line works too.",
        "",
        "Groups (--help=GROUP shows one, --help=all every flag, --help=WORD the flags",
        "whose name contains WORD):",
        *(f"  {name:<13}{text} ({_count(name, groups)})" for name, text in GROUPS.items()),
        "",
        textwrap.fill(f"Modelled: {modelled}.", width=88, break_on_hyphens=False),
    ]
    return "\n".join(lines)


def _count(name: str, groups: dict[str, list[Flag]]) -> str:
    return f"{len(groups[name])} flags" if name in groups else "above"


def search_help(parser: argparse.ArgumentParser, keyword: str, argv: Sequence[str]) -> str:
    """``--help=KEYWORD``'s text for a serving command's ``parser``: ``all``, a group,
    or the flags whose spelling contains the keyword (vLLM's order of trying)."""
    table = flag_table(release_in(argv))
    groups = group_flags(table)
    wanted = keyword.lower().replace("_", "-")
    own = [a for a in parser._actions if a.option_strings and "-h" not in a.option_strings]
    formatter = parser._get_formatter()
    if wanted == "all":
        _section(formatter, "gatekeeper", GROUPS["gatekeeper"], own)
        for name, flags in groups.items():
            _section(formatter, name, GROUPS[name], _actions(flags))
    elif wanted == "gatekeeper":
        _section(formatter, wanted, GROUPS[wanted], own)
    elif wanted in groups:
        _section(formatter, wanted, GROUPS[wanted], _actions(groups[wanted]))
    else:
        flags = [f for f in table.flags.values() if any(wanted in o.lower() for o in f.options)]
        matched = [a for a in own if any(wanted in o for o in a.option_strings)]
        modelled = {f.dest for f in groups["modelled"]}
        matched += _actions(flags, mark=modelled)
        if not matched:
            formatter.add_text(
                f"No group or flag matching '{keyword}'. Use --help to see the groups "
                "or --help=all to see every flag."
            )
            return formatter.format_help()
        _section(formatter, f"Flags matching '{wanted}'", None, matched)
    return formatter.format_help()


def _section(
    formatter: argparse.HelpFormatter,
    title: str,
    text: str | None,
    actions: Sequence[argparse.Action],
) -> None:
    formatter.start_section(title)
    formatter.add_text(text)
    formatter.add_arguments(actions)
    formatter.end_section()


def _actions(flags: Sequence[Flag], mark: Collection[str] = ()) -> list[argparse.Action]:
    """Flags as argparse actions, for argparse's formatter (nothing parses with them);
    those named in ``mark`` say [modelled]."""
    out: list[argparse.Action] = []
    for f in flags:
        text = ("[modelled] " if f.dest in mark else "") + (f.help or "")
        if f.default not in (None, "", [], {}):
            text += f" (default: {f.default})"
        out.append(
            argparse.Action(
                list(f.options),
                dest=f.dest,
                nargs=0 if f.switch else None,
                help=text.replace("%", "%%") or None,
                metavar=None if f.switch else f.dest.upper(),
            )
        )
    return out


def release_in(argv: Sequence[str]) -> str | None:
    """The ``--vllm-version`` a command line gives, if any."""
    for i, token in enumerate(argv):
        if token == "--vllm-version" and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--vllm-version="):
            return token.partition("=")[2]
    return None
