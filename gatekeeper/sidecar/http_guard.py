"""What every HTTP request passes before it reaches a route: an ASGI middleware.

- **API keys** (``api_keys``, as vLLM's ``--api-key``): when any are set, every ``/v1``
  request must carry ``Authorization: Bearer <key>`` matching one of them, else 401 in
  OpenAI's error shape. The given key is compared with every configured key in constant
  time, without stopping at a match. A request let through has its ``Authorization``
  header removed, so the sidecar's keys never reach a worker. ``/healthz``, ``/metrics``
  and ``/openapi.json`` stay open; the admin API checks its own token.
- **Stalled bodies** (``request_body_timeout_seconds``): each wait for the next chunk of
  the request body is bounded; a client that sends less than it announced and stalls
  gets 408 (OpenAI's shape on ``/v1``, the admin API's elsewhere) and its connection is
  closed. Only the request body is timed: once it is complete, ``receive`` is passed
  through as it is (the proxy waits on it for the client's disconnect while it streams).
- **Direct routes** (``direct``: exact path to ASGI app, for ``POST``): the proxy's
  OpenAI POSTs go straight to their app, past Starlette's error middleware and router,
  whose walk over every route and wrappers around every ``send`` (each streamed chunk)
  cost more CPU than the proxy's own work (issue #15). The guard is then the outermost
  app (``build_app`` puts it there); an exception from a direct app is answered 500 by
  uvicorn, as Starlette's error middleware would answer it.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping, Sequence

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gatekeeper.proxy.protocol import error_response

__all__ = ["HttpGuard"]


class _BodyStalled(BaseException):
    """The client sent no next chunk of its request body in time. Not an ``Exception``,
    so that an app's catch-all (the admin API answers every failure 500) lets it reach
    the guard."""


class HttpGuard:
    """API keys on ``/v1``, a bound on each wait for request-body chunks, and the
    ``direct`` POST routes dispatched without the app behind."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: Sequence[str],
        body_timeout_seconds: float,
        direct: Mapping[str, ASGIApp] | None = None,
    ) -> None:
        self.app = app
        self._keys = [key.encode() for key in api_keys]
        self._body_timeout_seconds = body_timeout_seconds
        self._direct = dict(direct or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        openai = path.startswith("/v1/") or path == "/v1"
        if openai and self._keys:
            if not self._authorized(scope):
                await _unauthorized()(scope, receive, send)
                return
            headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
            scope = {**scope, "headers": headers}
        app = self._direct.get(path) if scope["method"] == "POST" else None
        if app is None:
            app, sent = self.app, _Sent(send)
        else:  # a direct app reads its whole body before it answers: nothing to track
            sent = None
        try:
            await app(scope, _TimedReceive(receive, self._body_timeout_seconds), sent or send)
        except _BodyStalled:
            if sent is None or not sent.started:  # else the answer breaks off: closed
                await self._stalled(openai)(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    given = b""
                break
        match = False
        for key in self._keys:  # every key, no early exit: the time does not tell which
            match |= hmac.compare_digest(given.strip(), key)
        return match and bool(given)

    def _stalled(self, openai: bool) -> Response:
        seconds = f"{self._body_timeout_seconds:g}"
        message = (
            f"The request body stalled: no next chunk within {seconds} s "
            "(request_body_timeout_seconds). Send the whole body the Content-Length announces."
        )
        # vLLM's type for the status on /v1 ("Request Timeout"); the admin API's own kind
        # elsewhere. One shape either way (error_response's).
        kind = None if openai else "request_timeout"
        response = error_response(408, message, type=kind, code="request_timeout")
        response.headers["connection"] = "close"
        return response


class _Sent:
    """``send``, noting whether the answer has started."""

    __slots__ = ("_send", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        self.started = True
        await self._send(message)


class _TimedReceive:
    """``receive``, each wait bounded until the request body is complete; then as is."""

    __slots__ = ("_body_done", "_receive", "_timeout")

    def __init__(self, receive: Receive, timeout_seconds: float) -> None:
        self._receive = receive
        self._timeout = timeout_seconds
        self._body_done = False

    async def __call__(self) -> Message:
        if self._body_done:
            return await self._receive()
        try:
            async with asyncio.timeout(self._timeout):
                message = await self._receive()
        except TimeoutError:
            raise _BodyStalled from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._body_done = True
        return message


def _unauthorized() -> Response:
    message = (
        "Missing or wrong API key. Send Authorization: Bearer <key>, a key from the "
        "sidecar's api_keys (GATEKEEPER_API_KEYS)."
    )
    response = error_response(401, message, code="invalid_api_key")
    response.headers["www-authenticate"] = "Bearer"
    return response
