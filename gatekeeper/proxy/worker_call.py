"""One try of a request at one worker, and the single report at its end.

``WorkerCalls`` is what every call shares: the pool to the workers, the bound on an
answer held whole, the requests in flight per worker (the least-busy choice reads them,
a drain waits for 0) and where each call's end goes (``Resolver.report`` and
``ProxyMetrics.observe``). A ``WorkerCall`` counts itself in flight while it lasts and
ends once, however it ends: answered, failed, cancelled by the client, or refused the
connection (not observed: the proxy tries the next worker).

It runs two ways: ``send`` in the request's task (``Proxy.forward``), or ``now`` without
one (``Proxy.answer_now``), the worker's answer then arriving through the exchange's
callbacks (``upstream.AnswerSink``) and the client's going through ``Reply``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope

from gatekeeper.proxy.headers import answer_headers
from gatekeeper.proxy.protocol import CLIENT_CLOSED, upstream_failed
from gatekeeper.proxy.relay import DisconnectWatch, Outcome, Reply, StreamRelay, WholeAnswer
from gatekeeper.proxy.resolver import Endpoint, ProxyMetrics, Resolver
from gatekeeper.proxy.upstream import (
    Answer,
    Exchange,
    Upstream,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
)

__all__ = ["WorkerCall", "WorkerCalls", "response_headers"]


@dataclass(slots=True, eq=False)
class WorkerCalls:
    """What the calls of one proxy share."""

    upstream: UpstreamPool
    resolver: Resolver
    metrics: ProxyMetrics
    max_whole_bytes: int
    outstanding: dict[str, int] = field(default_factory=dict)
    """Requests in flight per worker id; a worker with none has no entry."""


def response_headers(upstream: Answer) -> list[tuple[bytes, bytes]]:
    return answer_headers(upstream.headers)


def _is_sse(upstream: Answer) -> bool:
    return (upstream.header(b"content-type") or b"").startswith(b"text/event-stream")


class WorkerCall:
    """One try at one worker, and the single report at its end."""

    __slots__ = ("_calls", "_endpoint", "_exchange", "_model", "_reply", "_start", "_status")

    def __init__(self, calls: WorkerCalls, endpoint: Endpoint, model: str, start: float) -> None:
        self._calls = calls
        self._endpoint = endpoint
        self._model = model
        self._start = start
        self._status = CLIENT_CLOSED
        self._exchange: Exchange | None = None
        self._reply: Reply | None = None

    def _enter(self) -> None:
        outstanding, worker_id = self._calls.outstanding, self._endpoint.worker_id
        outstanding[worker_id] = outstanding.get(worker_id, 0) + 1

    def _leave(self) -> None:
        outstanding, worker_id = self._calls.outstanding, self._endpoint.worker_id
        left = outstanding[worker_id] - 1
        if left:
            outstanding[worker_id] = left
        else:
            del outstanding[worker_id]

    def _finish(self, outcome: Outcome) -> None:
        calls = self._calls
        self._leave()
        calls.resolver.report(self._endpoint, outcome)
        if outcome != "connect_error":
            status = CLIENT_CLOSED if outcome == "cancelled" else self._status
            calls.metrics.observe(self._model, status, time.perf_counter() - self._start)

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
        calls, endpoint = self._calls, self._endpoint
        self._reply = reply
        exchange = pool.post_now(
            endpoint.base_url, path, body, headers, self, limit_bytes=calls.max_whole_bytes
        )
        if exchange is None:
            return False
        self._exchange = exchange
        self._enter()
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
        reply.run(StreamRelay(answer, response_headers(answer), self._finish, events=False))

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
        calls, endpoint = self._calls, self._endpoint
        self._enter()
        watch = DisconnectWatch(receive, scope)
        answer: Answer | None = None
        try:
            answer = await calls.upstream.request(endpoint.base_url, path, body, headers)
            self._status = answer.status
            events = bool(stream) and answer.status == 200 and _is_sse(answer)
            content = None if events else await answer.read_within(calls.max_whole_bytes)
            if content is None:  # a stream, or too large to hold: relayed as it comes
                headers = response_headers(answer)
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
        return WholeAnswer(answer.status, response_headers(answer), content)
