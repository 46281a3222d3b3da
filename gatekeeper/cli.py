"""The ``gatekeeper`` command line.

Each subcommand lives in its own ``commands_*`` module exposing
``add_parser(subparsers)``; the parser it adds sets ``run(args, settings) -> int`` as
its ``func``. Errors raised on purpose (``GatekeeperError``) end the command with
exit code 2 and one line that says what to do; no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from gatekeeper import __version__
from gatekeeper.errors import GatekeeperError
from gatekeeper.settings import load_settings

EXIT_USAGE = 2
EXIT_INTERNAL = 70


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error prints one line (no usage block) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"gatekeeper: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from gatekeeper import commands_estimate

    parser = _Parser(
        prog="gatekeeper",
        description="Admission control for vLLM: decide before launch whether a model fits.",
    )
    parser.add_argument("--version", action="version", version=f"gatekeeper {__version__}")
    parser.add_argument(
        "--config", type=Path, default=None, help="TOML settings file (GATEKEEPER_* keys)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    commands_estimate.add_parser(subparsers)
    _add_optional_commands(subparsers)
    return parser


def _add_optional_commands(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    """Commands added by later modules register here."""
    import importlib

    for name in (
        "gatekeeper.commands_gpus",
        "gatekeeper.commands_check",
        "gatekeeper.commands_serve",
        "gatekeeper.commands_webhook",
    ):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
        code: int = args.func(args, settings)
    except GatekeeperError as e:
        print(f"gatekeeper: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug: one line for the user, the traceback on request
        if os.environ.get("GATEKEEPER_DEBUG"):
            raise
        print(
            f"gatekeeper: internal error: {type(e).__name__}: {e} "
            "(rerun with GATEKEEPER_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return code


if __name__ == "__main__":
    raise SystemExit(main())
