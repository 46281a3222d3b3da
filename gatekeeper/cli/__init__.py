"""The ``gatekeeper`` command (entry point ``gatekeeper.cli:main``).

``main`` builds the parser from the commands' modules, each with ``add_parser``:
``estimate`` (and ``models``), ``gpus``, ``check`` (and ``plan``), ``serve``,
``operator`` (``deploy``, ``ps``, ``undeploy``), ``webhook``; ``options`` holds the
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

__getattr__, __dir__ = face(
    globals(),
    {
        "gatekeeper.cli.entry": ["build_parser", "main"],
    },
)
