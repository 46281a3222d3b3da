"""``--log-format`` of the long-running commands (``serve``, ``webhook``): text (the
default) or JSON lines (``gatekeeper.sidecar.logs``), and their start-up lines said
the same way: printed on stdout as text, or as INFO records among the JSON lines."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Literal

from gatekeeper.settings import Settings

__all__ = ["add_log_format", "announce", "start_logging", "warn"]

LogFormat = Literal["text", "json"]


def add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="text, or json: one object a line with time, level, logger, message, and the "
        "deployment's id and model where they apply; a decision line (gatekeeper.decisions) "
        "adds its fields, as key=value pairs in text (default: GATEKEEPER_LOG_FORMAT, text)",
    )


def start_logging(args: argparse.Namespace, settings: Settings) -> LogFormat:
    """Configure logging as the command line (else the settings) asks; call it once
    ``uvicorn.Config`` is built. The format chosen."""
    from gatekeeper.sidecar.logs import configure_logging  # only what runs a server logs

    chosen: LogFormat = args.log_format or settings.log_format
    configure_logging(chosen)
    return chosen


def announce(lines: Sequence[str], log_format: LogFormat, logger_name: str) -> None:
    """The start-up lines: on stdout as text, or INFO records in JSON."""
    if log_format == "json":
        logger = logging.getLogger(logger_name)
        for line in lines:
            logger.info("%s", line)
    else:
        print("\n".join(lines), flush=True)


def warn(lines: Sequence[str], args: argparse.Namespace, settings: Settings) -> None:
    """Warnings from before logging is set up (unknown GATEKEEPER_* variables): one text
    line each on stderr, or one JSON object for a command logging JSON."""
    chosen = getattr(args, "log_format", None) or (
        settings.log_format if hasattr(args, "log_format") else "text"
    )
    for line in lines:
        if chosen == "json":
            from gatekeeper.sidecar.logs import JsonFormatter

            record = logging.makeLogRecord(
                {"name": "gatekeeper.settings", "levelname": "WARNING", "msg": line}
            )
            print(JsonFormatter().format(record), file=sys.stderr, flush=True)
        else:
            print(f"gatekeeper: warning: {line}", file=sys.stderr)
