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
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Sequence

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gatekeeper.proxy.protocol import error_response

__all__ = ["HttpGuard"]


class _BodyStalled(Exception):
    """The client sent no next chunk of its request body in time."""


class HttpGuard:
    """API keys on ``/v1`` and a bound on each wait for request-body chunks."""

    def __init__(
        self, app: ASGIApp, *, api_keys: Sequence[str], body_timeout_seconds: float
    ) -> None:
        self.app = app
        self._keys = [key.encode() for key in api_keys]
        self._body_timeout_seconds = body_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        openai = _is_openai(scope["path"])
        if openai and self._keys:
            if not self._authorized(scope):
                await _unauthorized()(scope, receive, send)
                return
            headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
            scope = {**scope, "headers": headers}
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, self._timed(receive), tracking_send)
        except _BodyStalled:
            if not started:  # else the connection is closed as the app's answer breaks off
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

    def _timed(self, receive: Receive) -> Receive:
        body_done = False
        timeout = self._body_timeout_seconds

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                raise _BodyStalled from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        return timed_receive

    def _stalled(self, openai: bool) -> Response:
        seconds = f"{self._body_timeout_seconds:g}"
        message = (
            f"The request body stalled: no next chunk within {seconds} s "
            "(request_body_timeout_seconds). Send the whole body the Content-Length announces."
        )
        headers = {"connection": "close"}
        if openai:
            response = error_response(
                408, message, type="invalid_request_error", code="request_timeout"
            )
            response.headers.update(headers)
            return response
        body = {
            "error": {"message": message, "type": "request_timeout", "field": None, "value": None}
        }
        return JSONResponse(body, status_code=408, headers=headers)


def _is_openai(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def _unauthorized() -> Response:
    message = (
        "Missing or wrong API key. Send Authorization: Bearer <key>, a key from the "
        "sidecar's api_keys (GATEKEEPER_API_KEYS)."
    )
    response = error_response(401, message, type="invalid_request_error", code="invalid_api_key")
    response.headers["www-authenticate"] = "Bearer"
    return response
