"""``GET /metrics`` for the sidecar and the webhook, negotiated as Prometheus negotiates it.

``metrics_endpoint(registry)`` is a Starlette endpoint that answers with
``prometheus_client``'s own exposition app (``make_wsgi_app``), so gatekeeper writes no
content negotiation of its own: ``Accept: application/openmetrics-text`` gets OpenMetrics
(Prometheus asks for it first), any other ``Accept`` the text format 0.0.4,
``Accept-Encoding: gzip`` a gzip body, and ``?name[]=…`` only the families named.

The WSGI app rather than ``make_asgi_app``: both call the same ``_bake_output``, but the
ASGI app collects inside the event loop, and the sidecar's collectors read NVML and the
ledger at scrape time; the WSGI app runs in a worker thread, off the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import anyio
from prometheus_client import CollectorRegistry, make_wsgi_app
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["metrics_endpoint"]

Endpoint = Callable[[Request], Awaitable[Response]]


def metrics_endpoint(registry: CollectorRegistry) -> Endpoint:
    """A ``GET /metrics`` endpoint serving ``registry`` (OpenMetrics or text, gzip or not,
    as the request's ``Accept`` and ``Accept-Encoding`` ask)."""
    app = make_wsgi_app(registry)

    async def endpoint(request: Request) -> Response:
        environ = {
            # The route admits GET and HEAD; the app answers anything but GET with a 405.
            "REQUEST_METHOD": "GET",
            "PATH_INFO": request.url.path,
            "QUERY_STRING": request.url.query,
            "HTTP_ACCEPT": request.headers.get("accept", ""),
            "HTTP_ACCEPT_ENCODING": request.headers.get("accept-encoding", ""),
        }
        statuses: list[str] = []
        headers: dict[str, str] = {}

        def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
            statuses.append(status)
            headers.update(response_headers)

        def run() -> bytes:
            body: Iterable[bytes] = app(environ, start_response)
            return b"".join(body)

        body = await anyio.to_thread.run_sync(run)
        code = int(statuses[-1].split(" ", 1)[0])
        return Response(body, status_code=code, headers=headers)

    return endpoint
