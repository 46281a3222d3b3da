"""What each HTTP client for the proxy's worker connection costs in CPU.

The client that ``gatekeeper.proxy`` forwards through (its calls to the worker) could be
the hand-written one in ``gatekeeper/proxy/upstream.py`` (``Upstream``), aiohttp's
``ClientSession`` or httpx's ``AsyncClient``. This bench starts one simulator worker
(``GATEKEEPER_SIM_TOKEN_SECONDS=0``) and, for each client in turn (interleaved, the
order rotating round by round), a fresh process that uses it as the proxy would: POST a
chat completion body already in memory, read the answer whole (16 tokens), or stream it
chunk by chunk as it arrives (16 tokens); on keep-alive connections, one request at a
time and then 16 at once. Each process runs on uvloop when it is installed (as
``gatekeeper serve`` does under uvicorn) and reports its own CPU time
(``time.process_time``) per request; the loop and the process around the client cost
the same for all three, so the differences are the clients'.

Run ``python -m bench.upstream_clients`` (``--quick`` for a short run; aiohttp is
installed by ``scripts/bench-deps.sh``; a client that is missing is named and skipped).
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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.proxy_targets import child
from bench.serve_process import free_port

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16'
WHOLE = BODY + b"}"
STREAM = BODY + b', "stream": true}'
PATH = "/v1/chat/completions"
HEADERS = [(b"content-type", b"application/json")]
CLIENTS = ("upstream.py", "aiohttp", "httpx")
CONCURRENCY = 16

Send = Callable[[bytes, bool], Awaitable[int]]
"""Sends one request (body, streamed?) and reads the answer; returns the status."""


# --- one client, in its own process -----------------------------------------------------------


async def _upstream(base: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    from gatekeeper.proxy import upstream_client

    client = upstream_client()
    pool = client.pool  # the hand-written pool the proxy forwards through

    async def send(body: bytes, stream: bool) -> int:
        answer = await pool.request(base, PATH, body, HEADERS)
        try:
            if stream:
                async for _ in answer.chunks():
                    pass
            else:
                await answer.read()
        finally:
            await answer.aclose()
        return answer.status

    return send, client.aclose


async def _aiohttp(base: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
    session = aiohttp.ClientSession(
        base_url=base, connector=connector, auto_decompress=False, trust_env=False
    )
    headers = {k.decode(): v.decode() for k, v in HEADERS}

    async def send(body: bytes, stream: bool) -> int:
        async with session.post(PATH, data=body, headers=headers) as answer:
            if stream:
                async for _ in answer.content.iter_any():
                    pass
            else:
                await answer.read()
            return int(answer.status)

    return send, session.close


async def _httpx(base: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    client = httpx.AsyncClient(base_url=base, limits=limits, timeout=None, trust_env=False)

    async def send(body: bytes, stream: bool) -> int:
        request = client.build_request("POST", PATH, content=body, headers=HEADERS)
        answer = await client.send(request, stream=True)
        try:
            async for _ in answer.aiter_raw():
                pass
        finally:
            await answer.aclose()
        return answer.status_code

    return send, client.aclose


MAKERS = {"upstream.py": _upstream, "aiohttp": _aiohttp, "httpx": _httpx}


async def _cpu_per_request(send: Send, body: bytes, stream: bool, n: int, at_once: int) -> float:
    async def worker(count: int) -> None:
        for _ in range(count):
            assert await send(body, stream) == 200

    await asyncio.gather(*(worker(5) for _ in range(at_once)))  # connections, imports
    start = time.process_time()
    await asyncio.gather(*(worker(n // at_once) for _ in range(at_once)))
    return (time.process_time() - start) / (n // at_once * at_once)


async def _one(kind: str, base: str, n: int) -> dict[str, float]:
    send, close = await MAKERS[kind](base)
    try:
        return {
            "whole": await _cpu_per_request(send, WHOLE, False, n, 1),
            "stream": await _cpu_per_request(send, STREAM, True, n, 1),
            "whole16": await _cpu_per_request(send, WHOLE, False, n, CONCURRENCY),
            "stream16": await _cpu_per_request(send, STREAM, True, n, CONCURRENCY),
        }
    finally:
        await close()


def one(kind: str, base: str, n: int) -> None:
    """The ``one`` subcommand: measure ``kind`` and print the figures as JSON."""
    if importlib.util.find_spec("uvloop"):
        import uvloop

        print(json.dumps(uvloop.run(_one(kind, base, n))))
    else:
        print(json.dumps(asyncio.run(_one(kind, base, n))))


# --- the bench --------------------------------------------------------------------------------


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


def measure(kind: str, base: str, n: int) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.upstream_clients", "one", kind, base, str(n)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind}: exit {done.returncode}\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def report(results: dict[str, list[dict[str, float]]]) -> list[str]:
    columns = [("whole", "whole"), ("stream", "stream"), ("whole16", "whole x16")]
    columns.append(("stream16", "stream x16"))
    rows = [f"{'client':<12}" + "".join(f"{title:>12}" for _, title in columns)]
    for kind, runs in results.items():
        cells = [statistics.median(r[key] for r in runs) for key, _ in columns]
        rows.append(f"{kind:<12}" + "".join(f"{1e3 * c:12.3f}" for c in cells))
    return rows


def main() -> None:
    if sys.argv[1:2] == ["one"]:
        one(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1600, help="per measurement")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests = 1, 160
    kinds = [k for k in CLIENTS if k != "aiohttp" or importlib.util.find_spec("aiohttp")]
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="gk-bench-clients-") as tmp,
        simulator(Path(tmp)) as base,
    ):
        for r in range(args.rounds):
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                results[kind].append(measure(kind, base, args.requests))
    versions: dict[str, Any] = {"httpx": httpx.__version__}
    if "aiohttp" in kinds:
        import aiohttp

        versions["aiohttp"] = aiohttp.__version__
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    print(
        f"# bench/upstream_clients.py: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"{loop}, {' '.join(f'{k} {v}' for k, v in versions.items())}, "
        f"{time.perf_counter() - start:.0f} s; CPU ms per request (median of {args.rounds} "
        f"rounds x {args.requests}), 16 tokens, one at a time and {CONCURRENCY} at once"
    )
    if "aiohttp" not in kinds:
        print("# aiohttp not installed: not measured (scripts/bench-deps.sh installs it)")
    print("\n".join(report(results)))


if __name__ == "__main__":
    main()
