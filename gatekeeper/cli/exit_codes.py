"""The exit codes of every ``gatekeeper`` command, defined once (issue #14).

0: the model fits, or the command did what it was asked; 1: rejected (does not fit,
refused by the sidecar, a worker that failed to start); 2: bad input (a flag, a
setting, a model reference, a request the sidecar found wrong); 3: the sidecar could
not be reached (refused, timed out, a name that does not resolve). Which error gets
which code is decided once, in ``gatekeeper.cli.output``.
"""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_REJECTED", "EXIT_UNREACHABLE", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
