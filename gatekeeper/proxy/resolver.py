"""The proxy's seam to the sidecar, and the choice of worker.

The proxy knows workers only through a ``Resolver``: the ready ``Endpoint``s serving a
model (or a ``RouteError`` saying why there are none), the model cards, the alias a name
stands for, and the report of how each request went. ``ProxyMetrics`` is where each
request is recorded. ``least_busy`` and ``least_busy_first`` choose among the endpoints:
fewest requests in flight through this proxy first, ties in the resolver's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "LAUNCH_GUARD",
    "Endpoint",
    "NoMetrics",
    "ProxyMetrics",
    "Resolver",
    "RouteError",
    "least_busy",
    "least_busy_first",
]

LAUNCH_GUARD = "gatekeeper.launch_guard"
"""A scope key a server may set on a request (the sidecar's ``HttpGuard`` does, on an open
route without a right API key): the request reaches only a model with ready workers
(``Resolver.ready``), and one that would need a launch, a wait or an eviction gets the
answer ``scope[LAUNCH_GUARD](model)`` instead."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ready worker serving a model."""

    worker_id: str
    base_url: str
    """``http://host:port``, without a trailing slash: ``http://127.0.0.1:8101``."""
    served_name: str
    """The model name the worker serves; a request naming an alias is rewritten to it."""


class RouteError(Exception):
    """The resolver has no worker for this request; becomes an OpenAI error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        code: str | None = None,
        param: str | None = "model",
        retry_after: float | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after
        self.should_retry = should_retry
        """``x-should-retry``; None leaves it to the status (``protocol.error_response``)."""


class Resolver(Protocol):
    """What the proxy needs from the sidecar: workers per model, and how requests went."""

    async def endpoints(self, model: str) -> list[Endpoint]:
        """Ready workers for ``model``; may launch one and wait (bounded). Raises
        ``RouteError``: 404 unknown model, 503 loading or full (``retry_after``), 507 or
        409 when it cannot be admitted (the message carries the reasons)."""
        ...

    def ready(self, model: str) -> list[Endpoint] | None:
        """The ready workers for ``model`` when they are known at once (no launch, no
        wait: the usual case), as ``endpoints`` would give them; else None, and the
        proxy asks ``endpoints``."""
        ...

    async def models(self) -> list[dict[str, Any]]:
        """The ``data`` entries of ``GET /v1/models``: vLLM's model cards."""
        ...

    def canonical(self, model: str) -> str:
        """The listed name ``model`` stands for: an alias's model, else ``model`` itself."""
        ...

    def report(self, endpoint: Endpoint, outcome: str) -> None:
        """Called once per request sent to ``endpoint``, with an ``Outcome``."""
        ...


class ProxyMetrics(Protocol):
    """Where the proxy records each request (the sidecar wires it to Prometheus)."""

    def observe(self, model: str, status: int, seconds: float) -> None: ...


class NoMetrics:
    """Records nothing."""

    def observe(self, model: str, status: int, seconds: float) -> None:
        return None


def least_busy(endpoints: list[Endpoint], outstanding: dict[str, int]) -> Endpoint:
    """The worker with the fewest requests in flight through this proxy; of several, the
    first in the resolver's order: ``least_busy_first(...)[0]`` without the sort. A loop
    rather than ``min(key=...)``, which costs more than the sort for a few workers; it
    stops at the first idle one. ``endpoints`` is not empty."""
    if len(endpoints) == 1:
        return endpoints[0]
    best = endpoints[0]
    fewest = outstanding.get(best.worker_id, 0)
    for endpoint in endpoints:
        if not fewest:
            break
        busy = outstanding.get(endpoint.worker_id, 0)
        if busy < fewest:
            best, fewest = endpoint, busy
    return best


def least_busy_first(endpoints: list[Endpoint], outstanding: dict[str, int]) -> list[Endpoint]:
    """The workers by requests in flight through this proxy, fewest first; ties keep the
    resolver's order (``sorted`` is stable)."""
    if len(endpoints) == 1:
        return endpoints
    return sorted(endpoints, key=lambda e: outstanding.get(e.worker_id, 0))
