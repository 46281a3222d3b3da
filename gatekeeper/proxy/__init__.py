"""The OpenAI-compatible proxy, behind a resolver seam.

``serving.Proxy(resolver, client)`` routes each request by its ``model`` to a worker the
``Resolver`` names (``resolver``: the seam the sidecar's router implements, and the
least-busy choice), streams server-sent events through unbuffered (``relay``),
propagates the client's cancellation, and answers errors in vLLM's OpenAI-compatible
shape (``protocol``; docs/openai.md). ``request_body`` reads and parses the request once;
``worker_call`` is one try at one worker and its single report. ``upstream`` is the
keep-alive HTTP client to the workers, a pool of ``worker_connection``s (``httpx_pool``
adapts any httpx client instead); ``headers`` says which header fields pass each way.

May import: ``gatekeeper.errors``, ``gatekeeper.units`` and the HTTP libraries. Nothing of
the sidecar: the proxy knows workers only through the ``Resolver`` it is given.
"""

from gatekeeper.proxy.protocol import ErrorResponse, error_response
from gatekeeper.proxy.resolver import Endpoint, NoMetrics, ProxyMetrics, Resolver, RouteError
from gatekeeper.proxy.serving import Proxy
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
