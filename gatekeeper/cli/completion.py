"""``gatekeeper completion bash|zsh``: a shell completion script generated from the
command's own argparse parser (every command, its options and their choices), plus, for
the serving commands, the ``vllm serve`` flags of the newest flag table.

Install: ``source <(gatekeeper completion bash)`` in ``~/.bashrc``; for zsh,
``gatekeeper completion zsh > "${fpath[1]}/_gatekeeper"`` (or ``source <(...)`` in
``~/.zshrc``). The zsh script is the bash one under zsh's ``bashcompinit``.

Generated here rather than by shtab: shtab is small (shtab 1.13.0's wheel, fetched with
``pip download shtab``: 22,887 bytes, pure Python), but it completes argparse's actions
only, and the serving commands' ~300 vLLM flags are not argparse actions (gatekeeper's
flag table reads them, ``options.split_serving_argv``); this module is shorter than the
glue shtab would need for them, and adds no runtime dependency. argcomplete would run
Python on every TAB.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from gatekeeper.cli.options import SERVING_COMMANDS
from gatekeeper.vllm.flags import flag_table

__all__ = ["add_parser", "script"]


def add_parser(subparsers: Any) -> None:
    c = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for bash or zsh, generated from gatekeeper's "
        "parser: `source <(gatekeeper completion bash)` in ~/.bashrc, or "
        '`gatekeeper completion zsh > "${fpath[1]}/_gatekeeper"`.',
    )
    c.add_argument("shell", choices=("bash", "zsh"), help="the shell the script is for")
    c.set_defaults(func=run_completion)


def run_completion(args: argparse.Namespace, settings: Any) -> int:
    """The script of the whole command: ``root_parser`` is gatekeeper's parser (the
    default ``gatekeeper.cli.entry.build_parser`` sets)."""
    print(script(args.root_parser, args.shell), end="")
    return 0


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def _choices(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    return {
        o: [str(c) for c in a.choices]
        for a in parser._actions
        if a.choices and a.option_strings
        for o in a.option_strings
    }


def _words(words: list[str]) -> str:
    return shlex.quote(" ".join(words))


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (``bash`` or ``zsh``)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    vllm = sorted({f.name for f in flag_table().flags.values()})
    commands: list[str] = list(sub.choices)
    values: list[str] = []
    options: list[str] = []
    for name, command in sub.choices.items():
        positional = [a for a in command._actions if not a.option_strings and a.choices]
        words = _options(command) + [str(c) for a in positional for c in a.choices or ()]
        serving = '" $vllm"' if name in SERVING_COMMANDS else ""
        options.append(f"        {name}) words={_words(words)}{serving} ;;")
        for option, choices in _choices(command).items():
            values.append(f"        {name}:{option}) words={_words(choices)} ;;")
    top = commands + _options(parser)
    body = BASH.format(
        top=_words(top),
        vllm=_words(vllm),
        values="\n".join(values),
        options="\n".join(options),
    )
    return (ZSH_HEAD + body) if shell == "zsh" else body


ZSH_HEAD = """#compdef gatekeeper
autoload -U +X bashcompinit && bashcompinit
"""

BASH = """# gatekeeper completion, generated from its argparse parser (gatekeeper completion)
_gatekeeper() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmd="" words="" i vllm={vllm}
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --config) ((i++)) ;;
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    case "$cmd:$prev" in
{values}
        *:--config|*:--cert|*:--key|*:--download-dir) COMPREPLY=(); return ;;
    esac
    if [[ -n "$words" ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
        return
    fi
    case "$cmd" in
        "") words={top} ;;
{options}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _gatekeeper gatekeeper
"""
