"""The ``gatekeeper`` command (the installed script runs ``gatekeeper.cli.console:main``,
which runs ``main`` here).

``main`` builds the parser from the commands' modules, each with ``add_parser``:
``estimate``, ``models``, ``gpus``, ``check`` (and ``plan``), ``serve``, ``operator``
(``deploy``, ``ps``, ``forget``, ``undeploy``), ``webhook``, ``agent``, ``completion``
(``entry.COMMANDS``: a start imports only the module of the command it runs, and the
command imports what it uses: ``tests/cli/test_imports.py``); ``options`` holds the
serving flags they share. ``output`` ends every command: exit codes 0 fits or done, 1
rejected, 2 bad input, 3 sidecar unreachable (``exit_codes``), one line that says what
to do, or with ``--json`` one JSON object on stdout, errors included.

May import every other wing; nothing imports it.
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face

if TYPE_CHECKING:
    from gatekeeper.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]

__getattr__, __dir__ = face(globals())
