"""The ``gatekeeper`` command line.

Each subcommand lives in its own module of ``gatekeeper.cli`` exposing
``add_parser(subparsers)``; the parser it adds sets ``run(args, settings) -> int`` as
its ``func``. Every command ends through ``gatekeeper.cli.output``: the same exit codes
(0 fits or done, 1 rejected, 2 bad input, 3 sidecar unreachable, 70 a bug) and, with
``--json``, one JSON object on stdout even for an error (argparse's included). No
traceback reaches the user.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gatekeeper._version import __version__
from gatekeeper.cli.exit_codes import EXIT_OK, EXIT_USAGE
from gatekeeper.cli.log_options import warn
from gatekeeper.cli.options import SERVING_COMMANDS, split_serving_argv
from gatekeeper.cli.output import EXIT_INTERNAL, UsageError, report
from gatekeeper.cli.serving_help import overview, release_in, search_help
from gatekeeper.errors import GatekeeperError
from gatekeeper.settings import load_settings, unknown_environment
from gatekeeper.vllm.flags import flag_table

__all__ = ["COMMANDS", "EXIT_INTERNAL", "EXIT_USAGE", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage block), exit code 2, and JSON
    with ``--json`` (``gatekeeper.cli.output``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)", field="arguments")


_CONFIG_AFTER = (
    "a .toml file: gatekeeper's settings, as `gatekeeper --config FILE`; a .yaml or .yml "
    "file: vllm serve's --config (its flags)"
)


COMMANDS = {
    "estimate": "estimate", "models": "models", "gpus": "gpus", "check": "check",
    "plan": "check", "serve": "serve", "deploy": "operator", "ps": "operator",
    "forget": "operator", "undeploy": "operator", "webhook": "webhook", "agent": "agent",
    "completion": "completion",
}  # fmt: skip
"""Each command and the module whose ``add_parser`` adds it, in the order ``--help`` lists
them (``tests/cli`` holds the modules to it): a start imports and builds the command it
runs, not all thirteen (#39)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``gatekeeper`` parser: every command's, or with ``command`` (one of
    ``COMMANDS``) that command's module's alone. ``completion`` reads them all."""
    parser = _Parser(
        prog="gatekeeper",
        description="Admission control for vLLM: decide before launch whether a model fits.",
    )
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML settings file (GATEKEEPER_* keys); also taken after the command",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    alone = COMMANDS.get(command or "") if command != "completion" else None
    for name in (alone,) if alone else dict.fromkeys(COMMANDS.values()):
        importlib.import_module(f"gatekeeper.cli.{name}").add_parser(subparsers)
    for name, sub in subparsers.choices.items():  # `gatekeeper serve --config f.toml`
        sub.add_argument(
            "--config",
            dest="command_config",
            type=Path,
            default=None,
            metavar="FILE",
            help=_CONFIG_AFTER
            if name in SERVING_COMMANDS
            else "TOML settings file, as `gatekeeper --config FILE`",
        )
    parser.set_defaults(root_parser=parser)  # gatekeeper completion reads the whole parser
    return parser


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    """argparse for gatekeeper's own options, with the parser of the command ``argv``
    names alone (``build_parser``); the ``vllm serve`` flags of a serving command go to
    vLLM's table instead (``gatekeeper.cli.options``)."""
    argv = list(argv)
    i = _command_at(argv)
    parser = build_parser(argv[i] if i < len(argv) else None)
    if i >= len(argv) or argv[i] not in SERVING_COMMANDS:
        return parser.parse_args(argv)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = sub.choices[argv[i]]
    rest = argv[i + 1 :]
    keyword = next((t.partition("=")[2] for t in rest if t.startswith("--help=")), None)
    if keyword is not None:  # vllm serve's --help=all, --help=GROUP, --help=WORD
        print(search_help(command, keyword, rest), end="")
        raise SystemExit(0)
    command.epilog = overview(flag_table(release_in(rest)))
    own, vllm = split_serving_argv(command, rest)
    args = parser.parse_args([*argv[: i + 1], *own])
    args.vllm_argv = vllm
    return args


def _command_at(argv: Sequence[str]) -> int:
    """Where the command is in ``argv`` (past the options before it); ``len(argv)`` when
    there is none."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--config" else 1
    return i


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        return _run(argv)
    except GatekeeperError as e:
        return report(e, as_json=as_json)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gatekeeper ... | head`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # a bug: one line for the user, the traceback on request
        if os.environ.get("GATEKEEPER_DEBUG"):
            raise
        message = (
            f"{type(e).__name__}: {e} (rerun with GATEKEEPER_DEBUG=1 for the traceback, "
            "and please report it)"
        )
        return report(e, as_json=as_json, message=message)


def _run(argv: list[str]) -> int:
    args = _parse(argv)
    settings = load_settings(_settings_file(args))
    warn(unknown_environment(), args, settings)
    code: int = args.func(args, settings)
    return code


def _settings_file(args: argparse.Namespace) -> Path | None:
    """The settings file: ``--config`` before the command or after it (the same file
    named in both places is fine; two different ones are an error naming both)."""
    before: Path | None = args.config
    after: Path | None = getattr(args, "command_config", None)
    if before is not None and after is not None and before.resolve() != after.resolve():
        raise UsageError(
            f"--config: two settings files, {str(before)!r} before {args.command} and "
            f"{str(after)!r} after it; give one",
            field="config",
        )
    return before or after


if __name__ == "__main__":
    raise SystemExit(main())
