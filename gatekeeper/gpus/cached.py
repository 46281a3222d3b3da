"""Readings reused for a few seconds: ``CachedReading``, the one helper, and
``CachedInventory``, one NVML reading shared by the collectors of one scrape.

``CachedReading(read, ttl_seconds)`` calls ``read`` at most once per ``ttl_seconds``
(``clock`` injectable); callers that ask at once wait on one lock, so one of them reads
and the others take that reading. What a failed read does is its ``on_failure`` policy:

- ``None`` (raise): the exception reaches the caller and nothing of it is kept; the next
  call reads again (``CachedInventory``);
- ``KeepLastGood(errors, describe, otherwise)``: an exception among ``errors`` serves the
  last good reading again, logged, for another ``ttl_seconds``; with none yet,
  ``otherwise(describe(e))`` (the failure as a value, never kept as good) for
  ``ttl_seconds``. Other exceptions raise (the webhook's ``PublishedDevices``).

It lives here, not in a flat module of its own, because ``gpus`` is the lowest layer
that ``gpus``, ``cluster`` and ``k8s`` all may import (the layout keeps a handful of
flat modules); it imports nothing but the standard library.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gatekeeper.gpus.inventory import GpuInventory, InventorySnapshot

__all__ = ["CachedInventory", "CachedReading", "KeepLastGood"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class KeepLastGood(Generic[T]):
    """The failure policy that serves the last good reading on one of ``errors``."""

    errors: tuple[type[Exception], ...]
    """The failures that keep the last good reading; any other raises."""
    describe: Callable[[Exception], str]
    """Says what failed, for the log and for ``otherwise``."""
    otherwise: Callable[[str], T]
    """The value served while no read has succeeded yet, from ``describe(e)``."""


class CachedReading(Generic[T]):
    """``read()`` reused for ``ttl_seconds`` (0: read at every call); thread-safe."""

    def __init__(
        self,
        read: Callable[[], T],
        ttl_seconds: float,
        *,
        on_failure: KeepLastGood[T] | None = None,
        clock: Callable[[], float] = time.monotonic,
        name: str = "reading",
    ) -> None:
        self._read = read
        self._ttl = ttl_seconds
        self._on_failure = on_failure
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._served: tuple[float, T] | None = None
        self._good: tuple[float, T] | None = None

    def __call__(self) -> T:
        with self._lock:
            now = self._clock()
            if self._served is not None and now - self._served[0] < self._ttl:
                return self._served[1]
            value = self._read_at(now)
            self._served = (now, value)
            return value

    def _read_at(self, now: float) -> T:
        policy = self._on_failure
        if policy is None:
            value = self._read()
        else:
            try:
                value = self._read()
            except policy.errors as e:
                if self._good is None:
                    return policy.otherwise(policy.describe(e))
                read_at, good = self._good
                log.warning(
                    "%s: %s; serving the reading of %.1f s ago",
                    self._name,
                    policy.describe(e),
                    now - read_at,
                )
                return good
        self._good = (now, value)
        return value


class CachedInventory:
    """A ``GpuInventory`` that reuses a snapshot younger than ``max_age_seconds``, so
    that the collectors of one scrape read NVML once. Exceptions pass through."""

    def __init__(
        self,
        inventory: GpuInventory,
        max_age_seconds: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reading = CachedReading(
            inventory.snapshot, max_age_seconds, clock=clock, name="the GPU inventory"
        )

    def snapshot(self) -> InventorySnapshot:
        return self._reading()
