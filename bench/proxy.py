"""The sidecar as shipped, next to vllm-router and nginx in front of the same worker.

Starts the installed ``gatekeeper serve --rehearsal`` (``bench.serve_process``) with one
preloaded model whose simulator worker it launches, reads that worker's port from the
admin API (``GET /admin/deployments``), and puts ``vllm-router --policy round_robin``
and nginx (upstream keepalive, ``proxy_buffering off``) in front of the same worker.
Then, with the targets interleaved round by round (the order rotates), it measures for
each target (the worker itself, gatekeeper, vllm-router, nginx):

- latency of non-streaming chat completions (16 tokens), one at a time on a keep-alive
  connection (p50, p99), and the time to the first streamed chunk (TTFT); "added" is
  the target's figure minus the worker's, measured in the same rounds;
- CPU of the target's processes per request and per (16-token) stream, before and
  after: utime + stime, read in nanoseconds from each process's CPU-time clock rather
  than in ``/proc/PID/stat``'s 10 ms ticks; for gatekeeper the sidecar process only
  (not its worker), for nginx the master and its workers, for vllm-router its process
  and any children;
- idle CPU: the same figure over a quiet stretch before any traffic, per second;
- throughput at 64 concurrent streams against a worker that paces its tokens (8 tokens
  40 ms apart by default, ``--token-seconds``, as a GPU would: at most 64 / 0.32 s =
  200 streams/s), so the worker is the bottleneck, with the target's CPU per stream
  meanwhile; the rate is each connection's streams over the time to the end of its last
  one, summed over the connections; "busy" is the machine's CPU use (near 100 % means the CPUs, not the
  worker, are the bottleneck: the output then says so).

``--servers gatekeeper,uvicorn,granian`` measures one sidecar per ``http_server``
(docs/sidecar.md, "HTTP servers"; default: ``gatekeeper`` alone), each a row of its own
(``gk+uvicorn``, ``gk+granian``) with the five criteria checked for each. All of them are
in front of the SAME worker, as vllm-router and nginx are: the first sidecar launches it,
each other starts on a copy of the first's deployment records and ledger and adopts it,
as a restarted sidecar adopts its workers (``proxy_targets.sidecars``). One worker for
all is the fair comparison: "added" is then against the one worker measured in the same
rounds for every target, with no difference between two workers' own latency or the
CPUs they were scheduled on to blur the few tens of microseconds being compared.

The simulator's token pace is one setting per worker, so the bench runs twice: a worker
with ``GATEKEEPER_SIM_TOKEN_SECONDS=0`` for latency, CPU and idle, then a fresh sidecar
whose worker paces tokens, for throughput (each time all targets in front of that one
worker). The load generator is a minimal asyncio HTTP/1.1 client (keep-alive, one write
per request), so its own cost is small and the same for every target.

Run ``python -m bench.proxy`` (``--quick`` for a short run). vllm-router is looked for
on PATH and in ``build/venv-router`` (``--router``), nginx on PATH and in ``/usr/sbin``
(``--nginx``); ``scripts/bench-deps.sh`` installs both. One that is missing is named in
the output and the rest is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench.proxy_targets import (
    SERVERS,
    Connection,
    cpu_seconds,
    idle_seconds,
    nginx,
    process_tree,
    sidecar_name,
    sidecars,
    vllm_router,
)

CHAT = b'{"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}]'
WHOLE = CHAT + b', "max_tokens": 16}'
STREAM = CHAT + b', "max_tokens": 16, "stream": true}'
PACED = CHAT + b', "max_tokens": 8, "stream": true}'
WORKER_ENV = '{{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.2", GATEKEEPER_SIM_TOKEN_SECONDS = "{}" }}'
BUSY_RATIO = 0.9
CONCURRENCY = 64
ROUTER_VENV = Path(__file__).resolve().parent.parent / "build" / "venv-router" / "bin"


# --- measurements ----------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    port: int
    pids: Callable[[], list[int]] | None  # the processes whose CPU counts (None: the worker)
    whole: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    cpu_whole: float = 0.0
    n_whole: int = 0
    cpu_stream: float = 0.0
    n_stream: int = 0
    idle_cpu_per_second: float | None = None
    rates: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    cpu_paced: float = 0.0
    n_paced: int = 0
    errors: int = 0

    def cpu(self) -> float:
        return cpu_seconds(self.pids()) if self.pids is not None else 0.0


async def latency_round(target: Target, n_whole: int, n_stream: int) -> None:
    conn = await Connection(target.port).open()
    try:
        for _ in range(5):  # warm the connection and the target's own pool
            await conn.post("/v1/chat/completions", WHOLE)
        cpu = target.cpu()
        for _ in range(n_whole):
            status, _, total = await conn.post("/v1/chat/completions", WHOLE)
            target.whole.append(total)
            target.errors += status != 200
        middle = target.cpu()
        for _ in range(n_stream):
            status, first, _ = await conn.post("/v1/chat/completions", STREAM)
            target.first.append(first)
            target.errors += status != 200
        target.cpu_whole += middle - cpu
        target.cpu_stream += target.cpu() - middle
        target.n_whole += n_whole
        target.n_stream += n_stream
    finally:
        conn.close()


async def throughput_round(target: Target, seconds: float) -> None:
    conns = [await Connection(target.port).open() for _ in range(CONCURRENCY)]
    # One stream on each first, all at once: every pool on the way holds 64 connections.
    await asyncio.gather(*(c.post("/v1/chat/completions", PACED) for c in conns))
    cpu, idle, start = target.cpu(), idle_seconds(), time.perf_counter()
    stop = start + seconds

    async def loop(conn: Connection) -> tuple[int, float]:
        """This connection's streams, and the time from ``start`` to the end of its last."""
        done, end = 0, start
        while time.perf_counter() < stop:
            status, _, _ = await conn.post("/v1/chat/completions", PACED)
            end = time.perf_counter()
            done += status == 200
            target.errors += status != 200
        return done, end - start

    try:
        per_connection = await asyncio.gather(*(loop(c) for c in conns))
    finally:
        for conn in conns:
            conn.close()
    elapsed = time.perf_counter() - start
    target.rates.append(streams_per_second(per_connection))
    done = sum(n for n, _ in per_connection)
    target.busy.append(1 - (idle_seconds() - idle) / (elapsed * (os.cpu_count() or 1)))
    target.cpu_paced += target.cpu() - cpu
    target.n_paced += done


def streams_per_second(per_connection: list[tuple[int, float]]) -> float:
    """The rate of streams over all connections, from each connection's (streams, seconds
    from the start to the end of its last stream).

    Each connection's own rate, summed: its streams run back to back, so n streams over
    the time to the end of its n-th is exact. Counting every stream over the time to the
    last one's end is not: with 64 streams ending almost together, whether a few of them
    fit one more stream before the round's end moves that end by a whole stream (~0.34 s
    in 5 s) and the rate by up to 7 %, by phase rather than speed."""
    return sum(n / seconds for n, seconds in per_connection if seconds > 0)


def measure_idle(targets: list[Target], seconds: float) -> None:
    """Each target's CPU over ``seconds`` without traffic (all of them quiet at once)."""
    before = {t.name: t.cpu() for t in targets}
    time.sleep(seconds)
    for t in targets:
        t.idle_cpu_per_second = (t.cpu() - before[t.name]) / seconds


def rotations(targets: list[Target], rounds: int) -> Iterator[Target]:
    for r in range(rounds):
        k = r % len(targets)
        yield from targets[k:] + targets[:k]


async def latency_rounds(targets: list[Target], args: argparse.Namespace) -> None:
    for t in rotations(targets, args.rounds):
        await latency_round(t, args.requests, args.requests // 2)


async def warm(targets: list[Target]) -> None:
    """A few requests to each target (imports, pools), not counted."""
    for t in targets:
        await latency_round(t, 20, 10)
        t.whole, t.first = [], []
        t.cpu_whole = t.cpu_stream = 0.0
        t.n_whole = t.n_stream = 0


async def throughput_rounds(targets: list[Target], args: argparse.Namespace) -> None:
    for t in rotations(targets, args.throughput_rounds):
        await throughput_round(t, args.seconds)


# --- the targets -----------------------------------------------------------------------------


def is_sidecar(t: Target) -> bool:
    return t.name == "gatekeeper" or t.name.startswith("gk+")


def only(pid: int) -> Callable[[], list[int]]:
    """The processes whose CPU counts for a sidecar: its own (not its worker's)."""
    return lambda: [pid]


def targets_on(
    stack: ExitStack, work: Path, env: str, args: argparse.Namespace, missing: list[str]
) -> list[Target]:
    """The sidecars (``--servers``) whose worker has ``env``, and every other target in
    front of that worker, each running until ``stack`` closes."""
    worker, ours = sidecars(stack, work, env, args.servers)
    targets = [Target("worker", worker.port, None)]
    targets += [Target(name, r.port, only(r.pid)) for name, r in ours]
    if args.router:
        router = stack.enter_context(vllm_router(args.router, worker, work))
        targets.append(Target("vllm-router", router.port, lambda: process_tree(router.pid)))
    elif "vllm-router" not in missing:
        missing.append("vllm-router")
    if args.nginx:
        proxy = stack.enter_context(nginx(args.nginx, worker, work))
        targets.append(Target("nginx", proxy.port, lambda: process_tree(proxy.pid)))
    elif "nginx" not in missing:
        missing.append("nginx")
    return targets


# --- report ----------------------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if values else 0.0


def per(cpu: float, n: int) -> str:
    return f"{1e3 * cpu / n:.3f}" if n else "-"


def latency_report(targets: list[Target]) -> list[str]:
    worker = targets[0]
    base50, base99 = percentile(worker.whole, 50), percentile(worker.whole, 99)
    base_first = percentile(worker.first, 50)
    rows = [
        f"{'target':<12} {'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} {'+p99 ms':>8} "
        f"{'TTFT ms':>8} {'+TTFT ms':>9} {'CPU ms/req':>10} {'CPU ms/stream':>13} "
        f"{'idle CPU ms/s':>13} {'errors':>6}"
    ]
    for t in targets:
        p50, p99, first = percentile(t.whole, 50), percentile(t.whole, 99), percentile(t.first, 50)
        ours = t.pids is not None
        idle = f"{1e3 * t.idle_cpu_per_second:.2f}" if t.idle_cpu_per_second is not None else "-"
        rows.append(
            f"{t.name:<12} {1e3 * p50:7.3f} {1e3 * p99:7.3f} {1e3 * (p50 - base50):8.3f} "
            f"{1e3 * (p99 - base99):8.3f} {1e3 * first:8.3f} {1e3 * (first - base_first):9.3f} "
            f"{per(t.cpu_whole, t.n_whole) if ours else '-':>10} "
            f"{per(t.cpu_stream, t.n_stream) if ours else '-':>13} "
            f"{idle if ours else '-':>13} {t.errors:6d}"
        )
    return rows


def throughput_report(targets: list[Target]) -> list[str]:
    head = f"{'target':<12} {'streams/s':>9} {'rounds':>13} {'CPU ms/stream':>13} {'busy':>5}"
    rows = [head + f" {'errors':>6}"]
    for t in targets:
        rate = statistics.mean(t.rates) if t.rates else 0.0
        spread = f"{min(t.rates):.0f}-{max(t.rates):.0f}" if t.rates else "-"
        busy = statistics.mean(t.busy) if t.busy else 0.0
        cpu = per(t.cpu_paced, t.n_paced) if t.pids is not None else "-"
        rows.append(f"{t.name:<12} {rate:9.1f} {spread:>13} {cpu:>13} {busy:5.0%} {t.errors:6d}")
    return rows


def verdict(fast: list[Target], paced: list[Target]) -> list[str]:
    """The issue's targets: each sidecar no worse than vllm-router in the same run."""
    by_name = {t.name: t for t in fast}
    worker, router = by_name["worker"], by_name.get("vllm-router")
    if router is None:
        return ["vllm-router was not measured: no verdict."]
    rate = {t.name: statistics.mean(t.rates) for t in paced if t.rates}
    return [line for t in fast if is_sidecar(t) for line in _criteria(t, worker, router, rate)]


def _criteria(ours: Target, worker: Target, router: Target, rate: dict[str, float]) -> list[str]:
    """The five criteria for one sidecar."""

    def added(t: Target, values: Callable[[Target], list[float]]) -> float:
        return percentile(values(t), 50) - percentile(values(worker), 50)

    def line(what: str, a: float, b: float, unit: str = "ms") -> str:
        verdict = "met" if a <= b else "NOT met"
        return f"{what}: {ours.name} {a:.3f} {unit} vs vllm-router {b:.3f} {unit} -> {verdict}"

    lost = 1 - rate[ours.name] / rate["worker"]
    return [
        line(
            "added p50",
            1e3 * added(ours, lambda t: t.whole),
            1e3 * added(router, lambda t: t.whole),
        ),
        line(
            "added TTFT",
            1e3 * added(ours, lambda t: t.first),
            1e3 * added(router, lambda t: t.first),
        ),
        line(
            "CPU per request",
            1e3 * ours.cpu_whole / ours.n_whole,
            1e3 * router.cpu_whole / router.n_whole,
        ),
        line(
            "CPU per stream",
            1e3 * ours.cpu_stream / ours.n_stream,
            1e3 * router.cpu_stream / router.n_stream,
        ),
        f"throughput at {CONCURRENCY} streams: {ours.name} {rate[ours.name]:.1f}/s, worker "
        f"{rate['worker']:.1f}/s ({lost:+.1%} lost) -> {'met' if lost <= 0.02 else 'NOT met'}"
        " (at most 2 % below the worker)",
    ]


def revision() -> str:
    """The checkout measured: HEAD, and whether gatekeeper/ has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run([*git, "status", "--porcelain", "gatekeeper"], capture_output=True)
    except OSError:
        return "no git"
    if head.returncode != 0:
        return "not a git checkout"
    return head.stdout.strip() + (" + uncommitted changes in gatekeeper/" if dirty.stdout else "")


def servers_list(text: str) -> list[str]:
    """``--servers``: http_server values, comma-separated, each once."""
    servers = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in servers if name not in SERVERS]
    if not servers or unknown or len(set(servers)) < len(servers):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of distinct http_server values; give some of "
            f"{', '.join(SERVERS)}, comma-separated, e.g. gatekeeper,uvicorn"
        )
    return servers


def find_router(given: str | None) -> str | None:
    local = ROUTER_VENV / "vllm-router"
    found = given or shutil.which("vllm-router") or (str(local) if local.exists() else None)
    return found if found and os.access(found, os.X_OK) else None


def find_nginx(given: str | None) -> str | None:
    found = given or shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    return found if found and os.access(found, os.X_OK) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router", help="vllm-router's path (default: PATH, build/venv-router)")
    parser.add_argument("--nginx", help="nginx's path (default: PATH, /usr/sbin)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=400, help="per target and round")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--throughput-rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput round")
    parser.add_argument(
        "--token-seconds", type=float, default=0.04, help="the paced worker's token interval"
    )
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    parser.add_argument(
        "--servers",
        type=servers_list,
        default=["gatekeeper"],
        help="comma-separated http_server values, one sidecar each, all in front of the "
        f"same worker ({', '.join(SERVERS)}; default: gatekeeper)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.requests, args.idle_seconds = 2, 40, 2.0
        args.throughput_rounds, args.seconds = 1, 1.0
    args.router, args.nginx = find_router(args.router), find_nginx(args.nginx)
    missing: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gk-bench-proxy-") as tmp:
        with ExitStack() as stack:
            work = Path(tmp, "fast")
            work.mkdir()
            fast = targets_on(stack, work, WORKER_ENV.format(0), args, missing)
            asyncio.run(warm(fast))
            measure_idle(fast, args.idle_seconds)
            asyncio.run(latency_rounds(fast, args))
        with ExitStack() as stack:
            work = Path(tmp, "paced")
            work.mkdir()
            paced = targets_on(stack, work, WORKER_ENV.format(args.token_seconds), args, missing)
            asyncio.run(throughput_rounds(paced, args))
    elapsed = time.perf_counter() - start
    fast_parts = [m for m in ("uvloop", "httptools") if importlib.util.find_spec(m)]
    print(
        f"# bench/proxy.py: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"{' + '.join(fast_parts) or 'asyncio + h11'} installed, {elapsed:.0f} s; "
        f"{args.rounds} rounds x {args.requests} requests + {args.requests // 2} streams; "
        f"at {revision()}"
    )
    if args.servers != ["gatekeeper"]:
        named = (f"{sidecar_name(server)} (http_server = {server})" for server in args.servers)
        print(f"# sidecars, all in front of the same worker: {', '.join(named)}")
    for name in missing:
        print(f"# {name} not found: not measured (scripts/bench-deps.sh installs it)")
    print("\n".join(latency_report(fast)))
    print(
        f"# {CONCURRENCY} concurrent streams, 8 tokens {1e3 * args.token_seconds:.0f} ms apart, "
        f"{args.seconds:.0f} s x {args.throughput_rounds} rounds"
    )
    print("\n".join(throughput_report(paced)))
    if any(t.busy and statistics.mean(t.busy) > BUSY_RATIO for t in paced):
        print(
            f"# the machine's CPUs were over {BUSY_RATIO:.0%} busy: they, not the worker's pace, "
            "bounded the throughput (try a larger --token-seconds)"
        )
    print("\n".join(verdict(fast, paced)))


if __name__ == "__main__":
    main()
