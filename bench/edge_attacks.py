"""The drivers of ``bench.edge``: what it does to the sidecar, and how it watches.

- ``Sampler`` / ``idle_rss``: the sidecar's VmRSS from ``/proc``, every 100 ms in a thread;
- ``measure_heads``: one client sending a request head that never ends (``HEAD_KINDS``:
  header lines without end, one header line without end), connecting again each time it
  is cut;
- ``measure_trickles``: clients that announce ``ANNOUNCED`` body bytes and send one at a
  time;
- ``measure_freeze``: SIGSTOP to the ready worker's process group, and the seconds until
  the admin API, ``/healthz`` and ``/proc`` show each step of its replacement.

Each returns its figures as a dict (sizes in bytes, times in seconds); ``bench.edge``
runs them against ``gatekeeper serve --rehearsal`` and prints the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.serve_process import TOKEN

ANNOUNCED = 1_000_000
"""The body length each trickling client announces."""

LINES = b"".join(b"X-Pad-%05d: %s\r\n" % (i, b"a" * 80) for i in range(640))
"""Header lines, about 64 KiB a write: sent again and again, the head never ends."""
ENDLESS_LINE = b"a" * 65536
"""One header line's value, a write at a time: the line never ends."""
HEAD_KINDS = {"lines": (b"", LINES), "line": (b"X-Endless: ", ENDLESS_LINE)}


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
