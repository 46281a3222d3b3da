"""The OpenAI-compatible proxy, behind a resolver seam.

``serving.Proxy(resolver, client)`` routes each request by its ``model`` to a worker the
``Resolver`` names (the sidecar's router implements it), streams server-sent events
through unbuffered (``relay``), propagates the client's cancellation, and answers errors
in vLLM's OpenAI-compatible shape (``protocol``; docs/openai.md). ``upstream`` is the
keep-alive HTTP client to the workers (``httpx_pool`` adapts any httpx client instead);
``headers`` says which header fields pass each way.

May import: ``gatekeeper.errors``, ``gatekeeper.units`` and the HTTP libraries. Nothing of
the sidecar: the proxy knows workers only through the ``Resolver`` it is given.
"""

from gatekeeper.proxy.protocol import ErrorResponse, error_response
from gatekeeper.proxy.serving import (
    Endpoint,
    NoMetrics,
    Proxy,
    ProxyMetrics,
    Resolver,
    RouteError,
)
from gatekeeper.proxy.upstream import UpstreamClient, upstream_client

__all__ = [
    "Endpoint",
    "ErrorResponse",
    "NoMetrics",
    "Proxy",
    "ProxyMetrics",
    "Resolver",
    "RouteError",
    "UpstreamClient",
    "error_response",
    "upstream_client",
]
