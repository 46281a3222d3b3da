"""The OpenAI-compatible proxy: route each request by its ``model`` to a ready worker.

``Proxy(resolver, client).routes()`` gives the Starlette routes the sidecar mounts: every
``POST`` route of vLLM's API server whose body names the model (``protocol.JSON_ROUTES``,
``/v1/chat/completions``, ``/v1/responses``, ``/tokenize``, ``/rerank``…, and the
``multipart/form-data`` ``protocol.FORM_ROUTES``, ``/v1/audio/transcriptions`` and
``/v1/audio/translations``, whose ``model`` is a form field), ``GET`` and ``POST …/cancel``
of ``/v1/responses/{id}`` routed by a ``?model=`` query parameter (nothing else in them names
the model), ``GET /v1/models`` and ``GET /v1/models/{id}``.

- **Routing.** The body is parsed once; its ``model`` goes to the ``Resolver``, which
  answers with the ready workers serving it (launching one on demand if it may) or raises
  ``RouteError``. The worker with the fewest requests in flight through this proxy wins
  (ties: the resolver's order); one that refuses the connection is skipped for the next.
  The body is forwarded byte for byte, and re-serialised only when the client used an
  alias (its ``model`` becomes the worker's served name).
- **Streaming.** With ``"stream": true`` the worker's server-sent events are relayed
  as they arrive, what one read from the worker brought in one send; nothing waits.
- **Cancellation.** When the client goes away the connection to the worker is closed,
  so the worker sees the disconnect and aborts the generation (vLLM does), streaming or
  not.
- **Errors** in vLLM's shape (``protocol``): 400 for a body that is not a JSON
  object with a string ``model`` (or a form without one), 413 over ``max_body_bytes``
  (a form too: it is read within the same bound), the resolver's 404, 503
  (with ``Retry-After``), 507 or 409, and 502 when the worker refuses the connection,
  fails mid-request or answers what is no HTTP answer to a POST (a status outside
  100-599, a 101 upgrade: ``upstream``); a stream that has started ends with a
  ``data: {"error": ...}`` event. The worker's own answers, 4xx included, pass through
  as they are.
- **Whole answers** are held until whole and sent in one write with their length, up to
  ``max_whole_answer_bytes``; a larger one is relayed as it comes, chunked
  (``StreamRelay``), and one the worker cuts is left unfinished (the client's
  connection closes before the last chunk).
- **Headers** pass both ways without the hop-by-hop fields (``headers``; RFC 9110
  section 7.6.1: ``Connection`` and those it names, ``Keep-Alive``, ``TE``, ``Trailer``,
  ``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``) and without ``Expect`` (the server
  has answered it) or the fields the HTTP layers set themselves.
- **Ready only** (``LAUNCH_GUARD``): a request whose scope carries it reaches only a
  model with ready workers; the sidecar sets it on open routes without an API key.
- After each request ``Resolver.report(endpoint, outcome)`` and
  ``ProxyMetrics.observe(model, status, seconds)`` are called once; a request the client
  abandoned is observed with status 499.

The hot path is lean because the targets are vllm-router's (``bench/proxy.py``): the
request is parsed once (pydantic-core's ``validate_json``, about 1.5 us, cheaper than
``json.loads`` and the checks by hand), the answer never; the forwarding POSTs are bare
ASGI apps (``direct_routes``, which the sidecar dispatches before Starlette's router),
and requests go through the lean keep-alive pool of the ``UpstreamClient`` that
``upstream_client()`` makes (``gatekeeper.proxy.upstream``); a plain
``httpx.AsyncClient`` also works, at several times the CPU per request.

``Proxy.answer_now`` (each forwarding route's, ``relay.AnswerNow``) is the usual case
without a task, for a server that offers it a request read whole (the sidecar's HTTP
protocol): a JSON body asking for a whole answer, a model the resolver has ready workers
for at once (``Resolver.ready``), and an idle pooled connection to the chosen one. The
request goes out on that connection from the caller's callback and the answer is sent
from the connection's (``upstream.Exchange``), with the same routing, alias rewrite,
cancellation, errors, report and metrics as ``forward``'s; a connection found closed
unanswered hands the request back to ``forward``, which sends it again once. Anything
else (a stream, a form, a body to refuse, a model to launch or wait for) is declined
and ``forward`` answers it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gatekeeper.proxy.headers import answer_headers, request_headers
from gatekeeper.proxy.httpx_pool import httpx_answer, pool_for
from gatekeeper.proxy.protocol import (
    FORM_ROUTES,
    JSON_ROUTES,
    bad_request,
    error_response,
    form_boundary,
    form_field,
    too_large,
    upstream_failed,
)
from gatekeeper.proxy.relay import DisconnectWatch, Outcome, Reply, StreamRelay, WholeAnswer
from gatekeeper.proxy.upstream import (
    WHOLE_ANSWER_LIMIT_BYTES,
    Answer,
    Exchange,
    Upstream,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResponse,
)

__all__ = [
    "DEFAULT_MAX_WHOLE_ANSWER_BYTES",
    "LAUNCH_GUARD",
    "ChatCompletionRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "Endpoint",
    "FormRequest",
    "NoMetrics",
    "Proxy",
    "ProxyMetrics",
    "Resolver",
    "RouteError",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
CLIENT_CLOSED = 499
"""Status observed for a request the client abandoned (nginx's convention)."""

DEFAULT_MAX_WHOLE_ANSWER_BYTES = WHOLE_ANSWER_LIMIT_BYTES
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


class OpenAIRequest(BaseModel):
    """The fields the proxy reads; every other field goes to the worker unchanged."""

    model_config = ConfigDict(extra="allow")

    model: str
    stream: bool | None = None


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``."""


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""


class EmbeddingRequest(OpenAIRequest):
    """``POST /v1/embeddings``."""


class FormRequest(OpenAIRequest):
    """A ``multipart/form-data`` request (``/v1/audio/transcriptions``): ``model`` is a
    form field; ``body`` and ``span`` let an alias be replaced in place."""

    body: bytes = b""
    span: tuple[int, int] = (0, 0)

    def renamed(self, served_name: str) -> bytes:
        start, end = self.span
        return self.body[:start] + served_name.encode() + self.body[end:]


class _Failed(Exception):
    """An error response to send instead of forwarding."""

    def __init__(self, response: Response) -> None:
        self.response = response


class Proxy:
    """The OpenAI routes, forwarding to workers through the client's pool (``pool_for``)."""

    def __init__(
        self,
        resolver: Resolver,
        client: httpx.AsyncClient,
        *,
        metrics: ProxyMetrics | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_whole_answer_bytes: int = DEFAULT_MAX_WHOLE_ANSWER_BYTES,
    ) -> None:
        self._resolver = resolver
        self._upstream = pool_for(client)
        self._now = self._upstream if isinstance(self._upstream, Upstream) else None
        self._client = client
        self._metrics: ProxyMetrics = metrics if metrics is not None else NoMetrics()
        self._max_body_bytes = max_body_bytes
        self._max_whole_bytes = max_whole_answer_bytes
        self._outstanding: dict[str, int] = {}

    def routes(self) -> list[Route]:
        kinds = {
            "/v1/chat/completions": ChatCompletionRequest,
            "/v1/completions": CompletionRequest,
            "/v1/embeddings": EmbeddingRequest,
        }
        posts = [
            Route(path, _Forward(self, path, kinds.get(path, OpenAIRequest)), methods=["POST"])
            for path in JSON_ROUTES
        ]
        forms = [Route(p, _Forward(self, p, FormRequest), methods=["POST"]) for p in FORM_ROUTES]
        stored = "/v1/responses/{response_id}"
        return [
            *posts,
            *forms,
            Route(stored, self.by_query, methods=["GET"]),
            Route(stored + "/cancel", self.by_query, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/v1/models/{model_id}", self.model_card, methods=["GET"]),
            Route("/v1/models/{org}/{model_id}", self.model_card, methods=["GET"]),
        ]

    def outstanding(self, worker_id: str) -> int:
        """Requests in flight to ``worker_id`` through this proxy (a drain waits for 0)."""
        return self._outstanding.get(worker_id, 0)

    def direct_routes(self) -> dict[str, ASGIApp]:
        """The forwarding POST routes by exact path, as bare ASGI apps, for a dispatcher
        in front of the router (the sidecar's ``HttpGuard``)."""
        return {r.path: r.app for r in self.routes() if isinstance(r.app, _Forward)}

    async def list_models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": await self._resolver.models()})

    async def model_card(self, request: Request) -> Response:
        """``GET /v1/models/{id}`` (an id may be ``ORG/NAME``): the one card, or the 404."""
        model_id = "/".join(request.path_params.values())
        cards = await self._resolver.models()
        for wanted in dict.fromkeys((model_id, self._resolver.canonical(model_id))):
            for card in cards:
                if card.get("id") == wanted:
                    return JSONResponse(card)
        message = f"The model `{model_id}` does not exist. GET /v1/models lists the names."
        return error_response(404, message, param="model", code="model_not_found")

    async def by_query(self, request: Request) -> ASGIApp:
        """``/v1/responses/{id}`` (``GET``, ``POST …/cancel``): vLLM keeps a stored
        response in the worker that made it, and nothing in these requests names the
        model, so the client says it with ``?model=``; the worker's answer comes back
        whole, or relayed as it comes when larger than ``max_whole_answer_bytes``."""
        model = request.query_params.get("model")
        if not model:
            message = (
                f"{request.method} {request.url.path} names no model, and the sidecar routes "
                "by model: add the query parameter ?model=<the model that made the response> "
                "(openai client: extra_query={'model': ...})."
            )
            return error_response(400, message, param="model", code="missing_model")
        try:
            endpoint = (await self._candidates(model))[0]
        except _Failed as failed:
            return failed.response
        query = request.url.query
        url = f"{endpoint.base_url}{request.url.path}" + (f"?{query}" if query else "")
        sent = self._client.build_request(request.method, url, timeout=30.0)
        try:
            response = await self._client.send(sent, stream=True)
        except httpx.HTTPError as e:
            return upstream_failed(endpoint.worker_id, e)
        try:
            answer = await httpx_answer(response)
            content = await answer.read_within(self._max_whole_bytes)
        except UpstreamError as e:
            await response.aclose()
            return upstream_failed(endpoint.worker_id, e)
        headers = _response_headers(answer)
        if content is None:  # too large to hold: relayed as it comes
            return StreamRelay(answer, headers, _unreported, events=False)
        await answer.aclose()
        length = (b"content-length", str(len(content)).encode())
        return WholeAnswer(answer.status, [*headers, length], content)

    async def forward(
        self, scope: Scope, receive: Receive, path: str, kind: type[OpenAIRequest]
    ) -> ASGIApp:
        """The answer to one OpenAI POST: an error, the worker's answer, or its stream."""
        start = time.perf_counter()
        model = "-"
        try:
            body = await self._read_body(scope, receive)
            parsed = _parse(body, kind, scope)
            model = parsed.model
            candidates = await self._candidates(model, scope.get(LAUNCH_GUARD))
        except _Failed as failed:
            self._metrics.observe(model, failed.response.status_code, time.perf_counter() - start)
            return failed.response
        headers = request_headers(scope["headers"])
        for endpoint in candidates:
            payload = body if endpoint.served_name == model else _rewrite(parsed, endpoint)
            call = _Call(self, endpoint, model, start)
            response = await call.send(path, payload, headers, scope, receive, parsed.stream)
            if response is not None:
                return response
        message = (
            f"The worker {endpoint.worker_id} for {model!r} refused the connection "
            f"({endpoint.base_url}). It may have exited; retry, and see the worker's log."
        )
        self._metrics.observe(model, 502, time.perf_counter() - start)
        return error_response(502, message, code="worker_refused_connection")

    def answer_now(
        self, scope: Scope, body: bytes, path: str, kind: type[OpenAIRequest], reply: Reply
    ) -> bool:
        """``forward``'s usual case without a task (``relay.AnswerNow``): a JSON body
        asking for a whole answer, a ready worker with an idle pooled connection. The
        request goes out at once and the worker's whole answer is sent from the
        connection's callback, with the same report and metrics as ``forward``'s; False,
        with nothing done, for anything else (``forward`` answers it)."""
        if self._now is None or kind is FormRequest or len(body) > self._max_body_bytes:
            return False
        start = time.perf_counter()
        try:
            parsed = _parse(body, kind, scope)
        except _Failed:
            return False
        model = parsed.model
        ready = None if parsed.stream else self._resolver.ready(model)
        if not ready:
            return False
        endpoint = _least_busy_first(ready, self._outstanding)[0]
        payload = body if endpoint.served_name == model else _rewrite(parsed, endpoint)
        headers = request_headers(scope["headers"])
        return _Call(self, endpoint, model, start).now(self._now, path, payload, headers, reply)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self._max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > limit:
                    raise _Failed(too_large(limit))
                break
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Failed(Response(status_code=CLIENT_CLOSED))
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Failed(too_large(limit))
            chunks.append(chunk)
            more = message.get("more_body", False)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _candidates(
        self, model: str, launch_guard: Callable[[str], Response] | None = None
    ) -> list[Endpoint]:
        try:
            if launch_guard is None:
                endpoints = await self._resolver.endpoints(model)
            else:  # ready workers only: no launch, no wait (LAUNCH_GUARD)
                resolver = self._resolver
                endpoints = resolver.ready(model) or resolver.ready(resolver.canonical(model)) or []
                if not endpoints:
                    raise _Failed(launch_guard(model))
        except RouteError as e:
            raise _Failed(
                error_response(
                    e.status,
                    e.message,
                    type=e.type,
                    param=e.param,
                    code=e.code,
                    retry_after=e.retry_after,
                    should_retry=e.should_retry,
                )
            ) from e
        if not endpoints:
            message = f"No worker serving `{model}` is ready. Retry in a moment."
            raise _Failed(error_response(503, message, code="model_loading", retry_after=1.0))
        return _least_busy_first(endpoints, self._outstanding)


def _least_busy_first(endpoints: list[Endpoint], outstanding: dict[str, int]) -> list[Endpoint]:
    """The workers by requests in flight through this proxy, fewest first; ties keep the
    resolver's order (``sorted`` is stable)."""
    if len(endpoints) == 1:
        return endpoints
    return sorted(endpoints, key=lambda e: outstanding.get(e.worker_id, 0))


def _parse(body: bytes, kind: type[OpenAIRequest], scope: Scope) -> OpenAIRequest:
    if kind is FormRequest:
        return _parse_form(body, scope)
    try:
        parsed = kind.model_validate_json(body)
    except ValidationError as e:
        raise _Failed(bad_request(e)) from e
    if parsed.model_extra and logger.isEnabledFor(logging.DEBUG):
        logger.debug("Fields passed to the worker unchecked: %s", sorted(parsed.model_extra))
    return parsed


def _parse_form(body: bytes, scope: Scope) -> FormRequest:
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    boundary = form_boundary(content_type)
    field = form_field(body, boundary, "model") if boundary else None
    if field is None or not field.value:
        what = "has no 'model' field" if boundary else "is not multipart/form-data"
        message = (
            f"Invalid request: the body {what}. Send multipart/form-data with a 'file' "
            "and a 'model' field (the sidecar routes by it; GET /v1/models lists the names)."
        )
        raise _Failed(error_response(400, message, param="model"))
    stream = form_field(body, boundary, "stream") if boundary else None
    return FormRequest(
        model=field.value,
        stream=stream is not None and stream.value.strip().lower() == "true",
        body=body,
        span=(field.start, field.end),
    )


def _rewrite(parsed: OpenAIRequest, endpoint: Endpoint) -> bytes:
    """The body with the alias replaced by the worker's served name."""
    if isinstance(parsed, FormRequest):
        return parsed.renamed(endpoint.served_name)
    renamed = parsed.model_copy(update={"model": endpoint.served_name})
    return renamed.model_dump_json(exclude_unset=True).encode()


def _unreported(outcome: Outcome) -> None:
    """``by_query``'s relay reports nothing (no request is counted in flight for it)."""


def _is_sse(upstream: Answer) -> bool:
    return (upstream.header(b"content-type") or b"").startswith(b"text/event-stream")


def _response_headers(upstream: Answer) -> list[tuple[bytes, bytes]]:
    return answer_headers(upstream.headers)


class _Forward:
    """One OpenAI POST route, as a bare ASGI app (no ``Request`` on the hot path)."""

    __slots__ = ("_kind", "_path", "_proxy")

    def __init__(self, proxy: Proxy, path: str, kind: type[OpenAIRequest]) -> None:
        self._proxy = proxy
        self._path = path
        self._kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self._proxy.forward(scope, receive, self._path, self._kind)
        await response(scope, receive, send)

    def answer_now(self, scope: Scope, body: bytes, reply: Reply) -> bool:
        """``relay.AnswerNow``: the usual case without a task (``Proxy.answer_now``)."""
        return self._proxy.answer_now(scope, body, self._path, self._kind, reply)


class _Call:
    """One try at one worker, and the single report at its end."""

    __slots__ = ("_endpoint", "_exchange", "_model", "_proxy", "_reply", "_start", "_status")

    def __init__(self, proxy: Proxy, endpoint: Endpoint, model: str, start: float) -> None:
        self._proxy = proxy
        self._endpoint = endpoint
        self._model = model
        self._start = start
        self._status = CLIENT_CLOSED
        self._exchange: Exchange | None = None
        self._reply: Reply | None = None

    def _leave(self) -> None:
        proxy, worker_id = self._proxy, self._endpoint.worker_id
        left = proxy._outstanding[worker_id] - 1
        if left:
            proxy._outstanding[worker_id] = left
        else:
            del proxy._outstanding[worker_id]

    def _finish(self, outcome: Outcome) -> None:
        proxy = self._proxy
        self._leave()
        proxy._resolver.report(self._endpoint, outcome)
        if outcome != "connect_error":
            status = CLIENT_CLOSED if outcome == "cancelled" else self._status
            proxy._metrics.observe(self._model, status, time.perf_counter() - self._start)

    # Without a task (Proxy.answer_now): the exchange's callbacks (upstream.AnswerSink)
    # and the client's going, each of which ends the call once.

    def now(
        self,
        pool: Upstream,
        path: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        reply: Reply,
    ) -> bool:
        """Send on an idle pooled connection and answer through ``reply``; False, nothing
        sent, when the worker has none idle."""
        proxy, endpoint = self._proxy, self._endpoint
        self._reply = reply
        exchange = pool.post_now(
            endpoint.base_url, path, body, headers, self, limit_bytes=proxy._max_whole_bytes
        )
        if exchange is None:
            return False
        self._exchange = exchange
        proxy._outstanding[endpoint.worker_id] = proxy._outstanding.get(endpoint.worker_id, 0) + 1
        reply.watch_disconnect(self._gone)
        return True

    def answered(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        reply = self._ended()
        self._status = status
        self._finish("upstream_error" if status >= 500 else "ok")
        kept = answer_headers(headers)
        reply.respond(status, [*kept, (b"content-length", str(len(body)).encode())], body)

    def failed(self, error: UpstreamClosed) -> None:
        reply = self._ended()
        self._status = 502
        self._finish("upstream_error")
        answer = upstream_failed(self._endpoint.worker_id, error)
        reply.respond(answer.status_code, answer.raw_headers, bytes(answer.body))

    def stale(self) -> None:
        """The pooled connection had closed: the request goes the usual way, which sends
        it again once on a new connection (``forward``), reported there."""
        reply = self._ended()
        self._leave()
        reply.fall_back()

    def large(self, answer: UpstreamResponse) -> None:
        """The answer is larger than the proxy holds whole: relayed as it comes, by a task."""
        reply = self._ended()
        self._status = answer.status
        reply.run(StreamRelay(answer, _response_headers(answer), self._finish, events=False))

    def _gone(self) -> None:
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.cancel()
            self._finish("cancelled")

    def _ended(self) -> Reply:
        reply = self._reply
        assert reply is not None
        self._exchange = None
        reply.watch_disconnect(None)
        return reply

    async def send(
        self,
        path: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        scope: Scope,
        receive: Receive,
        stream: bool | None,
    ) -> ASGIApp | None:
        """The response for the client; None when the worker refused the connection."""
        proxy, endpoint = self._proxy, self._endpoint
        proxy._outstanding[endpoint.worker_id] = proxy._outstanding.get(endpoint.worker_id, 0) + 1
        watch = DisconnectWatch(receive, scope)
        answer: Answer | None = None
        try:
            answer = await proxy._upstream.request(endpoint.base_url, path, body, headers)
            self._status = answer.status
            events = bool(stream) and answer.status == 200 and _is_sse(answer)
            content = None if events else await answer.read_within(proxy._max_whole_bytes)
            if content is None:  # a stream, or too large to hold: relayed as it comes
                headers = _response_headers(answer)
                relay, answer = StreamRelay(answer, headers, self._finish, events=events), None
                return relay
        except UpstreamConnectError:
            self._finish("connect_error")
            return None
        except UpstreamError as e:
            self._status = 502
            self._finish("upstream_error")
            return upstream_failed(endpoint.worker_id, e)
        except asyncio.CancelledError:
            self._finish("cancelled")
            watch.absorb()
            return Response(status_code=CLIENT_CLOSED)
        finally:
            watch.stop()
            if answer is not None:
                await answer.aclose()
        self._finish("upstream_error" if answer.status >= 500 else "ok")
        length = (b"content-length", str(len(content)).encode())
        return WholeAnswer(answer.status, [*_response_headers(answer), length], content)
