"""Kubernetes' timestamps as gatekeeper writes and reads them: RFC 3339 in UTC to the
second (an Event's ``firstTimestamp``, the ``vllm-gatekeeper.io/used-at`` stamp), and such
a stamp, or ``creationTimestamp`` as lightkube gives it, back as seconds since the epoch.
"""

from __future__ import annotations

import datetime

__all__ = ["epoch", "rfc3339"]


def rfc3339(seconds: float) -> str:
    """``seconds`` since the epoch as ``2026-12-06T15:24:00Z``."""
    at = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(stamp: object) -> float:
    """A timestamp (a ``datetime``, or RFC 3339 text) as seconds since the epoch; 0 when it
    cannot be read."""
    if isinstance(stamp, datetime.datetime):
        return stamp.timestamp()
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
