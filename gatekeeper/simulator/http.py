"""The simulator's HTTP surface: vLLM's OpenAI-compatible server, minus the model.

Part of the gatekeeper simulator (``gatekeeper.simulator``), a stand-in for ``vllm
serve`` in rehearsals and tests. ``build_app`` returns a Starlette app serving what
vLLM 0.33 serves, in its shapes: ``GET /health`` and ``GET|POST /ping`` (200, empty),
``GET /v1/models``, ``POST /v1/chat/completions`` and ``/v1/completions`` (plain, or
server-sent events with ``stream: true``: a role chunk for chat, one chunk per token,
the last carrying ``finish_reason``, a usage chunk with
``stream_options.include_usage``, then ``data: [DONE]``), ``POST /v1/embeddings``,
``GET /metrics`` (Prometheus text with ``vllm:`` series) and ``GET /version``; and, with
answers made from the request's words, ``/tokenize``, ``/detokenize``, ``/v1/responses``
(and ``GET /v1/responses/{id}``), ``/score``, ``/rerank`` (``/v1``, ``/v2``),
``/pooling``, ``/classify`` and ``/v1/audio/transcriptions|translations``
(``multipart/form-data``).

The text is deterministic: the words of the prompt (the last user message), cycled,
one word per token, exactly ``max_tokens`` of them (default 16), so ``finish_reason``
is ``"length"``. A model name that is not served is a 404 in OpenAI's error shape. A
client that goes away stops the generation and logs ``request <id> cancelled by
client``. With ``crash_after_requests=N`` the N-th generation request calls ``crash``
after half its tokens. ``HangApp`` accepts connections and never answers.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

__all__ = ["SIMULATOR_NOTE", "HangApp", "ServingConfig", "ServingCounters", "build_app"]

SIMULATOR_NOTE = "gatekeeper simulator, not vLLM"
DEFAULT_MAX_TOKENS = 16
EMBEDDING_DIMENSIONS = 64
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, math.inf)  # fmt: skip
"""vLLM's buckets of ``vllm:time_to_first_token_seconds`` (the first sixteen)."""

Kind = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """What the server answers with; ``log`` writes one APIServer log line."""

    model: str
    served_model_names: tuple[str, ...]
    max_model_len: int
    token_seconds: float
    simulated_version: str
    log: Callable[[str], None]
    crash: Callable[[], None]
    stopping: Callable[[], bool] = lambda: False
    crash_after_requests: int | None = None
    kv_cache_tokens: int = 0
    cache_config: Mapping[str, str] = field(default_factory=dict)
    until_awake: Callable[[], Awaitable[object]] | None = None
    """Waits while the worker sleeps (``sleep.SleepMode``): requests are kept, not run."""
    routes: tuple[Route, ...] = ()
    """More routes (the sleep mode's, with ``VLLM_SERVER_DEV_MODE=1``)."""


@dataclass(slots=True)
class ServingCounters:
    """Request counts, read by ``/metrics``."""

    started: int = 0
    running: int = 0
    tokens_in_use: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    first_token: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    """Cumulative counts of ``vllm:time_to_first_token_seconds`` per bucket of ``TTFT_BUCKETS``."""
    first_token_seconds: float = 0.0

    def observe_first_token(self, seconds: float) -> None:
        for i, bound in enumerate(TTFT_BUCKETS):
            self.first_token[i] += int(seconds <= bound)
        self.first_token_seconds += seconds


class ApiError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param}
        return JSONResponse({"error": {**error, "code": self.status}}, status_code=self.status)


@dataclass(slots=True)
class _Generation:
    """One chat or completion request, parsed."""

    kind: Kind
    request_id: str
    model: str
    words: list[str]
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool

    def token(self, i: int) -> str:
        word = self.words[i % len(self.words)]
        return word if i == 0 else f" {word}"

    def usage(self) -> dict[str, Any]:
        total = self.prompt_tokens + self.max_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": total,
            "completion_tokens": self.max_tokens,
            "prompt_tokens_details": None,
        }


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(str(p) for p in parts)
    return ""


def _prompt(kind: Kind, body: dict[str, Any]) -> tuple[list[str], int]:
    """The words to echo and the prompt's token count."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: a non-empty list is required", "BadRequestError")
        texts = [_message_text(m.get("content")) for m in messages if isinstance(m, dict)]
        users = [_message_text(m.get("content")) for m in messages if m.get("role") == "user"]
        words = (users[-1] if users else texts[-1]).split()
        return words or ["simulated"], sum(len(t.split()) + 4 for t in texts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, list):
        prompt = " ".join(str(t) for t in prompt)
    if not isinstance(prompt, str | int):
        raise ApiError(400, "prompt: a string or a list is required", "BadRequestError")
    words = str(prompt).split()
    return words or ["simulated"], max(1, len(words))


class _Server:
    def __init__(self, config: ServingConfig, counters: ServingCounters) -> None:
        self.config = config
        self.counters = counters
        self.created = int(time.time())

    def check_model(self, body: dict[str, Any]) -> str:
        model = body.get("model") or self.config.served_model_names[0]
        if model not in self.config.served_model_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return str(model)

    def parse(self, kind: Kind, body: dict[str, Any]) -> _Generation:
        model = self.check_model(body)
        words, prompt_tokens = _prompt(kind, body)
        room = self.config.max_model_len - prompt_tokens
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = min(DEFAULT_MAX_TOKENS, room) if requested is None else requested
        if not isinstance(max_tokens, int) or max_tokens < 1 or max_tokens > room:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {self.config.max_model_len} tokens and "
                f"your request has {prompt_tokens} input tokens ({max_tokens} > "
                f"{self.config.max_model_len} - {prompt_tokens}).",
                "BadRequestError",
                "max_tokens",
            )
        options = body.get("stream_options") or {}
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return _Generation(
            kind=kind,
            request_id=f"{prefix}-{uuid.uuid4().hex}",
            model=model,
            words=words,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        )

    async def tokens(self, g: _Generation, request: Request | None) -> AsyncIterator[str]:
        """The tokens, paced; stops when the client goes (cancelled, or polled when
        ``request`` is given), crashes on the chosen request."""
        if self.config.until_awake is not None:
            await self.config.until_awake()
        counters = self.counters
        counters.started += 1
        crash_at = g.max_tokens // 2 if counters.started == self.config.crash_after_requests else -1
        counters.running += 1
        counters.prompt_tokens += g.prompt_tokens
        counters.tokens_in_use += g.prompt_tokens
        done = 0
        start = time.monotonic()
        try:
            for i in range(g.max_tokens):
                if i == crash_at:
                    self.config.crash()
                await asyncio.sleep(self.config.token_seconds)
                if request is not None and await request.is_disconnected():
                    self._aborted(g, done)
                    return
                done += 1
                if done == 1:
                    counters.observe_first_token(time.monotonic() - start)
                counters.generation_tokens += 1
                counters.tokens_in_use += 1
                yield g.token(i)
            counters.finished["length"] = counters.finished.get("length", 0) + 1
        except asyncio.CancelledError:
            self._aborted(g, done)
            raise
        finally:
            counters.running -= 1
            counters.tokens_in_use -= g.prompt_tokens + done

    def _aborted(self, g: _Generation, done: int) -> None:
        self.counters.finished["abort"] = self.counters.finished.get("abort", 0) + 1
        why = "server shutting down" if self.config.stopping() else "cancelled by client"
        self.config.log(f"request {g.request_id} {why} after {done} of {g.max_tokens} tokens")

    def envelope(self, g: _Generation, chunk: bool) -> dict[str, Any]:
        if g.kind == "chat":
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": g.request_id, "object": kind, "created": int(time.time()), "model": g.model}

    def choice(self, g: _Generation, text: str, finish: str | None, role: bool) -> dict[str, Any]:
        base: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if g.kind == "completion":
            return {"text": text, **base, "stop_reason": None}
        delta: dict[str, Any] = (
            {"role": "assistant", "content": text} if role else {"content": text}
        )
        return {"delta": delta, **base} | ({"stop_reason": None} if finish else {})

    async def events(self, g: _Generation) -> AsyncIterator[bytes]:
        def sse(payload: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

        if g.kind == "chat":
            yield sse(self.envelope(g, True) | {"choices": [self.choice(g, "", None, True)]})
        last = g.max_tokens - 1
        i = 0
        async for token in self.tokens(g, None):
            finish = "length" if i == last else None
            yield sse(self.envelope(g, True) | {"choices": [self.choice(g, token, finish, False)]})
            i += 1
        if g.include_usage:
            yield sse(self.envelope(g, True) | {"choices": [], "usage": g.usage()})
        yield b"data: [DONE]\n\n"

    async def complete(self, g: _Generation, request: Request) -> Response:
        text = "".join([t async for t in self.tokens(g, request)])
        if await request.is_disconnected():
            return Response(status_code=499)
        if g.kind == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "tool_calls": [],
                "refusal": None,
            }
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None}
            choice |= {"finish_reason": "length", "stop_reason": None}
        else:
            choice = self.choice(g, text, "length", False)
        return JSONResponse(self.envelope(g, False) | {"choices": [choice], "usage": g.usage()})

    # Endpoints.

    async def generate(self, request: Request, kind: Kind) -> Response:
        try:
            g = self.parse(kind, await _body(request))
        except ApiError as e:
            return e.response()
        if g.stream:
            return StreamingResponse(self.events(g), media_type="text/event-stream")
        return await self.complete(g, request)

    async def chat(self, request: Request) -> Response:
        return await self.generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, "completion")

    async def embeddings(self, request: Request) -> Response:
        try:
            body = await _body(request)
            model = self.check_model(body)
        except ApiError as e:
            return e.response()
        raw = body.get("input")
        inputs = [str(raw)] if not isinstance(raw, list) else [str(x) for x in raw]
        dimensions = int(body.get("dimensions") or EMBEDDING_DIMENSIONS)
        data = []
        for i, text in enumerate(inputs):
            vector: Any = _embedding(text, dimensions)
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
            data.append({"index": i, "object": "embedding", "embedding": vector})
        tokens = sum(len(t.split()) for t in inputs)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        reply = {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": self.created}
        return JSONResponse(reply | {"model": model, "data": data, "usage": usage})

    async def models(self, request: Request) -> Response:
        config = self.config
        card = {"object": "model", "created": self.created, "owned_by": "vllm"}
        card |= {"root": config.model, "parent": None, "max_model_len": config.max_model_len}
        data = [{"id": name, **card} for name in config.served_model_names]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": self.config.simulated_version, "note": SIMULATOR_NOTE})

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(_metrics_text(self.config, self.counters))


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as e:
        raise ApiError(400, f"The request body is not valid JSON: {e}", "BadRequestError") from e
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", "BadRequestError")
    return body


def _embedding(text: str, dimensions: int) -> list[float]:
    digest = b""
    while len(digest) < dimensions:
        digest += hashlib.sha256(digest + text.encode()).digest()
    values = [b / 127.5 - 1.0 for b in digest[:dimensions]]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _metric(name: str, kind: str, help_text: str, samples: list[tuple[str, str, float]]) -> str:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{suffix}{{{labels}}} {value!r}" for suffix, labels, value in samples]
    return "\n".join(lines)


# vLLM's other model routes, answered in vLLM 0.32's shapes from the request's words.


def _texts(value: Any) -> list[str]:
    """The texts of a prompt, input, query, documents or messages field."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v.get("content") if isinstance(v, dict) else v)]
    return [] if value is None else [str(value)]


def _token_ids(text: str) -> list[int]:
    return [int.from_bytes(hashlib.sha256(w.encode()).digest()[:2], "little") for w in text.split()]


def _score(a: str, b: str) -> float:
    return sum(x * y for x, y in zip(_embedding(a, 16), _embedding(b, 16), strict=True))


def _tokenize(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    ids = _token_ids(" ".join(_texts(body.get("prompt") or body.get("messages"))))
    limit = server.config.max_model_len
    return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": None}


def _detokenize(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise ApiError(400, "tokens: a list of token ids is required", "BadRequestError", "tokens")
    return {"prompt": " ".join(f"<{t}>" for t in tokens)}


def _listing(server: _Server, model: str, kind: str, data: list[Any]) -> dict[str, Any]:
    head = {"id": f"{kind}-{uuid.uuid4().hex}", "object": "list", "created": server.created}
    usage = {"prompt_tokens": len(data), "total_tokens": len(data), "completion_tokens": 0}
    return head | {"model": model, "data": data, "usage": usage}


def _scores(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    first = " ".join(_texts(body.get("text_1") or body.get("queries")))
    second = _texts(body.get("text_2") or body.get("documents") or body.get("items"))
    data = [
        {"index": i, "object": "score", "score": _score(first, t)} for i, t in enumerate(second)
    ]
    return _listing(server, model, "score", data)


def _rerank(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    query = " ".join(_texts(body.get("query")))
    documents = _texts(body.get("documents"))
    scored = sorted(((_score(query, d), i, d) for i, d in enumerate(documents)), reverse=True)
    results = [
        {"index": i, "document": {"text": d}, "relevance_score": score} for score, i, d in scored
    ]
    usage = {"total_tokens": sum(len(d.split()) for d in [query, *documents])}
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "usage": usage, "results": results}


def _pooling(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    texts = _texts(body.get("input") or body.get("messages"))
    data = [
        {"index": i, "object": "pooling", "data": _embedding(t, 8)} for i, t in enumerate(texts)
    ]
    return _listing(server, model, "pool", data)


def _classify(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    data = []
    for i, text in enumerate(_texts(body.get("input") or body.get("messages"))):
        p = (_embedding(text, 1)[0] + 1) / 2
        data.append({"index": i, "label": "LABEL_0" if p >= 0.5 else "LABEL_1",
                     "probs": [p, 1 - p], "num_classes": 2})  # fmt: skip
    return _listing(server, model, "classify", data)


def _response(server: _Server, body: dict[str, Any], model: str) -> dict[str, Any]:
    words = " ".join(_texts(body.get("input"))).split() or ["simulated"]
    count = body.get("max_output_tokens") or DEFAULT_MAX_TOKENS
    text = " ".join(words[i % len(words)] for i in range(int(count)))
    content: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    content["logprobs"] = None
    message: dict[str, Any] = {"type": "message", "id": f"msg_{uuid.uuid4().hex}"}
    message["role"] = "assistant"
    message |= {"status": "completed", "content": [content]}
    usage = {"input_tokens": len(words), "output_tokens": int(count)}
    usage |= {"total_tokens": len(words) + int(count)}
    head = {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": server.created}
    return head | {"model": model, "status": "completed", "output": [message], "usage": usage}


_REPLIES: dict[str, Callable[[_Server, dict[str, Any], str], dict[str, Any]]] = {
    "/tokenize": _tokenize,
    "/detokenize": _detokenize,
    "/score": _scores,
    "/v1/score": _scores,
    "/rerank": _rerank,
    "/v1/rerank": _rerank,
    "/v2/rerank": _rerank,
    "/pooling": _pooling,
    "/classify": _classify,
    "/v1/responses": _response,
}


async def _form(request: Request) -> dict[str, Any]:
    """A multipart/form-data body's fields (stdlib ``email``: no python-multipart)."""
    head = b"Content-Type: " + request.headers.get("content-type", "").encode() + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + await request.body())
    if not message.is_multipart():
        raise ApiError(400, "The request body must be multipart/form-data.", "BadRequestError")
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        fields[str(name)] = payload if part.get_filename() else bytes(payload or b"").decode()
    return fields


def _extra_routes(server: _Server) -> list[Route]:
    stored: dict[str, dict[str, Any]] = {}

    async def reply(request: Request) -> Response:
        try:
            body = await _body(request)
            model = server.check_model(body)
            answer = _REPLIES[request.url.path](server, body, model)
        except ApiError as e:
            return e.response()
        if request.url.path == "/v1/responses":
            stored[answer["id"]] = answer
        return JSONResponse(answer)

    async def stored_response(request: Request) -> Response:
        answer = stored.get(request.path_params["response_id"])
        if answer is None:
            return ApiError(404, "Response not found", "NotFoundError", "response_id").response()
        return JSONResponse(answer)

    async def audio(request: Request) -> Response:
        try:
            fields = await _form(request)
            model = server.check_model(fields)
        except ApiError as e:
            return e.response()
        text = f"{len(fields.get('file') or b'')} bytes of audio for {model}"
        if fields.get("stream") != "true":
            return JSONResponse({"text": text, "usage": None})
        head: dict[str, Any] = {"id": f"trsc-{uuid.uuid4().hex}", "object": "transcription.chunk"}
        head |= {"created": server.created, "model": model}
        chunks = [head | {"choices": [{"delta": {"content": w}}]} for w in text.split()]
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
        return Response(b"".join([*events, b"data: [DONE]\n\n"]), media_type="text/event-stream")

    posts = [Route(path, reply, methods=["POST"]) for path in _REPLIES]
    return [
        *posts,
        Route("/v1/responses/{response_id}", stored_response, methods=["GET"]),
        Route("/v1/audio/transcriptions", audio, methods=["POST"]),
        Route("/v1/audio/translations", audio, methods=["POST"]),
    ]


def build_app(config: ServingConfig, counters: ServingCounters | None = None) -> Starlette:
    """The simulator's ASGI app; ``counters`` are shared with the caller if given."""
    server = _Server(config, counters or ServingCounters())
    return Starlette(
        routes=[
            Route("/health", server.health, methods=["GET"]),
            Route("/ping", server.health, methods=["GET", "POST"]),
            Route("/version", server.version, methods=["GET"]),
            Route("/metrics", server.metrics, methods=["GET"]),
            Route("/v1/models", server.models, methods=["GET"]),
            Route("/v1/chat/completions", server.chat, methods=["POST"]),
            Route("/v1/completions", server.completions, methods=["POST"]),
            Route("/v1/embeddings", server.embeddings, methods=["POST"]),
            *_extra_routes(server),
            *config.routes,
        ],
        exception_handlers={404: _not_served, 405: _not_served},
    )


async def _not_served(request: Request, exc: Exception) -> Response:
    """A route the simulator does not serve (vLLM's ``/v1/messages``, ``/v2/embed``…),
    in vLLM's error shape."""
    status = int(getattr(exc, "status_code", 404))
    message = f"The simulator does not serve {request.method} {request.url.path}."
    kind = "NotFoundError" if status == 404 else "Method Not Allowed"
    return ApiError(status, message, kind).response()


def _metrics_text(config: ServingConfig, c: ServingCounters) -> str:
    labels = f'engine="0",model_name="{config.served_model_names[0]}"'
    usage = min(1.0, c.tokens_in_use / config.kv_cache_tokens) if config.kv_cache_tokens else 0.0
    info = ",".join(f'{k}="{v}"' for k, v in sorted(config.cache_config.items()))
    finished = [
        ("_total", f'{labels},finished_reason="{r}"', float(n)) for r, n in c.finished.items()
    ]
    families = [
        ("num_requests_running", "gauge", "Number of requests in model execution batches."),
        ("num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
        ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
        ("cache_config_info", "gauge", "Information of the LLMEngine CacheConfig"),
        ("prompt_tokens", "counter", "Number of prefill tokens processed."),
        ("generation_tokens", "counter", "Number of generation tokens processed."),
        ("request_success", "counter", "Count of successfully processed requests."),
        (
            "time_to_first_token_seconds",
            "histogram",
            "Histogram of time to first token in seconds.",
        ),
    ]
    ttft = [
        ("_bucket", f'{labels},le="{"+Inf" if b == math.inf else b}"', float(n))
        for b, n in zip(TTFT_BUCKETS, c.first_token, strict=True)
    ]
    ttft += [("_sum", labels, c.first_token_seconds), ("_count", labels, float(c.first_token[-1]))]
    samples: list[list[tuple[str, str, float]]] = [
        [("", labels, float(c.running))],
        [("", labels, 0.0)],
        [("", labels, usage)],
        [("", f'{info},engine="0"', 1.0)],
        [("_total", labels, float(c.prompt_tokens))],
        [("_total", labels, float(c.generation_tokens))],
        finished,
        ttft,
    ]
    text = [_metric(f"vllm:{n}", k, h, v) for (n, k, h), v in zip(families, samples, strict=True)]
    return "\n".join(text) + "\n"


class HangApp:
    """Accepts every HTTP request and never answers (``GATEKEEPER_SIM_FAIL=hang``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        await asyncio.Event().wait()
