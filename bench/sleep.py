"""Idle policy stop vs sleep (#40's Figures): more models than fit at once, each wakes.

    python bench/sleep.py [--requests 40] [--seed 40] [--kills 10]

The installed ``gatekeeper serve --rehearsal`` (``serve_process.sidecar``) on a declared
2xH100-80GB node with ``share_gpus`` and 256 GiB of host memory (``--host-gib``; declared
through ``host_memory_root`` as the GPUs are), six catalog models of 15-40 GiB each (their
weights plus an 8 GiB KV cache budget: together more than the node holds), and one
replayed trace (a seeded random order touching every model) sent to it once per idle
policy: ``stop`` (idle_eviction, idle_seconds 0: an idle worker is stopped for the room),
``sleep`` at level 1 and at level 2 (idle workers put to sleep for the room). For each:
requests answered, launches (cold starts), wakes (cold starts avoided), and the ledger
audited after every request (on each GPU the rows' bytes never above its total) and
after the sidecar stops (0 live rows). Start and wake times are the simulator's
(``GATEKEEPER_SIM_STARTUP_SECONDS``; its wake is immediate), not a GPU's: labelled so.

With ``--kills N`` (default 10), each sleep policy is replayed once more with N SIGKILLs
of the sidecar at random points: before N requests chosen at random, the request is sent
from a thread and the sidecar killed a random 0-1.5 s later (mid-launch, mid-wake,
mid-sleep or mid-answer), then started again on the same state directory, adopting the
workers that outlived it. Counted: requests cut by a kill (launches, wakes and sleeps are
summed over the sidecar's lives, read before each kill), and leaked ledger rows (live
rows of a worker that is not running, audited before every kill and at the end) and
orphaned workers (simulator processes still running after the sidecar's final stop):
both must be 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.serve_process import TOKEN, free_port, sidecar
from gatekeeper.gpus.host_memory import write_host_files
from gatekeeper.sidecar import Ledger, ledger_path
from gatekeeper.sidecar.ledger_view import LedgerView
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


def run_policy(
    policy: str, names: list[str], work: Path, *, kills: int = 0, seed: int = 0, host_gib: int = 0
) -> dict[str, Any]:
    port = free_port()
    extra = "share_gpus = true\nrequest_wait_seconds = 60\n" + POLICIES[policy]
    if host_gib:
        root = write_host_files(
            work / "host", total_bytes=host_gib * GIB, available_bytes=host_gib * GIB
        )
        extra += f"host_memory_root = {json.dumps(str(root))}\n"
    extra += models_toml()
    env = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "1.0", GATEKEEPER_SIM_TOKEN_SECONDS = "0.001" }'
    answered, refused, cut, worst, worst_host, leaked_mid = 0, 0, 0, 0, 0, 0
    earlier: dict[str, int] = {}  # counters of the sidecar's lives before the last kill
    least: dict[str, float] = {}  # the least headroom the sidecar reported, GPU and host
    reasons: dict[str, int] = {}
    ledger_file = ledger_path(work / "state" / "rehearsal")
    rng = random.Random(seed)
    kill_before = set(rng.sample(range(1, len(names)), kills)) if kills else set()
    started = time.monotonic()

    def start() -> Any:
        return sidecar(work, port, preload=False, worker_env=env, extra=extra, rehearsal=True)

    def send(client: httpx.Client, name: str) -> httpx.Response:
        return client.post("/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 2})

    running = start()
    proc = running.__enter__()
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=120) as client:
            for i, name in enumerate(names):
                if i in kill_before:
                    leaked_mid += _leaked_rows(ledger_file)
                    earlier = _add_counts(earlier, client.get("/metrics").text)
                    thread = threading.Thread(target=_send_quietly, args=(send, client, name))
                    thread.start()
                    time.sleep(rng.uniform(0.0, 1.5))
                    proc.kill()
                    proc.wait()
                    thread.join()
                    running.__exit__(None, None, None)
                    cut += 1
                    running = start()
                    proc = running.__enter__()
                    continue
                r = send(client, name)
                answered += r.status_code == 200
                if r.status_code != 200:
                    refused += 1
                    why = f"{r.status_code} " + _reason(r.json()["error"]["message"])
                    reasons[why] = reasons.get(why, 0) + 1
                on_a_gpu, on_the_host = _promised(ledger_file)
                worst, worst_host = max(worst, on_a_gpu), max(worst_host, on_the_host)
                seen = client.get("/metrics").text
                for key, name in HEADROOM.items():
                    least[key] = min([least.get(key, math.inf), *_values(seen, name)])
            leaked_mid += _leaked_rows(ledger_file)
            metrics = client.get("/metrics").text
            admin = {"Authorization": f"Bearer {TOKEN}"}
            listed = client.get("/admin/deployments", headers=admin).json()["deployments"]
    finally:
        running.__exit__(None, None, None)
    with Ledger(ledger_file) as ledger:
        leaked = len(ledger.live())
    killed = {"sidecar SIGKILLs": kills, "requests cut by a kill": cut,
              "ledger: rows of workers not running (audited before each kill)": leaked_mid,
              "orphaned workers after the final stop": _orphans(port)} if kills else {}  # fmt: skip
    return {
        "policy": policy + (f", {kills} SIGKILLs" if kills else ""),
        "requests": len(names),
        "answered": answered,
        "refused": refused,
        "refusals": reasons,
        **killed,
        **_add_counts(earlier, metrics),
        "served at the end": sorted((d["name"], d["state"]) for d in listed
                                    if d["state"] not in ("stopped", "failed")),
        "ledger: most bytes on one GPU (GiB)": round(worst / GIB, 2),
        "ledger: never above the GPU's 80 GiB": worst <= H100_TOTAL_BYTES,
        "ledger: most host bytes promised (GiB)": round(worst_host / GIB, 2),
        "least GPU headroom (free - promised - margin, GiB; never below 0)":
            round(least.get("gpu", math.nan) / GIB, 2),
        "least host headroom (available - promised, GiB; never below 0)":
            round(least.get("host", math.nan) / GIB, 2),
        "ledger: live rows after the sidecar stopped": leaked,
        "seconds (the simulator's, not a GPU's)": round(time.monotonic() - started, 1),
    }  # fmt: skip


COUNTED = {
    "launches": "gatekeeper_worker_launch_duration_seconds_count",
    "wakes (cold starts avoided)": "gatekeeper_worker_wakes_total",
    "sleeps": "gatekeeper_worker_sleeps_total",
}


def _add_counts(earlier: dict[str, int], metrics: str) -> dict[str, int]:
    """Launches, wakes and sleeps: ``earlier`` lives' counts plus this one's (a sidecar's
    counters start again at 0 after a kill)."""
    return {
        label: earlier.get(label, 0) + int(_sum(metrics, name)) for label, name in COUNTED.items()
    }


def _send_quietly(send: Any, client: httpx.Client, name: str) -> None:
    """A request the sidecar is killed under: its failure is the point."""
    with contextlib.suppress(httpx.HTTPError):
        send(client, name)


def _alive(pid: int) -> bool:
    """Running (a zombie the killed sidecar left unreaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _leaked_rows(path: Path) -> int:
    """Live ledger rows whose worker has a pid that no longer runs."""
    with Ledger(path) as ledger:
        return sum(1 for row in ledger.live() if row.pid is not None and not _alive(row.pid))


def _orphans(port: int) -> int:
    """Simulator workers still running on this run's worker ports (``port``+1..+99)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gatekeeper.simulator" not in b" ".join(argv) or b"--port" not in argv:
            continue
        worker_port = argv[argv.index(b"--port") + 1]
        count += worker_port.isdigit() and port < int(worker_port) <= port + 99
    return count


def _reason(message: str) -> str:
    """A refusal's first line and, for a 507, its reason line (which resource)."""
    lines = message.splitlines()
    return " / ".join(line[:140] for line in lines[:3:2])


def _promised(path: Path) -> tuple[int, int]:
    """From one read of the ledger's live rows: the most bytes they promise and hold on
    one GPU, and the host bytes they promise in all (admission keeps it within the node's
    available host memory less its margin)."""
    with Ledger(path) as ledger:
        live = ledger.live()
    view = LedgerView.of(live)
    per_gpu: dict[str, int] = {}
    for mapping in (view.promised, view.held):
        for gpu, num_bytes in mapping.items():
            per_gpu[gpu] = per_gpu.get(gpu, 0) + num_bytes
    return max(per_gpu.values(), default=0), sum(row.host_bytes for row in live)


HEADROOM = {"gpu": "gatekeeper_gpu_headroom_bytes", "host": "gatekeeper_host_headroom_bytes"}


def _values(metrics: str, name: str) -> list[float]:
    """Every sample of ``name`` in a ``/metrics`` text."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith((name + "{", name + " "))
    ]


def _sum(metrics: str, name: str) -> float:
    return sum(_values(metrics, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs per sleep policy")
    parser.add_argument(
        "--host-gib",
        type=int,
        default=256,
        help="the declared node's host memory, GiB (declared as its GPUs are); 0: this "
        "machine's own /proc/meminfo and cgroup",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.kills < args.requests:
        parser.error(f"--kills is {args.kills}; give 0 to {args.requests - 1} (one per request)")
    names = trace(args.requests, args.seed)
    runs = [(policy, 0) for policy in POLICIES]
    runs += [(policy, args.kills) for policy in POLICIES if args.kills and policy != "stop"]
    results = []
    for policy, kills in runs:
        with tempfile.TemporaryDirectory(prefix="gk-sleep-bench-") as work:
            run = run_policy(
                policy, names, Path(work), kills=kills, seed=args.seed, host_gib=args.host_gib
            )
            results.append(run)
            print(json.dumps(results[-1]), flush=True)
    host = f"{args.host_gib} GiB host memory (declared)" if args.host_gib else "this machine's"
    print(json.dumps({"node": f"2xH100-80GB (declared), {host}", "trace": names, "results": results},
                     indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
