"""The OpenAI-compatible proxy: route each request by its ``model`` to a ready worker.

``Proxy(resolver, client).routes()`` gives the Starlette routes the sidecar mounts: every
``POST`` route of vLLM's API server whose body names the model (``protocol.JSON_ROUTES``,
``/v1/chat/completions``, ``/v1/responses``, ``/tokenize``, ``/rerank``…, and the
``multipart/form-data`` ``protocol.FORM_ROUTES``, ``/v1/audio/transcriptions`` and
``/v1/audio/translations``, whose ``model`` is a form field), ``GET`` and ``POST …/cancel``
of ``/v1/responses/{id}`` routed by a ``?model=`` query parameter (nothing else in them names
the model), ``GET /v1/models`` and ``GET /v1/models/{id}``.

- **Routing.** The body is read and parsed once (``request_body``); its ``model`` goes to
  the ``Resolver``, which answers with the ready workers serving it (launching one on
  demand if it may) or raises ``RouteError`` (``resolver``). The worker with the fewest
  requests in flight through this proxy wins (ties: the resolver's order;
  ``resolver.least_busy``); one that refuses the connection is skipped for the next (each
  try a ``worker_call.WorkerCall``). The body is forwarded byte for byte, and
  re-serialised only when the client used an alias (its ``model`` becomes the worker's
  served name).
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

import time
from collections.abc import Callable

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gatekeeper.proxy.headers import request_headers
from gatekeeper.proxy.httpx_pool import httpx_answer, pool_for
from gatekeeper.proxy.protocol import FORM_ROUTES, JSON_ROUTES, error_response, upstream_failed
from gatekeeper.proxy.relay import Outcome, Reply, StreamRelay, WholeAnswer
from gatekeeper.proxy.request_body import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    FormRequest,
    OpenAIRequest,
    Refused,
    parse,
    read_body,
    rewrite,
)
from gatekeeper.proxy.resolver import (
    LAUNCH_GUARD,
    Endpoint,
    NoMetrics,
    ProxyMetrics,
    Resolver,
    RouteError,
    least_busy,
    least_busy_first,
)
from gatekeeper.proxy.upstream import WHOLE_ANSWER_LIMIT_BYTES, Upstream, UpstreamError
from gatekeeper.proxy.worker_call import WorkerCall, WorkerCalls, response_headers

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_WHOLE_ANSWER_BYTES",
    "Proxy",
]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_WHOLE_ANSWER_BYTES = WHOLE_ANSWER_LIMIT_BYTES


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
        upstream = pool_for(client)
        self._now = upstream if isinstance(upstream, Upstream) else None
        self._client = client
        self._metrics: ProxyMetrics = metrics if metrics is not None else NoMetrics()
        self._max_body_bytes = max_body_bytes
        self._max_whole_bytes = max_whole_answer_bytes
        self._calls = WorkerCalls(upstream, resolver, self._metrics, max_whole_answer_bytes)
        self._outstanding = self._calls.outstanding

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
            endpoint = least_busy(await self._endpoints(model), self._outstanding)
        except Refused as failed:
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
        headers = response_headers(answer)
        if content is None:  # too large to hold: relayed as it comes
            return StreamRelay(answer, headers, _unreported, events=False)
        await answer.aclose()
        return WholeAnswer(answer.status, headers, content)

    async def forward(
        self, scope: Scope, receive: Receive, path: str, kind: type[OpenAIRequest]
    ) -> ASGIApp:
        """The answer to one OpenAI POST: an error, the worker's answer, or its stream."""
        start = time.perf_counter()
        model = "-"
        try:
            body = await read_body(scope, receive, self._max_body_bytes)
            parsed = parse(body, kind, scope)
            model = parsed.model
            endpoints = await self._endpoints(model, scope.get(LAUNCH_GUARD))
        except Refused as failed:
            self._metrics.observe(model, failed.response.status_code, time.perf_counter() - start)
            return failed.response
        headers = request_headers(scope["headers"])
        for endpoint in least_busy_first(endpoints, self._outstanding):
            payload = body if endpoint.served_name == model else rewrite(parsed, endpoint)
            call = WorkerCall(self._calls, endpoint, model, start)
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
            parsed = parse(body, kind, scope)
        except Refused:
            return False
        model = parsed.model
        ready = None if parsed.stream else self._resolver.ready(model)
        if not ready:
            return False
        endpoint = least_busy(ready, self._outstanding)
        payload = body if endpoint.served_name == model else rewrite(parsed, endpoint)
        headers = request_headers(scope["headers"])
        return WorkerCall(self._calls, endpoint, model, start).now(
            self._now, path, payload, headers, reply
        )

    async def _endpoints(
        self, model: str, launch_guard: Callable[[str], Response] | None = None
    ) -> list[Endpoint]:
        try:
            if launch_guard is None:
                endpoints = await self._resolver.endpoints(model)
            else:  # ready workers only: no launch, no wait (LAUNCH_GUARD)
                resolver = self._resolver
                endpoints = resolver.ready(model) or resolver.ready(resolver.canonical(model)) or []
                if not endpoints:
                    raise Refused(launch_guard(model))
        except RouteError as e:
            raise Refused(
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
            raise Refused(error_response(503, message, code="model_loading", retry_after=1.0))
        return endpoints


def _unreported(outcome: Outcome) -> None:
    """``by_query``'s relay reports nothing (no request is counted in flight for it)."""


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
