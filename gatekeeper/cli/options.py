"""Command-line flags shared by ``estimate``, ``check`` and ``deploy``: any ``vllm serve``
flag, read by vLLM's own flag table (``gatekeeper.vllm.flags``), next to gatekeeper's own.

``gatekeeper estimate MODEL --max_model_len 32k -tp 2 --gpu H100-80GB`` and a pasted
``gatekeeper estimate vllm serve MODEL ...`` both work: ``split_serving_argv`` hands
gatekeeper's own options (and the model) to argparse and every other token to vLLM's
grammar, with each vLLM flag's arity from the table, so that a value is never taken for
the model. The flags are read with the table of the vLLM release the command names
(``--vllm-version``, else the settings' ``default_vllm_version``), abbreviations as
vLLM's argparse reads them; a flag that release does not have ends the command with exit
code 2, naming the release and the nearest spellings (or the release that has it). The
model may come from a ``--config`` file's ``model:``, as in vLLM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from gatekeeper.cli.output import UsageError
from gatekeeper.cli.serving_help import release_in
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.models.source import MODEL_SOURCE_FLAGS
from gatekeeper.models.spec import ModelSpec
from gatekeeper.settings import Settings, model_resolver
from gatekeeper.vllm.flags import MODELLED, flag_table, serve_options
from gatekeeper.vllm.serve_args import ServeCommand, model_first, parse_serve_args

__all__ = [
    "SERVING_COMMANDS",
    "add_serving_flags",
    "model_from_args",
    "note_unmodelled",
    "options_from_args",
    "positive_int",
    "serve_command",
    "split_serving_argv",
]

SERVING_COMMANDS = ("estimate", "check", "deploy")
"""The commands that take ``vllm serve`` flags."""


def positive_int(flag: str) -> Any:
    """An argparse type: a positive integer (underscores and commas allowed)."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} must be a positive integer")
        return value

    return parse


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """gatekeeper's own serving options; every ``vllm serve`` flag comes in beside them
    (``split_serving_argv``)."""
    p.add_argument("--vllm-version", default=None, help="accounting to follow (default: settings)")
    p.add_argument(
        "--embedded",
        action="store_true",
        help="vLLM's LLM class inside a process that already used CUDA (a notebook)",
    )
    p.set_defaults(vllm_argv=[])
    # the epilog lists the vLLM flags by group (serving_help.overview), set when the
    # command is parsed: its text, kept as written
    p.formatter_class = argparse.RawDescriptionHelpFormatter


def split_serving_argv(
    command: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[list[str], list[str]]:
    """(gatekeeper's tokens, vLLM's tokens) of one serving command's arguments.

    gatekeeper's tokens are its own options (those ``command`` defines, spelled whole,
    with their values; ``--config`` only with a ``.toml`` file, gatekeeper's settings,
    a YAML one being vLLM's) and the model (the first bare token, after an optional ``vllm
    serve``); everything else is ``vllm serve``'s, each flag taking as many values as
    the table of the ``--vllm-version`` given (else the newest) says it takes."""
    own_options = {
        o: a for a in command._actions for o in a.option_strings if o not in ("-h", "--help")
    }
    table = flag_table(release_in(argv))
    args = model_first(argv)
    own: list[str] = []
    vllm: list[str] = []
    model_seen = False
    i = 0
    while i < len(args):
        token = args[i]
        name = token.split("=", 1)[0]
        if token in ("-h", "--help"):
            own.append(token)
        elif name == "--config" and not _settings_file(token, args[i + 1 : i + 2]):
            vllm += args[i : i + 1 + ("=" not in token)]  # vLLM's --config FILE.yaml
            i += "=" not in token
        elif name in own_options:
            action = own_options[name]
            takes_value = action.nargs != 0 and "=" not in token
            own += args[i : i + 1 + takes_value]
            i += takes_value
        elif token.startswith("-") and len(token) > 1 and not _is_number(token):
            taken = _vllm_values(table, name, token, args[i + 1 :])
            vllm += args[i : i + 1 + taken]
            i += taken
        elif not model_seen:
            own.append(token)
            model_seen = True
        else:
            vllm.append(token)  # parse_serve_args says what is wrong with it
        i += 1
    return own, vllm


def _settings_file(token: str, rest: Sequence[str]) -> bool:
    """Whether ``--config`` (``token``, its value in it or first in ``rest``) names
    gatekeeper's settings, a ``.toml`` file; vLLM's ``--config`` takes only YAML."""
    value = token.partition("=")[2] if "=" in token else (rest[0] if rest else "")
    return value.lower().endswith(".toml")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _vllm_values(table: Any, name: str, token: str, rest: Sequence[str]) -> int:
    """How many of ``rest`` belong to the vLLM flag ``token``."""
    if "=" in token or (name.startswith("-O") and name != "-O"):
        return 0  # the value is in the token: --flag=value, -O3
    if "." in name or name == "-O":
        return 1 if rest else 0  # a dotted JSON field, or -O LEVEL
    flag = table.find(name)
    if flag is None or flag.switch:
        return 0
    if flag.nargs in ("+", "*"):
        n = 0
        while n < len(rest) and not (rest[n].startswith("-") and not _is_number(rest[n])):
            n += 1
        return n
    if flag.nargs == "?":
        return 1 if rest and not rest[0].startswith("-") else 0
    return 1 if rest else 0


def serve_command(args: argparse.Namespace, settings: Settings | None = None) -> ServeCommand:
    """The ``vllm serve`` flags of a parsed serving command, read once (a ``--config``
    file is read once) with the table of the release it follows (``--vllm-version``,
    else the settings' default, else the newest table) and kept on ``args``; the model
    of a ``--config`` file becomes ``args.model`` when the command line names none."""
    command: ServeCommand | None = getattr(args, "serve_command", None)
    if command is None:
        where = f"gatekeeper {args.command}"
        default = settings.default_vllm_version if settings is not None else None
        table = flag_table(args.vllm_version or default)
        given = [args.model] if args.model else []
        command = parse_serve_args([*given, *args.vllm_argv], table, where=where)
        if command.model is None:  # what argparse said when the model was required
            raise UsageError(
                f"{where}: the following arguments are required: model; name it first "
                f"(gatekeeper {args.command} MODEL) or as `model:` in a --config file",
                field="model",
            )
        args.model = command.model
        args.serve_command = command
    return command


def options_from_args(args: argparse.Namespace, settings: Settings | None = None) -> ServeOptions:
    """The estimator's options from a serving command: the modelled vLLM flags, plus
    gatekeeper's ``--vllm-version`` and ``--embedded``."""
    values = dict(serve_command(args, settings).values)
    values["vllm_version"] = args.vllm_version
    values["embedded"] = args.embedded
    return serve_options(values)


def model_from_args(args: argparse.Namespace, settings: Settings) -> ModelSpec:
    """The ``ModelSpec`` of a serving command's model, looked up with its ``--revision``
    and ``--download-dir`` as vLLM would."""
    values = serve_command(args, settings).values
    overrides = values.get("hf_overrides")
    resolve = model_resolver(
        settings,
        revision=values.get("revision"),
        download_dir=values.get("download_dir"),
        hf_overrides=overrides if isinstance(overrides, dict) else None,
    )
    return resolve(args.model)


def note_unmodelled(args: argparse.Namespace, what: str) -> None:
    """Say on stderr which vLLM flags given are read but not modelled in ``what`` (the
    flags that locate the model are used by the look-up)."""
    command = serve_command(args)
    table, given = flag_table(command.vllm), command.values
    used = (*MODELLED, *MODEL_SOURCE_FLAGS)
    flags = sorted(table.flags[d].name for d in given if d not in used)
    if flags:
        print(
            f"gatekeeper: note: {', '.join(flags)} read but not modelled: their memory is not "
            f"in this {what} (docs/vllm-flags.md)",
            file=sys.stderr,
        )
