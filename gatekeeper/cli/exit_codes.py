"""The exit codes of every ``gatekeeper`` command, defined once (issue #14).

0: the model fits, or the command did what it was asked; 1: rejected (does not fit,
refused); 2: bad input (a flag, a setting, a model reference); 3: the sidecar could
not be reached.
"""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_REJECTED", "EXIT_UNREACHABLE", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
