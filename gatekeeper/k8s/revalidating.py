"""A reading served while it is refreshed: what the webhooks keep of the apiserver between
reviews (the published devices, the MutatingWebhookConfigurations' selectors, a
namespace's labels), so that no review waits on a refresh.

``Revalidating(read, refresh_seconds)`` reads once, synchronously, on the first call (the
callers of that moment wait for the one read: a single flight). Afterwards a value older
than ``refresh_seconds`` is returned as it is while one background thread reads the next
(HTTP's stale-while-revalidate); a failed background read is logged and the value kept.
A value older than ``max_stale_seconds`` (default 6 x ``refresh_seconds``) is not served:
the call reads synchronously and raises as ``read`` does, so that an apiserver gone for
long is noticed. ``fresh()`` reads now unless another caller's read finished after this
call began.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Revalidating"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class Revalidating(Generic[T]):
    """``read()``'s value, refreshed in the background once ``refresh_seconds`` old."""

    def __init__(
        self,
        read: Callable[[], T],
        refresh_seconds: float,
        *,
        max_stale_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "reading",
    ) -> None:
        self._read = read
        self._refresh = refresh_seconds
        self._max_stale = (
            max_stale_seconds if max_stale_seconds is not None else 6 * refresh_seconds
        )
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # one synchronous read at a time
        self._value: tuple[float, T] | None = None
        self._refreshing = False

    def __call__(self) -> T:
        now = self._clock()
        with self._lock:
            value = self._value
            background = False
            if value is not None and now - value[0] < self._max_stale:
                background = now - value[0] >= self._refresh and not self._refreshing
                self._refreshing = self._refreshing or background
        if value is None or now - value[0] >= self._max_stale:
            return self.fresh(since=now)
        if background:
            threading.Thread(
                target=self._background, name=f"{self._name}-refresh", daemon=True
            ).start()
        return value[1]

    def fresh(self, since: float | None = None) -> T:
        """Reads now (raising as ``read`` does), unless a read that finished after
        ``since`` (default: now) has the value already."""
        since = self._clock() if since is None else since
        with self._reading:
            with self._lock:
                value = self._value
            if value is not None and value[0] >= since:
                return value[1]
            return self._store(self._read())

    def _store(self, found: T) -> T:
        with self._lock:
            self._value = (self._clock(), found)
        return found

    def _background(self) -> None:
        try:
            with self._reading:
                self._store(self._read())
        except Exception as e:  # kept: the value served stays the last good one
            log.warning("%s: the background refresh failed, the last value kept: %s", self._name, e)
        finally:
            with self._lock:
                self._refreshing = False
