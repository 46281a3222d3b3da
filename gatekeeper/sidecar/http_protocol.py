"""How ``gatekeeper serve`` runs under uvicorn (``server_config``; the tests' sidecar runs
the same), and its HTTP/1.1 protocol: uvicorn's httptools protocol with a deadline on
request headers, which uvicorn does not have.

uvicorn arms its keep-alive timer only after a response, and cancels it on the first byte
of the next request: a client that connects and sends nothing, or sends a request line
and then headers that never end (slowloris), holds its connection and file descriptor
forever, and enough of them exhaust the sidecar's. Here a timer is armed when a
connection opens and when a request's first byte arrives, and cancelled when its headers
are complete; when it fires the client gets 408 (the proxy's JSON error shape) and the
connection is closed. Bodies have their own limit (``request_body_timeout_seconds``, in
``http_guard``). Coalescing uvicorn's two writes per answer (head, body) into one was
measured and gained nothing (CPU per request 0.247 ms either way), so it is not done.
"""

from __future__ import annotations

import asyncio

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gatekeeper.proxy.protocol import error_response
from gatekeeper.settings import Settings

__all__ = ["server_config", "sidecar_http_protocol"]


def server_config(app: ASGIApp, *, host: str, port: int, settings: Settings) -> uvicorn.Config:
    """How ``gatekeeper serve`` runs the app under uvicorn (the tests' sidecar too)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        # No access log: at "warning" it never prints, yet uvicorn formats each line's
        # arguments per response. uvloop and httptools (the protocol's base) are
        # dependencies, named so that the proxy's hot path does not depend on "auto".
        access_log=False,
        loop="uvloop",
        # Nothing in the sidecar reads the client's address or scheme, so uvicorn need not
        # copy every request's headers into a dict to look for X-Forwarded-* (loopback).
        proxy_headers=False,
        lifespan="on",
        http=sidecar_http_protocol(settings.request_header_timeout_seconds),
    )


def sidecar_http_protocol(header_timeout_seconds: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing connections whose headers take over ``seconds``."""
    seconds = header_timeout_seconds
    answer = error_response(
        408,
        f"the request's headers did not arrive within {seconds:g} s "
        "(request_header_timeout_seconds); send the whole request at once",
        code="request_timeout",
    )
    head = b"".join(
        [
            b"HTTP/1.1 408 Request Timeout\r\n",
            *(name + b": " + value + b"\r\n" for name, value in answer.raw_headers),
            b"connection: close\r\n\r\n",
        ]
    )
    timeout_answer = head + bytes(answer.body)

    class SidecarHttpProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_too_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.write(timeout_answer)
                self.transport.close()

    return SidecarHttpProtocol
