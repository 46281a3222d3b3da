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

The drivers are ``bench.edge_attacks``; this module sets the sidecar up, runs them and
prints the report. Run ``python -m bench.edge`` (about 40 s on 2 CPUs; ``--quick``: about
20 s). The last line is one JSON object with every figure (sizes in bytes, times in
seconds). ``--liveness-defaults`` freezes the worker under the default probes, stop grace
and back-off instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.edge_attacks import HEAD_KINDS, measure_freeze, measure_heads, measure_trickles
from bench.serve_process import TOKEN, free_port, sidecar
from bench.soak import wait_ready
from gatekeeper.settings import Settings

WORKER_ENV = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.3", GATEKEEPER_SIM_TOKEN_SECONDS = "0.001" }'
MIB = 1 << 20
RSS_BOUND_BYTES = 50 * 1000 * 1000
"""#27: an endless head keeps the sidecar within 50 MB of its idle RSS."""
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
