"""The sidecar's (and the webhook's) log lines: text by default, or JSON, one object a
line, for Loki or Elasticsearch (``log_format = "json"``, ``GATEKEEPER_LOG_FORMAT=json``,
``gatekeeper serve --log-format json``).

Each JSON line has ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger`` and
``message``; a line about one deployment adds ``deployment_id`` and ``model``, given as
logging's ``extra`` (``deployment_extra``) or, inside a deployment's supervising task, by
the context (``deployment_context``, a contextvar each task holds its own copy of); a
line with a traceback adds ``exception``. uvicorn's own loggers are routed to the same
handler, so that every line on stderr is JSON. gatekeeper's loggers speak from INFO
(each deployment's state changes), the others from WARNING.

Text keeps today's behaviour: nothing is configured, and warnings reach stderr as bare
messages through logging's last resort.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

__all__ = [
    "LOG_FIELDS",
    "JsonFormatter",
    "configure_logging",
    "deployment_context",
    "deployment_extra",
]

LOG_FIELDS = ("deployment_id", "model")
"""The fields a line about one deployment carries."""

deployment_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "gatekeeper_deployment", default=None
)
"""The deployment the running task works for (set by its supervising task, ``Supervisor.run``)."""

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def deployment_extra(deployment_id: str, model: str) -> dict[str, str]:
    """logging's ``extra`` for a line about one deployment."""
    return {"deployment_id": deployment_id, "model": model}


class _ContextFields(logging.Filter):
    """Fills a record's deployment fields from ``deployment_context`` when its call gave
    none."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = deployment_context.get()
        if current is not None and getattr(record, "deployment_id", None) is None:
            for key, value in current.items():
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the deployment's fields
    where they apply, and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in LOG_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: Literal["text", "json"], stream: TextIO | None = None) -> None:
    """Route every log line through one JSON handler on stderr (``"json"``), uvicorn's
    included; call it after ``uvicorn.Config`` is built, which applies uvicorn's own
    logging configuration. ``"text"`` leaves logging as it is."""
    if log_format != "json":
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_ContextFields())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("gatekeeper").setLevel(logging.INFO)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
