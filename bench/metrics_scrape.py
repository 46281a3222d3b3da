"""Scrape cost of the sidecar's /metrics: 8 GPUs and 50 workers (median, p90).

    python -m bench.metrics_scrape [--runs 200]

The GPUs are a declared node of 8 H100s with the workers' processes on them (so the
per-process-tree attribution runs), each of the 50 workers with a prediction and vLLM's
figures; the exposition is rendered by ``prometheus_client.generate_latest`` exactly as
the ``/metrics`` route does. NVML's own time is measured apart by
``bench/snapshot_latency.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from prometheus_client import CollectorRegistry, generate_latest

from gatekeeper.gpus import GpuProcess, StaticInventory, parse_declared_node
from gatekeeper.metrics import Component, MetricSources, WorkerView, register_collectors
from gatekeeper.units import GIB

GPUS, WORKERS = 8, 50


def node() -> StaticInventory:
    snapshot = parse_declared_node(f"{GPUS}xH100-80GB")
    gpus = []
    for g in snapshot.gpus:
        procs = tuple(GpuProcess(pid=100_000 + g.index * 10 + k, used_bytes=GIB) for k in range(7))
        gpus.append(g.__class__(**{**{f: getattr(g, f) for f in g.__slots__}, "processes": procs}))
    return StaticInventory(
        snapshot.__class__(
            **{**{f: getattr(snapshot, f) for f in snapshot.__slots__}, "gpus": tuple(gpus)}
        )
    )


def views() -> list[WorkerView]:
    out = []
    for i in range(WORKERS):
        components: dict[Component, int] = {
            "weights": 15 * GIB,
            "kv_cache": 50 * GIB,
            "activation": 2 * GIB,
            "non_torch": GIB // 4,
            "cuda_graph": GIB,
        }
        out.append(
            WorkerView(
                worker=f"model-{i % 10}-{i:08x}",
                model=f"model-{i % 10}",
                state="ready",
                gpu_indices=(i % GPUS,),
                predicted=components,
                actual=components,
                pid=100_000 + (i % GPUS) * 10 + i % 7,
                family="llama",
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    registry = CollectorRegistry()
    workers = views()
    sources = MetricSources(
        node(),
        promised=dict,
        workers=lambda: workers,
        outstanding=lambda: 3,
        known_models=lambda: {v.model for v in workers},
    )
    metrics = register_collectors(registry, sources).metrics
    for v in workers:
        metrics.worker_ready(v, 30.0)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        body = generate_latest(registry)
        times.append(time.perf_counter() - start)
    times.sort()
    lines = body.decode().count("\n")
    print(f"/metrics with {GPUS} GPUs and {WORKERS} workers: {lines} lines, {len(body)} bytes")
    print(
        f"scrape cost over {args.runs} runs: median {statistics.median(times) * 1e3:.1f} ms, "
        f"p90 {times[int(0.9 * len(times))] * 1e3:.1f} ms, min {times[0] * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
