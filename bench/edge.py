"""The sidecar's HTTP edge and worker liveness, measured on what operators run (#27).

Starts the installed ``gatekeeper serve --rehearsal`` (``bench.serve_process``: a
declared node, one preloaded simulator worker) with a short body deadline and liveness
probes in its config file (printed with the defaults, which would take minutes), and
measures, on the sidecar process alone (its VmRSS from ``/proc``, every 100 ms):

1. **Endless request heads.** One client sends a request head that never ends, in two
   kinds for half of ``--head-seconds`` each: header lines without end (the field count
   bound, ``max_request_headers``) and one header line without end (the size bound,
   ``max_request_head_bytes``). Each time its connection is cut it connects again. Printed:
   RSS idle, peak and peak minus idle (#27's bound: within 50 MB of idle), and what the
   client got (the status lines, the time from connecting to each answer and the bytes
   sent). The client writes as fast as the kernel takes it: now and then it has sent
   over 1 MiB past the bound before reading its 431, which the sidecar's lingering close
   (``http_limits.linger``) drops before it closes, and gets a broken pipe instead
   (asyncio's transport closes on the failed write without reading what had come).
2. **Trickled bodies.** ``--clients`` clients (100) each announce ``Content-Length:
   1000000`` on ``POST /v1/chat/completions`` and send one byte every ``1 / --rate``
   seconds. Printed: RSS idle, peak and end, the status each client got, and the time
   from the end of its head to the answer and to the close (p50, max), against the
   deadline the settings give (``request_body_total_seconds`` plus one second per
   ``request_body_min_bytes_per_second`` bytes received).
3. **A frozen worker.** The ready worker's process group (its pid from ``GET
   /admin/deployments``) gets SIGSTOP; printed: the time until the admin API says
   ``unhealthy``, until ``/healthz`` lists it, until the frozen process is gone (the
   sidecar's SIGTERM waits for ``stop_grace_seconds``, then SIGKILL, which a stopped
   process cannot ignore) and until the deployment is ``ready`` again with a new worker
   (``restart_backoff_seconds`` later, at most 1 s in a rehearsal, per
   ``restart_policy``), with the probe settings.

Run ``python -m bench.edge`` (about 40 s on 2 CPUs; ``--quick``: about 20 s). The last
line is one JSON object with every figure (sizes in bytes, times in seconds).
``--liveness-defaults`` freezes the worker under the default probes, stop grace and
back-off instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.serve_process import TOKEN, free_port, sidecar
from bench.soak import wait_ready
from gatekeeper.settings import Settings

WORKER_ENV = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.3", GATEKEEPER_SIM_TOKEN_SECONDS = "0.001" }'
MIB = 1 << 20
RSS_BOUND_BYTES = 50 * 1000 * 1000
"""#27: an endless head keeps the sidecar within 50 MB of its idle RSS."""
ANNOUNCED = 1_000_000
"""The body length each trickling client announces."""

LINES = b"".join(b"X-Pad-%05d: %s\r\n" % (i, b"a" * 80) for i in range(640))
"""Header lines, about 64 KiB a write: sent again and again, the head never ends."""
ENDLESS_LINE = b"a" * 65536
"""One header line's value, a write at a time: the line never ends."""
HEAD_KINDS = {"lines": (b"", LINES), "line": (b"X-Endless: ", ENDLESS_LINE)}
BENCH_SETTINGS: dict[str, float] = {
    "request_body_total_seconds": 10.0,  # --body-total-seconds
    "request_body_min_bytes_per_second": 500,
    "request_body_timeout_seconds": 30.0,
    "health_interval_seconds": 1.0,
    "health_timeout_seconds": 1.0,
    "health_failures": 3,
    "stop_grace_seconds": 2.0,
    "restart_backoff_seconds": 1.0,
}
"""What the bench sets in the sidecar's config file, so that it runs in under a minute
(printed with the defaults); ``--liveness-defaults`` leaves those from
``health_interval_seconds`` on at their defaults."""
LIVENESS = tuple(BENCH_SETTINGS)[3:]
DEFAULTS = {k: v.default for k, v in Settings.model_fields.items() if k in BENCH_SETTINGS}
REHEARSAL_BACKOFF_SECONDS = 1.0
"""``serve --rehearsal``'s cap on ``restart_backoff_seconds`` (``cli/serve.py``)."""


def rss_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


@dataclass
class Sampler:
    """The RSS of ``pid`` every ``every`` seconds, in a thread, while the block runs."""

    pid: int
    every: float = 0.1
    samples: list[int] = field(default_factory=list)
    _done: threading.Event = field(default_factory=threading.Event)

    @contextlib.contextmanager
    def running(self) -> Iterator[Sampler]:
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._done.set()
            thread.join()

    def _loop(self) -> None:
        while True:
            self.samples.append(rss_bytes(self.pid))
            if self._done.wait(self.every):
                return


def idle_rss(pid: int, seconds: float = 1.0) -> int:
    """The median RSS over ``seconds`` of no traffic."""
    with Sampler(pid).running() as sampler:
        time.sleep(seconds)
    return int(statistics.median(sampler.samples))


@dataclass
class Cut:
    """One connection of the endless-head client: the status line it got (or why none)
    and when, from connecting, and the bytes it had sent by then."""

    status: str
    seconds: float
    sent_bytes: int


async def endless_head(port: int, kind: str, until: float) -> Cut:
    """Connect and send a head of ``kind`` that never ends, until the sidecar answers
    (or ``until``)."""
    prefix, chunk = HEAD_KINDS[kind]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start, sent = time.monotonic(), 0
    answer = asyncio.create_task(reader.readline())
    answered: list[float] = []
    answer.add_done_callback(lambda _: answered.append(time.monotonic()))
    with contextlib.suppress(ConnectionError):
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + prefix)
        while not answer.done() and time.monotonic() < until:
            writer.write(chunk)
            sent += len(chunk)
            await writer.drain()
            await asyncio.sleep(0)
    with contextlib.suppress(ConnectionError, TimeoutError):
        await asyncio.wait_for(asyncio.shield(answer), 5)
    answer.cancel()
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    when = answered[0] - start if answered else time.monotonic() - start
    return Cut(_status(answer), when, sent)


def _status(answer: asyncio.Task[bytes]) -> str:
    """The status line read, or why there is none."""
    if not answer.done() or answer.cancelled():
        return "no answer yet (the time was up)"
    if (error := answer.exception()) is not None:
        return f"no answer: {type(error).__name__}"
    return answer.result().decode(errors="replace").strip() or "no answer: closed"


async def head_client(port: int, kind: str, seconds: float) -> list[Cut]:
    """One client, connecting again each time it is cut, for ``seconds``."""
    until, cuts = time.monotonic() + seconds, []
    while time.monotonic() < until:
        cuts.append(await endless_head(port, kind, until))
    return cuts


def _spread(values: Sequence[float], digits: int = 3) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "max": None}
    p50 = statistics.median_low(values)  # one of the values: an int for byte counts
    return {"p50": round(p50, digits), "max": round(max(values), digits)}


def measure_heads(pid: int, port: int, seconds: float) -> dict[str, Any]:
    idle = idle_rss(pid)
    sampler = Sampler(pid)
    kinds: dict[str, Any] = {}
    with sampler.running():
        for kind in HEAD_KINDS:
            cuts = asyncio.run(head_client(port, kind, seconds / 2))
            answered = [c for c in cuts if c.status.startswith("HTTP/")]
            kinds[kind] = {
                "connections": len(cuts),
                "statuses": dict(Counter(c.status for c in cuts)),
                "answer_seconds": _spread([c.seconds for c in answered], 4),
                "sent_bytes_at_answer": _spread([c.sent_bytes for c in answered], 0),
                "sent_bytes": sum(c.sent_bytes for c in cuts),
            }
    peak = max(sampler.samples)
    return {"idle_rss_bytes": idle, "peak_rss_bytes": peak, "growth_bytes": peak - idle, **kinds}


@dataclass
class Trickle:
    """One trickling client: its status line (or why none), the seconds from the end of
    its head to that answer and to the close, and the body bytes it sent."""

    status: str = "no answer"
    answered: float | None = None
    closed: float | None = None
    sent_bytes: int = 0


async def trickle(port: int, rate: float, limit: float) -> Trickle:
    """Announce ``ANNOUNCED`` body bytes, then send one every ``1 / rate`` seconds until
    the sidecar answers or closes (or ``limit`` seconds)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % ANNOUNCED
    )
    await writer.drain()
    start, result = time.monotonic(), Trickle()
    answer = asyncio.create_task(reader.readline())
    with contextlib.suppress(ConnectionError):
        while not answer.done() and time.monotonic() - start < limit:
            writer.write(b" ")
            result.sent_bytes += 1
            await writer.drain()
            await asyncio.wait({answer}, timeout=1 / rate)
    await asyncio.wait({answer}, timeout=max(0.0, limit - (time.monotonic() - start)))
    if answer.done():
        result.status, result.answered = _status(answer), time.monotonic() - start
        with contextlib.suppress(ConnectionError, TimeoutError):  # the rest, to the close
            if answer.exception() is None:
                await asyncio.wait_for(reader.read(), 5)
            result.closed = time.monotonic() - start
    answer.cancel()
    writer.close()
    return result


async def trickles(port: int, clients: int, rate: float, limit: float) -> list[Trickle]:
    return list(await asyncio.gather(*(trickle(port, rate, limit) for _ in range(clients))))


def measure_trickles(
    pid: int, port: int, clients: int, rate: float, settings: dict[str, float]
) -> dict[str, Any]:
    idle = idle_rss(pid)
    sampler = Sampler(pid)
    total, min_rate = (
        settings["request_body_total_seconds"],
        settings["request_body_min_bytes_per_second"],
    )
    limit = total + 30
    with sampler.running():
        results = asyncio.run(trickles(port, clients, rate, limit))
    end = idle_rss(pid)
    sent = max(r.sent_bytes for r in results)
    return {
        "clients": clients,
        "rate_bytes_per_second": rate,
        "deadline_seconds": round(total + sent / min_rate, 3),
        "idle_rss_bytes": idle,
        "peak_rss_bytes": max(sampler.samples),
        "end_rss_bytes": end,
        "statuses": dict(Counter(r.status for r in results)),
        "never_closed": sum(r.closed is None for r in results),
        "answered_seconds": _spread([r.answered for r in results if r.answered is not None]),
        "closed_seconds": _spread([r.closed for r in results if r.closed is not None]),
    }


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie not yet reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _ready_deployment(admin: httpx.Client) -> dict[str, Any]:
    for d in admin.get("/admin/deployments").json()["deployments"]:
        if d["state"] == "ready" and d["pid"]:
            return dict(d)
    raise RuntimeError("no ready deployment to freeze")


def _freeze_marks(admin: httpx.Client, deployment_id: str, pid: int) -> dict[str, bool]:
    d = admin.get(f"/admin/deployments/{deployment_id}").json()
    listed = deployment_id in admin.get("/healthz").json().get("unhealthy_workers", [])
    return {
        "unhealthy": d["state"] == "unhealthy",
        "healthz_degraded": listed,
        "frozen_process_gone": gone(pid),
        "ready_again": d["state"] == "ready" and d["pid"] not in (None, pid),
    }


def measure_freeze(base: str, limit: float) -> dict[str, Any]:
    """SIGSTOP the ready worker's group; the seconds from then to each mark."""
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as admin:
        frozen = _ready_deployment(admin)
        pid = int(frozen["pid"])
        os.killpg(pid, signal.SIGSTOP)
        start, seconds = time.monotonic(), dict[str, float]()
        try:
            while len(seconds) < 4 and time.monotonic() - start < limit:
                for mark, seen in _freeze_marks(admin, frozen["id"], pid).items():
                    if seen and mark not in seconds:
                        seconds[mark] = round(time.monotonic() - start, 3)
                time.sleep(0.05)
        finally:
            if not gone(pid):  # not taken out: let it run, the sidecar stops it at exit
                os.killpg(pid, signal.SIGCONT)
    marks = ("unhealthy", "healthz_degraded", "frozen_process_gone", "ready_again")
    return {"pid": pid, **{m: seconds.get(m) for m in marks}}


def _mib(value: int) -> str:
    return f"{value / MIB:.1f} MiB"


def report_heads(h: dict[str, Any]) -> list[str]:
    growth = h["growth_bytes"]
    verdict = "within" if growth <= RSS_BOUND_BYTES else "OVER"
    lines = [
        f"endless head: RSS idle {_mib(h['idle_rss_bytes'])}  peak {_mib(h['peak_rss_bytes'])}"
        f"  peak - idle {_mib(growth)} ({verdict} #27's 50 MB)"
    ]
    for kind in HEAD_KINDS:
        k = h[kind]
        lines.append(
            f"  header {kind} without end: {k['connections']} connections, "
            f"{k['sent_bytes'] / MIB:.0f} MiB sent, answers {k['statuses']}; seconds from "
            f"connecting to the answer {k['answer_seconds']}, bytes sent by then "
            f"{k['sent_bytes_at_answer']}"
        )
    return lines


def report_trickles(t: dict[str, Any]) -> list[str]:
    return [
        f"trickled bodies: {t['clients']} clients, {t['rate_bytes_per_second']:g} B/s each, "
        f"deadline {t['deadline_seconds']:g} s: RSS idle {_mib(t['idle_rss_bytes'])}  "
        f"peak {_mib(t['peak_rss_bytes'])}  end {_mib(t['end_rss_bytes'])}",
        f"  answers {t['statuses']}  never closed {t['never_closed']}; seconds to the answer "
        f"{t['answered_seconds']}, to the close {t['closed_seconds']}",
    ]


def report_freeze(f: dict[str, Any], s: dict[str, float]) -> list[str]:
    def bound(v: dict[str, float]) -> float:
        return v["health_failures"] * (v["health_interval_seconds"] + v["health_timeout_seconds"])

    backoff = min(s["restart_backoff_seconds"], REHEARSAL_BACKOFF_SECONDS)
    return [
        f"frozen worker (SIGSTOP, pid {f['pid']}): unhealthy at most {bound(s):g} s after the "
        f"freeze (with the defaults {bound(DEFAULTS):g} s), then stop grace "
        f"{s['stop_grace_seconds']:g} s and back-off {backoff:g} s (--rehearsal caps "
        f"restart_backoff_seconds at {REHEARSAL_BACKOFF_SECONDS:g} s)",
        f"  seconds after the freeze: unhealthy {f['unhealthy']}  /healthz degraded "
        f"{f['healthz_degraded']}  frozen process gone {f['frozen_process_gone']}  "
        f"ready again {f['ready_again']}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-seconds", type=float, default=6.0, help="endless-head time")
    parser.add_argument("--clients", type=int, default=100, help="trickling clients")
    parser.add_argument("--rate", type=float, default=1.0, help="each trickle's bytes/second")
    parser.add_argument("--body-total-seconds", type=float, default=10.0)
    parser.add_argument(
        "--liveness-defaults", action="store_true", help="the default probes (about 90 s more)"
    )
    parser.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.head_seconds, args.clients, args.body_total_seconds = 2.0, 20, 3.0
    settings = {**BENCH_SETTINGS, "request_body_total_seconds": args.body_total_seconds}
    if args.liveness_defaults:
        settings.update({k: DEFAULTS[k] for k in LIVENESS})
    port = free_port()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gk-bench-edge-")))
        extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
        proc = stack.enter_context(
            sidecar(work, port, preload=True, worker_env=WORKER_ENV, extra=extra, rehearsal=True)
        )
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            wait_ready(c)
            for _ in range(20):  # warm-up: imports, pools
                c.get("/v1/models")
        heads = measure_heads(proc.pid, port, args.head_seconds)
        bodies = measure_trickles(proc.pid, port, args.clients, args.rate, settings)
        freeze = measure_freeze(base, 180.0)
    shown = ", ".join(f"{k} {v:g} ({DEFAULTS[k]:g})" for k, v in settings.items())
    print(f"# bench/edge.py: gatekeeper serve --rehearsal, {os.cpu_count()} CPUs")
    print(f"# settings for the bench (default): {shown}")
    print("\n".join([*report_heads(heads), *report_trickles(bodies)]))
    print("\n".join(report_freeze(freeze, settings)))
    figures = {"settings": settings, "head": heads, "trickle": bodies, "freeze": freeze}
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
