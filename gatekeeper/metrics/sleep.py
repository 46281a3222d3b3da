"""Workers put to sleep and woken (``idle_action = "sleep"``): event metrics.

- ``gatekeeper_worker_sleeps_total{model}``: workers put to sleep;
- ``gatekeeper_worker_wakes_total{model}``: sleeping workers woken by a request;
- ``gatekeeper_worker_wake_duration_seconds{model}``: from the request that found the
  worker asleep to its traffic resuming (the wake's admission, room made for it, and
  vLLM's ``/wake_up``);
- ``gatekeeper_worker_sleep_failures_total{operation, model}``: a ``/sleep`` that failed
  (the worker stays awake) or a ``/wake_up`` that failed or hung (the worker is
  restarted).

How many workers sleep now is ``gatekeeper_workers{state="sleeping"}`` (``workers``).
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["WAKE_BUCKETS", "SleepMetrics"]

WAKE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
"""A wake at level 1 copies the weights back from host memory (seconds), at level 2 the
caller reloads them: the buckets span both."""


class SleepMetrics:
    """The sleep and wake counters and the wake latency histogram on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.sleeps = Counter(
            "gatekeeper_worker_sleeps", "Workers put to sleep (vLLM's sleep mode).",
            ["model"], registry=r,
        )  # fmt: skip
        self.wakes = Counter(
            "gatekeeper_worker_wakes", "Sleeping workers woken by a request.",
            ["model"], registry=r,
        )  # fmt: skip
        self.wake_seconds = Histogram(
            "gatekeeper_worker_wake_duration_seconds",
            "Seconds from a request finding its worker asleep to the worker serving again.",
            ["model"], buckets=WAKE_BUCKETS, registry=r,
        )  # fmt: skip
        self.failures = Counter(
            "gatekeeper_worker_sleep_failures",
            "Failed /sleep (worker kept awake) or /wake_up (worker restarted) calls.",
            ["operation", "model"], registry=r,
        )  # fmt: skip

    def slept(self, model: str) -> None:
        self.sleeps.labels(model).inc()
        self.wakes.labels(model)
        for operation in ("sleep", "wake"):
            self.failures.labels(operation, model)

    def woke(self, model: str, seconds: float) -> None:
        self.wakes.labels(model).inc()
        self.wake_seconds.labels(model).observe(seconds)

    def failed(self, operation: Literal["sleep", "wake"], model: str) -> None:
        self.failures.labels(operation, model).inc()
