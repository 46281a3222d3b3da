"""Idle policy stop vs sleep (#40's Figures): more models than fit at once, each wakes.

    python bench/sleep.py [--requests 40] [--seed 40]

The installed ``gatekeeper serve --rehearsal`` (``serve_process.sidecar``) on a declared
2xH100-80GB node with ``share_gpus``, six catalog models of 15-40 GiB each (their
weights plus an 8 GiB KV cache budget: together more than the node holds), and one
replayed trace (a seeded random order touching every model) sent to it once per idle
policy: ``stop`` (idle_eviction, idle_seconds 0: an idle worker is stopped for the room),
``sleep`` at level 1 and at level 2 (idle workers put to sleep for the room). For each:
requests answered, launches (cold starts), wakes (cold starts avoided), and the ledger
audited after every request (on each GPU the rows' bytes never above its total) and
after the sidecar stops (0 live rows). Start and wake times are the simulator's
(``GATEKEEPER_SIM_STARTUP_SECONDS``; its wake is immediate), not a GPU's: labelled so.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serve_process import TOKEN, free_port, sidecar
from gatekeeper.sidecar import Ledger, ledger_path
from gatekeeper.units import GIB

MODELS = {
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "gemma2-9b": "google/gemma-2-9b-it",
    "gemma3-12b": "google/gemma-3-12b-it",
    "qwen2.5-14b": "Qwen/Qwen2.5-14B-Instruct",
    "qwen3-14b": "Qwen/Qwen3-14B",
}
POLICIES = {
    "stop": 'idle_eviction = true\nidle_seconds = 0\nidle_action = "stop"\n',
    "sleep level 1": 'idle_seconds = 3600\nidle_action = "sleep"\nsleep_level = 1\n',
    "sleep level 2": 'idle_seconds = 3600\nidle_action = "sleep"\nsleep_level = 2\n',
}
H100_TOTAL_BYTES = 80 * GIB


def trace(requests: int, seed: int) -> list[str]:
    """Every model once, then a seeded random order: the replayed trace."""
    rng = random.Random(seed)
    names = list(MODELS)
    order = rng.sample(names, len(names))
    return order + [rng.choice(names) for _ in range(requests - len(order))]


def models_toml() -> str:
    entries = [
        f'[[models]]\nname = "{name}"\nmodel = "{repo}"\n'
        "options = { max_model_len = 8192, kv_cache_memory_bytes = 8589934592 }\n"
        for name, repo in MODELS.items()
    ]
    return "".join(entries)


def run_policy(policy: str, names: list[str], work: Path) -> dict[str, Any]:
    port = free_port()
    extra = "share_gpus = true\nrequest_wait_seconds = 60\n" + POLICIES[policy] + models_toml()
    env = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "1.0", GATEKEEPER_SIM_TOKEN_SECONDS = "0.001" }'
    answered, refused, worst = 0, 0, 0
    reasons: dict[str, int] = {}
    ledger_file = ledger_path(work / "state" / "rehearsal")
    started = time.monotonic()
    with sidecar(work, port, preload=False, worker_env=env, extra=extra, rehearsal=True):
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=120) as client:
            for name in names:
                body = {"model": name, "prompt": "hi", "max_tokens": 2}
                r = client.post("/v1/completions", json=body)
                answered += r.status_code == 200
                if r.status_code != 200:
                    refused += 1
                    why = f"{r.status_code} " + _reason(r.json()["error"]["message"])
                    reasons[why] = reasons.get(why, 0) + 1
                worst = max(worst, _most_on_a_gpu(ledger_file))
            metrics = client.get("/metrics").text
            admin = {"Authorization": f"Bearer {TOKEN}"}
            listed = client.get("/admin/deployments", headers=admin).json()["deployments"]
    with Ledger(ledger_file) as ledger:
        leaked = len(ledger.live())
    return {
        "policy": policy,
        "requests": len(names),
        "answered": answered,
        "refused": refused,
        "refusals": reasons,
        "launches": int(_sum(metrics, "gatekeeper_worker_launch_duration_seconds_count")),
        "wakes (cold starts avoided)": int(_sum(metrics, "gatekeeper_worker_wakes_total")),
        "sleeps": int(_sum(metrics, "gatekeeper_worker_sleeps_total")),
        "served at the end": sorted((d["name"], d["state"]) for d in listed
                                    if d["state"] not in ("stopped", "failed")),
        "ledger: most bytes on one GPU (GiB)": round(worst / GIB, 2),
        "ledger: never above the GPU's 80 GiB": worst <= H100_TOTAL_BYTES,
        "ledger: live rows after the sidecar stopped": leaked,
        "seconds (the simulator's, not a GPU's)": round(time.monotonic() - started, 1),
    }  # fmt: skip


def _reason(message: str) -> str:
    """A refusal's first line and, for a 507, its reason line (which resource)."""
    lines = message.splitlines()
    return " / ".join(line[:140] for line in lines[:3:2])


def _most_on_a_gpu(path: Path) -> int:
    with Ledger(path) as ledger:
        view = ledger.view()
    per_gpu: dict[str, int] = {}
    for mapping in (view.promised, view.held):
        for gpu, num_bytes in mapping.items():
            per_gpu[gpu] = per_gpu.get(gpu, 0) + num_bytes
    return max(per_gpu.values(), default=0)


def _sum(metrics: str, name: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--seed", type=int, default=40)
    args = parser.parse_args(argv)
    names = trace(args.requests, args.seed)
    results = []
    for policy in POLICIES:
        with tempfile.TemporaryDirectory(prefix="gk-sleep-bench-") as work:
            results.append(run_policy(policy, names, Path(work)))
            print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"node": "2xH100-80GB (declared)", "trace": names, "results": results},
                     indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
