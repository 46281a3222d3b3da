"""Admission storm: ``gatekeeper serve`` (the installed command, a declared node,
simulator workers that turn ready in 50 ms) under ``--admissions`` deploys from
``--clients`` concurrent clients, with ``share_gpus`` on and then off.

Each client deploys ``Qwen/Qwen3-8B`` under a name of its own, waits for the worker to
serve, holds it a moment and undeploys it, so workers keep turning ready while other
admissions are being decided. An auditor with its own connection to the ledger file
checks throughout that no GPU is promised more than its usable memory (total less the
policy's margin; with sharing off, also at most one worker per GPU). Printed per mode:
admissions admitted, refused and other, workers that served, audits and over-commits,
and the peak share of a GPU's usable memory promised.

    python -m bench.storm --admissions 1000 --clients 50
"""

from __future__ import annotations

import argparse
import collections
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.serve_process import TOKEN, free_port, sidecar
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.settings import Settings, placement_policy
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from gatekeeper.sidecar.ledger_view import promised_bytes, workers_per_gpu

MODEL = "Qwen/Qwen3-8B"
GPUS = "2xH100-80GB"
WORKER_ENV = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.05", GATEKEEPER_SIM_TOKEN_SECONDS = "0.01" }'


class Storm:
    """One storm against one running sidecar: its clients and its auditor."""

    def __init__(self, base: str, state: Path, share: bool, admissions: int) -> None:
        policy = placement_policy(Settings(gpus=GPUS, share_gpus=share))
        self.usable = {
            g.uuid: g.total_bytes - policy.margin_for(g.total_bytes)
            for g in StaticInventory(parse_declared_node(GPUS)).snapshot().gpus
        }
        self.base, self.state, self.share = base, state, share
        self.counts: collections.Counter[str] = collections.Counter()
        self.over: list[str] = []
        self.peak = 0.0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.tickets = iter(range(admissions))

    def audit(self) -> None:
        with Ledger(ledger_path(self.state)) as ledger:
            while not self.stop.is_set():
                live = ledger.live()  # one SELECT: ready rows and unexpired pending ones
                for gpu, held in promised_bytes(live).items():
                    self.peak = max(self.peak, held / self.usable[gpu])
                    if held > self.usable[gpu]:
                        self.over.append(f"{gpu}: {100 * held / self.usable[gpu]:.0f}% of usable")
                if not self.share:
                    for gpu, n in workers_per_gpu(live).items():
                        if n > 1:
                            self.over.append(f"{gpu}: {n} workers with sharing off")
                self.counts["audits"] += 1
                time.sleep(0.005)

    def client(self, i: int) -> None:
        rng = random.Random(i)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=self.base, headers=headers, timeout=60) as http:
            for n in self.tickets:
                body = {"model": MODEL, "name": f"c{i}-{n}", "options": {"max_model_len": 4096}}
                r = http.post("/admin/deployments", json=body)
                kind = {201: "admitted", 507: "refused"}.get(
                    r.status_code, f"other_{r.status_code}"
                )
                self.count(kind)
                if r.status_code != 201:
                    time.sleep(rng.uniform(0.0, 0.05))
                    continue
                deployment_id = r.json()["deployment"]["id"]
                self.count(f"worker_{self.serving(http, deployment_id)}")
                time.sleep(rng.uniform(0.0, 0.3))
                http.delete(f"/admin/deployments/{deployment_id}")

    def count(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1

    @staticmethod
    def serving(http: httpx.Client, deployment_id: str) -> str:
        state = "?"
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            state = http.get(f"/admin/deployments/{deployment_id}").json()["state"]
            if state in ("ready", "failed"):
                break
            time.sleep(0.02)
        return state

    def run(self, clients: int) -> float:
        auditor = threading.Thread(target=self.audit, daemon=True)
        auditor.start()
        started = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - started
        self.stop.set()
        auditor.join(10)
        return seconds


def storm(admissions: int, clients: int, share: bool) -> str:
    port = free_port()
    extra = f"share_gpus = {'true' if share else 'false'}\nstop_grace_seconds = 1.0\ndrain_seconds = 0.1\n"
    with tempfile.TemporaryDirectory(prefix="gk-storm-") as tmp:
        work = Path(tmp)
        with sidecar(work, port, preload=False, worker_env=WORKER_ENV, gpus=GPUS, extra=extra):
            base = f"http://127.0.0.1:{port}"
            s = Storm(base, work / "state", share, admissions)
            seconds = s.run(clients)
    c = s.counts
    other = sum(v for k, v in c.items() if k.startswith("other"))
    line = (
        f"share_gpus={'on ' if share else 'off'}  admitted {c['admitted']}  refused {c['refused']}  "
        f"other {other}  served {c['worker_ready']}  audits {c['audits']}  "
        f"over-commits {len(s.over)}  peak {100 * s.peak:.1f}% of usable  ({seconds:.0f} s)"
    )
    return line + (f"\n  first over-commits: {s.over[:3]}" if s.over else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    args = parser.parse_args()
    print(f"storm: {args.admissions} admissions from {args.clients} clients, {MODEL} on {GPUS}")
    for share in (True, False):
        print(storm(args.admissions, args.clients, share))


if __name__ == "__main__":
    main()
