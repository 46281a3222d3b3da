"""The ``gatekeeper`` command (entry point ``gatekeeper.cli:main``).

``main`` builds the parser from the commands' modules, each with ``add_parser``:
``estimate`` (and ``models``), ``gpus``, ``check`` (and ``plan``), ``serve`` (and
``deploy``, ``ps``, ``undeploy``), ``webhook``; ``options`` holds the serving flags they
share. Errors raised on purpose end the command with exit code 2 and one line that says
what to do.

May import every other wing; nothing imports it.
"""

from gatekeeper.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
