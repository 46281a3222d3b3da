"""Soak: ``gatekeeper serve`` (the installed command, a declared node, a simulator worker
it launches) under a steady mix of traffic for ``--duration`` seconds.

Clients (``--clients``, threads) loop over: a chat completion, a streamed chat
completion, a text completion, ``/v1/models``, the admin deployment list and a
``/metrics`` scrape. Printed: requests and errors by kind, latency p50/p99, and the
sidecar's resident memory (VmRSS, MiB) and open file descriptors at the start (after a
warm-up), the peak and the end. A leak shows as an end far above the start.

    python -m bench.soak --duration 180
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.serve_process import TOKEN, free_port, sidecar

WORKER_ENV = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.3", GATEKEEPER_SIM_TOKEN_SECONDS = "0.001" }'


def usage(pid: int) -> tuple[float, int]:
    """(VmRSS in MiB, open file descriptors) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def wait_ready(client: httpx.Client, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            body = client.get("/admin/deployments").json()
            if any(d["state"] == "ready" for d in body.get("deployments", [])):
                return
        time.sleep(0.2)
    raise RuntimeError("the preloaded worker did not become ready")


def one_round(
    client: httpx.Client, record: collections.Counter[str], latencies: list[float]
) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    calls: list[tuple[str, Callable[[], httpx.Response]]] = [
        ("chat", lambda: client.post("/v1/chat/completions", json=chat)),
        (
            "completion",
            lambda: client.post(
                "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8}
            ),
        ),
        ("models", lambda: client.get("/v1/models")),
        ("admin_list", lambda: client.get("/admin/deployments")),
        ("metrics", lambda: client.get("/metrics")),
    ]
    for kind, call in calls:
        start = time.perf_counter()
        try:
            status = call().status_code
        except httpx.HTTPError as e:
            record[f"{kind}:{type(e).__name__}"] += 1
            continue
        latencies.append(time.perf_counter() - start)
        record[f"{kind}:{status}"] += 1
    start = time.perf_counter()
    try:
        with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
            chunks = sum(1 for line in r.iter_lines() if line.startswith("data:"))
            ok = r.status_code == 200 and chunks > 1
            record["stream:" + (str(r.status_code) if ok else f"{r.status_code}-short")] += 1
    except httpx.HTTPError as e:
        record[f"stream:{type(e).__name__}"] += 1
        return
    latencies.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of traffic")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    args = parser.parse_args()
    port = free_port()
    with (
        tempfile.TemporaryDirectory(prefix="gk-soak-") as tmp,
        sidecar(Path(tmp), port, preload=True, worker_env=WORKER_ENV) as proc,
    ):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
            wait_ready(c)
            for _ in range(20):  # warm-up: imports, pools, first scrapes
                one_round(c, collections.Counter(), [])
        start_rss, start_fds = usage(proc.pid)
        peak_rss, peak_fds = start_rss, start_fds
        record: collections.Counter[str] = collections.Counter()
        latencies: list[float] = []
        stop = time.monotonic() + args.duration
        lock = threading.Lock()

        def client_loop() -> None:
            mine: collections.Counter[str] = collections.Counter()
            times: list[float] = []
            with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
                while time.monotonic() < stop:
                    one_round(c, mine, times)
            with lock:
                record.update(mine)
                latencies.extend(times)

        threads = [threading.Thread(target=client_loop) for _ in range(args.clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss, fds = usage(proc.pid)
            peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
            time.sleep(1.0)
        for t in threads:
            t.join()
        end_rss, end_fds = usage(proc.pid)
        assert proc.poll() is None, "the sidecar died during the soak"
    total = sum(record.values())
    errors = {k: v for k, v in record.items() if not k.endswith(":200")}
    latencies.sort()
    print(f"soak: {args.duration:.0f} s, {args.clients} clients, gatekeeper serve + simulator")
    print(f"requests {total}  errors {sum(errors.values())}  {dict(sorted(errors.items()))}")
    print(f"by kind {dict(sorted(record.items()))}")
    if latencies:
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"latency p50 {statistics.median(latencies) * 1000:.1f} ms  p99 {p99 * 1000:.1f} ms")
    print(f"sidecar RSS MiB start {start_rss:.1f}  peak {peak_rss:.1f}  end {end_rss:.1f}")
    print(f"sidecar fds     start {start_fds}  peak {peak_fds}  end {end_fds}")


if __name__ == "__main__":
    main()
