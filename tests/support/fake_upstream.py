"""A stand-in OpenAI/vLLM worker for the proxy's tests and bench, and a way to run any
ASGI app under uvicorn on loopback in a thread (as httpx's test suite does).

The worker answers chat, completions and embeddings, streaming or not, like vLLM. A
request steers it with an extra ``"fake"`` object in its body:

- ``chunks`` (5): content chunks in a stream; ``delay`` (0): seconds between them;
  ``first_delay`` (0): seconds before the first (or before a whole answer).
- ``fail_after`` (none): die after that many chunks (or mid-body when not streaming),
  so the proxy sees the connection drop.
- ``tag``: a label recorded with the request, to find it in ``requests``/``cancelled``.

It records every request (``requests``: raw body, parsed body, headers) and each request
whose client went away before the end (``cancelled``: tags). ``max_tokens < 0`` is
answered 400 in vLLM's error shape.

``python -m tests.support.fake_upstream --port N`` runs it as its own process (the bench).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp


@dataclass
class Recorded:
    tag: str | None
    path: str
    raw: bytes
    body: dict[str, Any]
    headers: dict[str, str]
    client_port: int


@dataclass
class FakeUpstream:
    """A fake vLLM worker named ``name`` (it signs its answers with it)."""

    name: str
    record: bool = True
    """Keep each request in ``requests`` (off for the bench)."""
    requests: list[Recorded] = field(default_factory=list)
    cancelled: list[str | None] = field(default_factory=list)

    def app(self) -> Starlette:
        routes = [
            Route(path, self._handle, methods=["POST"])
            for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
        ]
        routes.append(Route("/health", lambda _: Response(b""), methods=["GET"]))
        return Starlette(routes=routes)

    def tagged(self, tag: str) -> list[Recorded]:
        return [r for r in self.requests if r.tag == tag]

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        fake = body.get("fake", {})
        tag = fake.get("tag")
        path = request.url.path
        if self.record:
            port = request.client.port if request.client else 0
            self.requests.append(Recorded(tag, path, raw, body, dict(request.headers), port))
        if isinstance(body.get("max_tokens"), int) and body["max_tokens"] < 0:
            error = {"message": "max_tokens must be at least 1, got -1.", "type": "BadRequestError"}
            return JSONResponse({"error": {**error, "param": "max_tokens", "code": 400}}, 400)
        headers = {"x-request-id": f"{self.name}-{len(self.requests)}"}
        if body.get("stream"):
            return StreamingResponse(
                self._events(path, body, fake), media_type="text/event-stream", headers=headers
            )
        if not await self._sleep(request, fake.get("first_delay", 0.0)):
            self.cancelled.append(tag)
            return Response(status_code=499)
        if fake.get("fail_after") is not None:
            return _BrokenBody()
        return JSONResponse(_answer(path, body["model"], self.name), headers=headers)

    async def _sleep(self, request: Request, seconds: float) -> bool:
        """Sleep; False when the client went away meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                return False
            await anyio.sleep(min(0.01, seconds))
        return True

    async def _events(
        self, path: str, body: dict[str, Any], fake: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        finished = False
        try:
            await anyio.sleep(fake.get("first_delay", 0.0))
            for i in range(fake.get("chunks", 5)):
                if i == fake.get("fail_after"):
                    raise RuntimeError("the fake worker crashed mid-stream (on purpose)")
                if i:
                    await anyio.sleep(fake.get("delay", 0.0))
                yield (
                    b"data: "
                    + json.dumps(_chunk(path, body["model"], self.name, i)).encode()
                    + b"\n\n"
                )
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                self.cancelled.append(fake.get("tag"))


class _BrokenBody(Response):
    """Starts a response, sends half of it and dies."""

    def __init__(self) -> None:
        super().__init__()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"id": "cut', "more_body": True})
        raise RuntimeError("the fake worker crashed mid-answer (on purpose)")


def _answer(path: str, model: str, name: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    if path.endswith("embeddings"):
        data = [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5, 1.0]}]
        return {"object": "list", "model": model, "data": data, "usage": usage}
    common = {"id": f"cmpl-{name}", "created": 1, "model": model, "system_fingerprint": name}
    if path.endswith("chat/completions"):
        message = {"role": "assistant", "content": f"hello from {name}"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return {**common, "object": "chat.completion", "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": f"hello from {name}", "finish_reason": "stop"}
    return {**common, "object": "text_completion", "choices": [choice], "usage": usage}


def _chunk(path: str, model: str, name: str, i: int) -> dict[str, Any]:
    common = {"id": f"cmpl-{name}", "created": 1, "model": model, "system_fingerprint": name}
    if path.endswith("chat/completions"):
        choice = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
        return {**common, "object": "chat.completion.chunk", "choices": [choice]}
    choice = {"index": 0, "text": f"t{i} ", "finish_reason": None}
    return {**common, "object": "text_completion", "choices": [choice]}


@contextmanager
def serve_in_thread(app: ASGIApp, **options: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level=options.pop("log_level", "critical"),
        lifespan="auto",
        **options,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: server.started or not thread.is_alive(), 10.0)
        assert server.started, "the test server did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10.0)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the fake OpenAI/vLLM worker.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="fake")
    args = parser.parse_args()
    app = FakeUpstream(args.name, record=False).app()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
