"""What every HTTP request passes before it reaches a route: an ASGI middleware.

- **API keys** (``api_keys``, as vLLM's ``--api-key``): when any are set, every request
  under vLLM's guarded prefixes (``GUARDED_PREFIXES``: ``/v1``, ``/v2``, ``/inference``,
  ``/cohere``; not ``OPTIONS``) must carry ``Authorization: Bearer <key>`` matching one
  of them, else 401 in OpenAI's error shape. The given key is compared with every
  configured key in constant time, without stopping at a match. A request let through
  has its ``Authorization`` header removed, and so has every request to a forwarding
  route outside those prefixes (``/tokenize``, ``/pooling``, ... open, as vLLM leaves
  them), so the sidecar's keys never reach a worker. ``/healthz``, ``/metrics`` and
  ``/openapi.json`` stay open; the admin API checks its own token.
- **No key, no launch**: in vLLM those open routes cannot start anything; here a request
  naming a model may launch a worker, wait for one, or evict idle ones. So a request to
  an open forwarding route without a right key reaches only a model that has a ready
  worker (``resolver.LAUNCH_GUARD``); for any other it gets the same 401 as a guarded
  path, saying that starting the model needs a key. With a right key it is served as on
  a guarded path.
- **Direct routes** (``direct``: exact path to ASGI app, for ``POST``): the proxy's
  OpenAI POSTs go straight to their app, past Starlette's error middleware and router,
  whose walk over every route and wrappers around every ``send`` (each streamed chunk)
  cost more CPU than the proxy's own work (issue #15). The guard is then the outermost
  app (``build_app`` puts it there); an exception from a direct app is answered 500 by
  uvicorn, as Starlette's error middleware would answer it. ``direct_routes`` gives the
  same apps behind the same key policy, for the server's lean path (``http_protocol``),
  which hands such POSTs to them before the app stack is entered; their ``answer_now``
  (the proxy's path without a task) is behind the same policy, and declines a request
  without a right key, whose 401 the app then gives.

Deadlines on request headers and bodies are the HTTP protocol's (``http_protocol``).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gatekeeper.proxy.protocol import error_response
from gatekeeper.proxy.relay import AnswerNow, Reply
from gatekeeper.proxy.resolver import LAUNCH_GUARD

__all__ = ["GUARDED_PREFIXES", "HttpGuard"]

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
"""The paths vLLM's ``--api-key`` guards (``AuthenticationMiddleware.GUARDED_PREFIX``,
a prefix match: ``/v1`` covers ``/v1/...``)."""


class HttpGuard:
    """API keys on vLLM's guarded prefixes, and the ``direct`` POST routes dispatched
    without the app behind."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: Sequence[str],
        direct: Mapping[str, ASGIApp] | None = None,
    ) -> None:
        self.app = app
        self._keys = [key.encode() for key in api_keys]
        # Each direct route behind the key policy once, here: the guard dispatches to
        # these, and the HTTP protocol's lean path gets the same ones (direct_routes).
        self._direct: dict[str, ASGIApp] = {
            path: _Keyed(self, route, check=path.startswith(GUARDED_PREFIXES))
            if self._keys
            else route
            for path, route in (direct or {}).items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        direct = self._direct.get(path) if scope["method"] == "POST" else None
        if direct is not None:
            await direct(scope, receive, send)
            return
        if self._keys and scope["method"] != "OPTIONS" and path.startswith(GUARDED_PREFIXES):
            admitted = self._admit(scope)
            if admitted is None:
                await _unauthorized()(scope, receive, send)
                return
            scope = admitted
        await self.app(scope, receive, send)

    def direct_routes(self) -> dict[str, ASGIApp]:
        """The direct routes, behind the same key policy as ``__call__``'s."""
        return dict(self._direct)

    def _admit(self, scope: Scope) -> Scope | None:
        """The scope without ``Authorization`` if it carries a right key, else None."""
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
        if not (match and given):
            return None
        return _without_authorization(scope)


def _without_authorization(scope: Scope) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k != b"authorization"]
    return {**scope, "headers": headers}


class _Keyed:
    """A direct route behind the guard's key policy: checked (a guarded prefix), or open
    with the ``Authorization`` header removed, and without a right key only for models
    with a ready worker (``LAUNCH_GUARD``)."""

    __slots__ = ("_app", "_check", "_guard", "_now")

    def __init__(self, guard: HttpGuard, app: ASGIApp, *, check: bool) -> None:
        self._guard = guard
        self._app = app
        self._check = check
        self._now: AnswerNow | None = getattr(app, "answer_now", None)

    def answer_now(self, scope: Scope, body: bytes, reply: Reply) -> bool:
        """The route's ``answer_now`` (``relay.AnswerNow``) behind the same key policy;
        a request without a right key is left to ``__call__`` (its 401)."""
        if self._now is None:
            return False
        # answer_now serves ready workers only, so an open route needs no key for it
        admitted = self._guard._admit(scope) if self._check else _without_authorization(scope)
        return admitted is not None and self._now(admitted, body, reply)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admitted = self._guard._admit(scope)
        if admitted is not None:
            await self._app(admitted, receive, send)
        elif self._check:
            await _unauthorized()(scope, receive, send)
        else:
            opened = _without_authorization(scope)
            opened[LAUNCH_GUARD] = _launch_unauthorized
            await self._app(opened, receive, send)


def _unauthorized(
    message: str = (
        "Missing or wrong API key. Send Authorization: Bearer <key>, a key from the "
        "sidecar's api_keys (GATEKEEPER_API_KEYS)."
    ),
) -> Response:
    response = error_response(401, message, code="invalid_api_key")
    response.headers["www-authenticate"] = "Bearer"
    return response


def _launch_unauthorized(model: str) -> Response:
    """The 401 of an open route's request without a right key, for a model with no ready
    worker (``LAUNCH_GUARD``)."""
    return _unauthorized(
        f"The model `{model}` has no ready worker, and starting one (or waiting for one) "
        "needs an API key: send Authorization: Bearer <key>, a key from the sidecar's "
        "api_keys (GATEKEEPER_API_KEYS). Without a key this route serves running models only."
    )
