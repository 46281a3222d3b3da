"""The installed ``gatekeeper`` script (``[project.scripts]``) and ``python -m
gatekeeper``: ``main`` runs ``gatekeeper.cli.entry.main`` with the garbage collector
held off while the command's modules load, and what they built frozen after
(``gc.freeze``).

Loading the CLI builds some 400 modules' classes, functions and tables; with the
collector on, each allocation burst sets off collections that walk all of them again, and
the interpreter's exit walks them once more. None of it is garbage: module objects live
as long as the process. Frozen, they are left out of every later collection, the exit's
included; objects the command creates afterwards are collected as usual, so the
long-running commands (``serve``, ``webhook``, ``agent``) lose nothing. Measured by
``python -m bench.cli_start`` (#39).

Tests call ``gatekeeper.cli.main`` in their own process and do not come through here.
"""

from __future__ import annotations

import gc

__all__ = ["main"]


def main() -> int:
    """Run the command line in ``sys.argv``; the exit status."""
    gc.disable()
    try:
        from gatekeeper.cli.entry import main as run_command
    finally:
        gc.freeze()
        gc.enable()
    return run_command()
