"""What the OpenAI proxy adds, next to vllm-router, on loopback.

Starts three processes: the fake vLLM worker (``tests.support.fake_upstream``), gatekeeper's
proxy in front of it (``python -m bench.proxy serve``, uvicorn with the same defaults as
the sidecar) and ``vllm-router --policy round_robin`` with the worker as its one static
backend. Then, with the targets interleaved round by round, it measures for each target
(the worker itself, gatekeeper, vllm-router):

- latency of non-streaming chat completions, one at a time (p50, p99), and the time to
  the first streamed chunk; "added" is the target's figure minus the worker's;
- CPU time of the proxy's process per request, from ``/proc/PID/stat`` before and after;
- throughput at 64 concurrent streams against a worker that paces its tokens (8 chunks
  40 ms apart, as a GPU would: at most 64 / 0.28 s = 228 streams/s), so the worker is
  the bottleneck; "busy" is the machine's CPU use meanwhile (near 100 % means the CPUs,
  not the worker, are the bottleneck).

The load generator is a minimal asyncio HTTP/1.1 client (keep-alive), so that its own
cost is small and the same for every target. Run: ``python -m bench.proxy``
(``--router PATH`` if ``vllm-router`` is not on ``PATH``; ``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16'
WHOLE = CHAT + b"}"
STREAM = CHAT + b', "stream": true}'
PACED = CHAT + b', "stream": true, "fake": {"chunks": 8, "delay": 0.04}}'
TICK_SECONDS = 1.0 / os.sysconf("SC_CLK_TCK")


# --- the gatekeeper proxy process ----------------------------------------------------------


def serve(port: int, upstream: str) -> None:
    """Run gatekeeper's proxy for model ``m`` on one worker (the ``serve`` subcommand)."""
    import uvicorn
    from starlette.applications import Starlette

    from gatekeeper.proxy import Endpoint, Proxy, upstream_client

    class OneWorker:
        def __init__(self) -> None:
            self.endpoint = [Endpoint("w0", upstream, "m")]

        async def endpoints(self, model: str) -> list[Endpoint]:
            return self.endpoint

        def models(self) -> list[dict[str, Any]]:
            return [{"id": "m", "object": "model"}]

        def report(self, endpoint: Endpoint, outcome: str) -> None:
            pass

    app = Starlette(routes=Proxy(OneWorker(), upstream_client()).routes())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# --- a small HTTP/1.1 client -----------------------------------------------------------------


class Connection:
    """One keep-alive connection; POSTs and reads the answer, chunked or not."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    def close(self) -> None:
        self.writer.close()

    async def post(self, path: str, body: bytes) -> tuple[int, float, float]:
        """(status, seconds to the first body bytes, seconds to the end)."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        start = time.perf_counter()
        self.writer.write(head.encode() + body)
        headers = (await self.reader.readuntil(b"\r\n\r\n")).lower()
        status = int(headers[9:12])
        if b"transfer-encoding: chunked" not in headers:
            length = int(headers.split(b"content-length:")[1].split(b"\r\n")[0])
            await self.reader.readexactly(length)
            end = time.perf_counter() - start
            return status, end, end
        first = 0.0
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await self.reader.readexactly(size + 2)
            first = first or time.perf_counter() - start
        await self.reader.readuntil(b"\r\n")
        return status, first, time.perf_counter() - start


# --- processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextmanager
def process(argv: list[str], port: int, health: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                raise RuntimeError(f"{argv[0]} did not start (exit {proc.poll()}): {err}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def idle_seconds() -> float:
    """The machine's idle CPU time so far, all CPUs together (``/proc/stat``)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return (int(fields[4]) + int(fields[5])) * TICK_SECONDS


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_SECONDS


# --- measurements ----------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    port: int
    pid: int | None  # the proxy's process (None: the worker itself)
    whole: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    cpu: float = 0.0
    requests: int = 0
    streams_per_second: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    stream_cpu: float = 0.0
    streams: int = 0
    errors: int = 0


async def latency_round(target: Target, n_whole: int, n_stream: int) -> None:
    conn = await Connection(target.port).open()
    try:
        for _ in range(5):  # warm the connection and the target's own pool
            await conn.post("/v1/chat/completions", WHOLE)
        cpu = cpu_seconds(target.pid)
        for _ in range(n_whole):
            status, _, total = await conn.post("/v1/chat/completions", WHOLE)
            target.whole.append(total)
            target.errors += status != 200
        for _ in range(n_stream):
            status, first, _ = await conn.post("/v1/chat/completions", STREAM)
            target.first.append(first)
            target.errors += status != 200
        target.cpu += cpu_seconds(target.pid) - cpu
        target.requests += n_whole + n_stream
    finally:
        conn.close()


async def throughput_round(target: Target, concurrency: int, seconds: float) -> None:
    conns = [await Connection(target.port).open() for _ in range(concurrency)]
    done = 0
    stop = time.perf_counter() + seconds

    async def loop(conn: Connection) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            status, _, _ = await conn.post("/v1/chat/completions", PACED)
            done += status == 200
            target.errors += status != 200

    cpu = cpu_seconds(target.pid)
    idle = idle_seconds()
    start = time.perf_counter()
    try:
        await asyncio.gather(*(loop(c) for c in conns))
    finally:
        for conn in conns:
            conn.close()
    elapsed = time.perf_counter() - start
    target.streams_per_second.append(done / elapsed)
    target.busy.append(1 - (idle_seconds() - idle) / (elapsed * (os.cpu_count() or 1)))
    target.stream_cpu += cpu_seconds(target.pid) - cpu
    target.streams += done


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if values else 0.0


# --- report ----------------------------------------------------------------------------------


def report(targets: list[Target]) -> list[str]:
    worker = targets[0]
    base50, base99 = percentile(worker.whole, 50), percentile(worker.whole, 99)
    base_first = percentile(worker.first, 50)
    rows = [
        f"{'target':<12} {'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} {'+p99 ms':>8} "
        f"{'TTFT ms':>8} {'+TTFT ms':>9} {'CPU ms/req':>10} {'CPU ms/stream':>13} "
        f"{'streams/s @64':>13} {'busy':>5} {'errors':>6}"
    ]
    for t in targets:
        p50, p99, first = percentile(t.whole, 50), percentile(t.whole, 99), percentile(t.first, 50)
        cpu = f"{1e3 * t.cpu / t.requests:.3f}" if t.pid else "-"
        stream_cpu = f"{1e3 * t.stream_cpu / t.streams:.3f}" if t.pid and t.streams else "-"
        rate = statistics.mean(t.streams_per_second) if t.streams_per_second else 0.0
        busy = statistics.mean(t.busy) if t.busy else 0.0
        rows.append(
            f"{t.name:<12} {1e3 * p50:7.3f} {1e3 * p99:7.3f} {1e3 * (p50 - base50):8.3f} "
            f"{1e3 * (p99 - base99):8.3f} {1e3 * first:8.3f} {1e3 * (first - base_first):9.3f} "
            f"{cpu:>10} {stream_cpu:>13} {rate:13.1f} {busy:5.0%} {t.errors:6d}"
        )
    return rows


def verdict(targets: list[Target]) -> list[str]:
    by_name = {t.name: t for t in targets}
    worker, ours, router = by_name["worker"], by_name["gatekeeper"], by_name.get("vllm-router")
    if router is None:
        return ["vllm-router was not measured: no comparison."]
    base = percentile(worker.whole, 50)
    added_ours = percentile(ours.whole, 50) - base
    added_router = percentile(router.whole, 50) - base
    cpu_ours, cpu_router = ours.cpu / ours.requests, router.cpu / router.requests
    rate = {t.name: statistics.mean(t.streams_per_second) for t in targets}
    lines = [
        f"added p50: gatekeeper {1e3 * added_ours:.3f} ms vs vllm-router {1e3 * added_router:.3f} ms"
        f" -> {'met' if added_ours <= added_router else 'NOT met'}",
        f"CPU per request: gatekeeper {1e3 * cpu_ours:.3f} ms vs vllm-router "
        f"{1e3 * cpu_router:.3f} ms ({cpu_ours / cpu_router:.2f}x, target <= 1.5x) -> "
        f"{'met' if cpu_ours <= 1.5 * cpu_router else 'NOT met'}",
        f"throughput at 64 streams: gatekeeper {rate['gatekeeper']:.1f}/s, vllm-router "
        f"{rate['vllm-router']:.1f}/s, worker {rate['worker']:.1f}/s -> "
        f"{'met' if rate['gatekeeper'] >= 0.95 * rate['worker'] else 'NOT met'} (within 5%)",
    ]
    return lines


async def measure(targets: list[Target], args: argparse.Namespace) -> None:
    for r in range(args.rounds):
        for t in targets[r % len(targets) :] + targets[: r % len(targets)]:
            await latency_round(t, args.requests, args.requests // 2)
    for r in range(args.throughput_rounds):
        for t in targets[r % len(targets) :] + targets[: r % len(targets)]:
            await throughput_round(t, 64, args.seconds)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router", default=shutil.which("vllm-router"), help="vllm-router path")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=300, help="per target and round")
    parser.add_argument("--throughput-rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput round")
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests, args.throughput_rounds, args.seconds = 2, 40, 1, 1.0
    ports = {name: free_port() for name in ("worker", "gatekeeper", "vllm-router")}
    worker_url = f"http://127.0.0.1:{ports['worker']}"
    py = sys.executable
    with ExitStack() as stack:
        stack.enter_context(
            process(
                [py, "-m", "tests.support.fake_upstream", "--port", str(ports["worker"])],
                ports["worker"],
                "/health",
            )
        )
        targets = [Target("worker", ports["worker"], None)]
        ours = stack.enter_context(
            process(
                [py, "-m", "bench.proxy", "serve", str(ports["gatekeeper"]), worker_url],
                ports["gatekeeper"],
                "/v1/models",
            )
        )
        targets.append(Target("gatekeeper", ports["gatekeeper"], ours.pid))
        if args.router:
            router_argv = [args.router, "--worker-urls", worker_url, "--policy", "round_robin"]
            router_argv += ["--host", "127.0.0.1", "--port", str(ports["vllm-router"])]
            router_argv += ["--log-level", "warning"]
            router = stack.enter_context(process(router_argv, ports["vllm-router"], "/health"))
            targets.append(Target("vllm-router", ports["vllm-router"], router.pid))
        start = time.perf_counter()
        asyncio.run(measure(targets, args))
        elapsed = time.perf_counter() - start
    fast = [m for m in ("uvloop", "httptools") if importlib.util.find_spec(m)]
    print(
        f"# bench/proxy.py: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"uvicorn with {' + '.join(fast) or 'asyncio + h11'}, {elapsed:.0f} s"
    )
    print("\n".join(report(targets)))
    print("\n".join(verdict(targets)))


if __name__ == "__main__":
    main()
