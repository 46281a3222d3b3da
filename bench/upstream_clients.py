"""What each HTTP client for the proxy's worker connection costs in CPU.

The client that ``gatekeeper.proxy`` forwards through (its calls to the worker) could be
the hand-written one in ``gatekeeper/proxy/upstream.py`` (``upstream_client().pool``),
aiohttp's ``ClientSession`` or httpx's ``AsyncClient``. This bench starts one simulator
worker (``GATEKEEPER_SIM_TOKEN_SECONDS=0``, 16 tokens an answer) and measures each client
in turn (interleaved, the order rotating round by round), each time in a fresh process
on uvloop when it is installed (as ``gatekeeper serve`` runs under uvicorn), two ways:

- client alone: the process POSTs a chat completion body already in memory and reads
  the answer whole, or chunk by chunk as it arrives (a stream), on keep-alive
  connections, one at a time and then 16 at once; its CPU time
  (``time.process_time``) per request;
- proxied: the process is a minimal proxy (a bare ASGI app under uvicorn, httptools)
  that forwards each request through the client and relays the answer (a stream chunk
  by chunk); the bench's own load generator sends to it one request at a time, and the
  proxy process's CPU time per request is read from ``/proc``. The server side costs
  the same for all three clients, so the differences are the clients'.

Run ``python -m bench.upstream_clients`` (``--quick`` for a short run). aiohttp is
installed by ``scripts/bench-deps.sh``; a client that is missing is named and skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.proxy_targets import Connection, child, cpu_seconds
from bench.serve_process import free_port

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16'
WHOLE = BODY + b"}"
STREAM = BODY + b', "stream": true}'
PATH = "/v1/chat/completions"
HEADERS = [(b"content-type", b"application/json")]
CLIENTS = ("upstream.py", "aiohttp", "httpx")
CONCURRENCY = 16

_Head = tuple[int, list[tuple[bytes, bytes]]]
Exchange = Callable[[bytes], AbstractAsyncContextManager[tuple[_Head, AsyncIterator[bytes]]]]
"""POSTs a body to the worker: (status, content headers) and the body's chunks."""
Client = tuple[Exchange, Callable[[], Awaitable[None]]]
"""An exchange and how to close the client."""
RELAYED = (b"content-type", b"content-length")


# --- the three clients ---------------------------------------------------------------------


def _upstream(base: str) -> Client:
    from gatekeeper.proxy import upstream_client

    client = upstream_client()
    pool = client.pool  # the hand-written pool the proxy forwards through

    @asynccontextmanager
    async def exchange(body: bytes) -> AsyncIterator[tuple[_Head, AsyncIterator[bytes]]]:
        answer = await pool.request(base, PATH, body, HEADERS)
        try:
            headers = [(k, v) for k, v in answer.headers if k in RELAYED]
            yield (answer.status, headers), answer.chunks()
        finally:
            await answer.aclose()

    return exchange, client.aclose


def _aiohttp(base: str) -> Client:
    aiohttp = _aiohttp_module()

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    session = aiohttp.ClientSession(
        base_url=base, connector=connector, auto_decompress=False, trust_env=False
    )
    sent = {k.decode(): v.decode() for k, v in HEADERS}

    @asynccontextmanager
    async def exchange(body: bytes) -> AsyncIterator[tuple[_Head, AsyncIterator[bytes]]]:
        async with session.post(PATH, data=body, headers=sent) as answer:
            raw = answer.raw_headers
            headers = [(k.lower(), v) for k, v in raw if k.lower() in RELAYED]
            yield (int(answer.status), headers), answer.content.iter_any()

    return exchange, session.close


def _aiohttp_module() -> Any:
    """aiohttp, imported by name: it is in the bench extra only, and ``make test`` type-checks
    bench/ where it may not be installed."""
    return importlib.import_module("aiohttp")


def _httpx(base: str) -> Client:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    client = httpx.AsyncClient(base_url=base, limits=limits, timeout=None, trust_env=False)

    @asynccontextmanager
    async def exchange(body: bytes) -> AsyncIterator[tuple[_Head, AsyncIterator[bytes]]]:
        request = client.build_request("POST", PATH, content=body, headers=HEADERS)
        answer = await client.send(request, stream=True)
        try:
            headers = [(k.lower(), v) for k, v in answer.headers.raw if k.lower() in RELAYED]
            yield (answer.status_code, headers), answer.aiter_raw()
        finally:
            await answer.aclose()

    return exchange, client.aclose


MAKERS: dict[str, Callable[[str], Client]] = {
    "upstream.py": _upstream,
    "aiohttp": _aiohttp,
    "httpx": _httpx,
}


# --- in the measured process ---------------------------------------------------------------


async def _cpu_per_request(exchange: Exchange, body: bytes, n: int, at_once: int) -> float:
    async def worker(count: int) -> None:
        for _ in range(count):
            async with exchange(body) as ((status, _), chunks):
                async for _ in chunks:
                    pass
            assert status == 200, status

    await asyncio.gather(*(worker(5) for _ in range(at_once)))  # connections, imports
    start = time.process_time()
    await asyncio.gather(*(worker(n // at_once) for _ in range(at_once)))
    return (time.process_time() - start) / (n // at_once * at_once)


async def _alone(kind: str, base: str, n: int) -> dict[str, float]:
    exchange, close = MAKERS[kind](base)
    try:
        return {
            "whole": await _cpu_per_request(exchange, WHOLE, n, 1),
            "stream": await _cpu_per_request(exchange, STREAM, n, 1),
            "whole16": await _cpu_per_request(exchange, WHOLE, n, CONCURRENCY),
            "stream16": await _cpu_per_request(exchange, STREAM, n, CONCURRENCY),
        }
    finally:
        await close()


def alone(kind: str, base: str, n: int) -> None:
    """The ``alone`` subcommand: measure ``kind`` and print the figures as JSON."""
    if importlib.util.find_spec("uvloop"):
        import uvloop

        print(json.dumps(uvloop.run(_alone(kind, base, n))))
    else:
        print(json.dumps(asyncio.run(_alone(kind, base, n))))


def proxy_app(make: Callable[[], Client]) -> Callable[..., Awaitable[None]]:
    """A bare ASGI proxy: each request's body to the worker, the answer relayed as it
    comes (``GET /health`` answers 200 itself); the client is made on the first request,
    in the server's event loop."""
    made: list[Exchange] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        if not made:
            made.append(make()[0])
        async with made[0](body) as ((status, headers), chunks):
            await send({"type": "http.response.start", "status": status, "headers": headers})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def serve_proxy(kind: str, base: str, port: int) -> None:
    """The ``proxy`` subcommand: the bare proxy on ``port`` through ``kind``."""
    import uvicorn

    app = proxy_app(lambda: MAKERS[kind](base))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- the bench ---------------------------------------------------------------------------------


@contextmanager
def simulator(work: Path) -> Iterator[str]:
    """A simulator worker serving model ``m`` without token delays, until the block ends."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env |= {"GATEKEEPER_SIM_STARTUP_SECONDS": "0.2", "GATEKEEPER_SIM_TOKEN_SECONDS": "0"}
    argv = [sys.executable, "-m", "gatekeeper.simulator", "serve", "m"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    with child(argv, port, "/health", work / "simulator.log", env):
        yield f"http://127.0.0.1:{port}"


def measure_alone(kind: str, base: str, n: int) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.upstream_clients", "alone", kind, base, str(n)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind}: exit {done.returncode}\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


async def _drive(port: int, pid: int, n: int) -> dict[str, float]:
    conn = await Connection(port).open()
    figures = {}
    try:
        for name, body in (("whole", WHOLE), ("stream", STREAM)):
            for _ in range(20):
                await conn.post(PATH, body)
            cpu = cpu_seconds([pid])
            for _ in range(n):
                status, _, _ = await conn.post(PATH, body)
                assert status == 200, status
            figures[name] = (cpu_seconds([pid]) - cpu) / n
    finally:
        conn.close()
    return figures


def measure_proxied(kind: str, base: str, n: int, work: Path) -> dict[str, float]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.upstream_clients", "proxy", kind, base, str(port)]
    with child(argv, port, "/health", work / f"proxy-{kind}.log") as proxy:
        return asyncio.run(_drive(port, proxy.pid, n))


def table(results: dict[str, list[dict[str, float]]], columns: list[tuple[str, str]]) -> list[str]:
    rows = [f"{'client':<12}" + "".join(f"{title:>12}" for _, title in columns)]
    for kind, runs in results.items():
        cells = [statistics.median(r[key] for r in runs) for key, _ in columns]
        rows.append(f"{kind:<12}" + "".join(f"{1e3 * c:12.3f}" for c in cells))
    return rows


def versions(kinds: list[str]) -> str:
    found: dict[str, Any] = {"httpx": httpx.__version__}
    if "aiohttp" in kinds:
        found["aiohttp"] = _aiohttp_module().__version__
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"{loop}, " + ", ".join(f"{k} {v}" for k, v in found.items())


def main() -> None:
    if sys.argv[1:2] == ["alone"]:
        alone(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    if sys.argv[1:2] == ["proxy"]:
        serve_proxy(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1200, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = 1, 160
    kinds = [k for k in CLIENTS if k != "aiohttp" or importlib.util.find_spec("aiohttp")]
    by_itself: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    proxied: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="gk-bench-clients-") as tmp,
        simulator(Path(tmp)) as base,
    ):
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                by_itself[kind].append(measure_alone(kind, base, args.requests))
                proxied[kind].append(measure_proxied(kind, base, args.requests, Path(tmp)))
    print(
        f"# bench/upstream_clients.py: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"{versions(kinds)}, {time.perf_counter() - start:.0f} s; CPU ms per request, "
        f"16 tokens, median of {args.rounds} rounds x {args.requests} requests"
    )
    if "aiohttp" not in kinds:
        print("# aiohttp not installed: not measured (scripts/bench-deps.sh installs it)")
    print(f"# the client alone, one at a time and {CONCURRENCY} at once")
    columns = [("whole", "whole"), ("stream", "stream"), ("whole16", f"whole x{CONCURRENCY}")]
    print("\n".join(table(by_itself, [*columns, ("stream16", f"stream x{CONCURRENCY}")])))
    print("# proxied: a bare ASGI proxy under uvicorn through the client, its process's CPU")
    print("\n".join(table(proxied, [("whole", "whole"), ("stream", "stream")])))


if __name__ == "__main__":
    main()
