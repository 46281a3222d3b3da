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

Decision lines (``gatekeeper.cluster.decision_log``, ``gatekeeper.decisions``: each webhook decision, each
sidecar rejection, each claim the scheduler cannot allocate) carry their fields as
logging's ``extra={"fields": {...}}``: in JSON, each field is a key of the line beside
``message``; in text, the line is the message and the fields as ``key=value`` pairs
(logfmt: a value with spaces or quotes quoted), on stderr, at INFO as well.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from gatekeeper.cluster.decision_log import DECISIONS_LOGGER

__all__ = [
    "LOG_FIELDS",
    "JsonFormatter",
    "configure_logging",
    "deployment_context",
    "deployment_extra",
    "logfmt",
]

LOG_FIELDS = ("deployment_id", "model")
"""The fields a line about one deployment carries."""

deployment_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "gatekeeper_deployment", default=None
)
"""The deployment the running task works for (set by its supervising task, ``Supervisor.run``)."""

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
_RESERVED = ("time", "level", "logger", "message", "exception", "stack")


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


def logfmt(message: str, fields: Mapping[str, Any]) -> str:
    """``message`` and ``fields`` as one text line: ``key=value`` pairs after the message, a
    value with a space, a quote, a ``=`` or nothing quoted as JSON quotes it; None left
    out."""
    parts = [message] if message else []
    for key, value in fields.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if not text or any(c in text for c in ' "=\\\n\t'):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, Mapping) else {}


class _LogfmtFormatter(logging.Formatter):
    """A decision line in text: the message and its fields (``logfmt``)."""

    def format(self, record: logging.LogRecord) -> str:
        return logfmt(record.getMessage(), _fields(record))


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to ``sys.stderr`` as it is when a line is written (a test's
    capture, a redirected stream), as logging's last resort does."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


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
        for key, value in _fields(record).items():
            if value is not None and key not in _RESERVED:
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


def configure_logging(log_format: Literal["text", "json"], stream: TextIO | None = None) -> None:
    """Route every log line through one JSON handler on stderr (``"json"``), uvicorn's
    included; call it after ``uvicorn.Config`` is built, which applies uvicorn's own
    logging configuration. ``"text"`` leaves logging as it is but for the decision lines
    (``decision_log.DECISIONS_LOGGER``), which reach stderr from INFO as ``logfmt`` lines."""
    if log_format != "json":
        decisions = logging.getLogger(DECISIONS_LOGGER)
        if not any(isinstance(h, _Stderr) for h in decisions.handlers):
            text = _Stderr()
            text.setFormatter(_LogfmtFormatter())
            decisions.addHandler(text)
        decisions.setLevel(logging.INFO)
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(_ContextFields())
    decisions = logging.getLogger(DECISIONS_LOGGER)
    decisions.handlers[:] = [h for h in decisions.handlers if not isinstance(h, _Stderr)]
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("gatekeeper").setLevel(logging.INFO)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
