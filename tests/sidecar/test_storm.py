"""A deploy storm on a declared node with ``share_gpus`` (issue #13 item 6): a real
sidecar, simulator workers that turn ready fast, twenty clients deploying and
undeploying at once, and an auditor with its own ``Ledger`` on the file checking that
no GPU is ever promised more than it has usable.

A worker turning ready between an admission's GPU snapshot and its ledger transaction
used to be counted by neither (it was no longer outstanding, and not yet in the
snapshot's used memory), and so was a worker being stopped (its row still ready, its
deployment no longer): the storm promised 103% of the GPU's usable memory in every
run. Now the snapshot holds the ledger's ready rows and the transaction counts those
that turned ready since the snapshot.

Clients wait for each worker to serve before undeploying it (a worker deleted while it
loads never turns ready, and then nothing races)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.settings import placement_policy
from gatekeeper.sidecar.admission import admit
from gatekeeper.sidecar.app import _held
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from gatekeeper.sidecar.ledger_view import promised_bytes
from gatekeeper.sidecar.rehearsal import RehearsalInventory
from tests.support.sidecar_harness import TOKEN, free_port_block, running_sidecar, settings_for

CLIENTS = 20
MODEL = "Qwen/Qwen3-8B"
"""21.2 GB promised: three fit on an H100-80GB, a fourth would not."""
STORM_SECONDS = 15.0
GiB = 2**30


def test_a_deploy_storm_never_promises_more_than_a_gpu_has(tmp_path: Path) -> None:
    ports = free_port_block(80)
    settings = settings_for(
        tmp_path,
        gpus="1xH100-80GB",
        worker_port_min=ports + 1,
        worker_port_max=ports + 79,
        share_gpus=True,
        stop_grace_seconds=1.0,
        drain_seconds=0.1,
        worker_env={
            "GATEKEEPER_SIM_STARTUP_SECONDS": "0.05",
            "GATEKEEPER_SIM_TOKEN_SECONDS": "0.01",
        },
    )
    policy = placement_policy(settings)
    usable = {
        g.uuid: g.total_bytes - policy.margin_for(g.total_bytes)
        for g in StaticInventory(parse_declared_node(settings.gpus)).snapshot().gpus
    }
    violations: list[str] = []
    counts = {"admitted": 0, "refused": 0, "other": 0, "audits": 0}
    count_lock = threading.Lock()
    stop = threading.Event()

    def audit() -> None:
        with Ledger(ledger_path(tmp_path)) as ledger:
            while not stop.is_set():
                live = ledger.live()  # one SELECT: ready rows + unexpired pending ones
                for gpu, held in promised_bytes(live).items():
                    if held > usable[gpu]:
                        violations.append(
                            f"{gpu}: {held / GiB:.2f} GiB promised to {len(live)} rows, "
                            f"{usable[gpu] / GiB:.2f} GiB usable "
                            f"({100 * held / usable[gpu]:.0f}%)"
                        )
                counts["audits"] += 1
                time.sleep(0.005)

    def client(i: int, url: str, deadline: float) -> None:
        rng = random.Random(i)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                r = http.post(
                    "/admin/deployments",
                    json={"model": MODEL, "name": f"c{i}-{n}", "options": {"max_model_len": 4096}},
                )
                kind = {201: "admitted", 507: "refused"}.get(r.status_code, "other")
                with count_lock:
                    counts[kind] += 1
                if r.status_code != 201:
                    time.sleep(rng.uniform(0.0, 0.05))
                    continue
                deployment_id = r.json()["deployment"]["id"]
                while time.monotonic() < deadline + 30:  # until it serves (or failed)
                    state = http.get(f"/admin/deployments/{deployment_id}").json()["state"]
                    if state in ("ready", "failed"):
                        break
                    time.sleep(0.02)
                with count_lock:
                    counts[state] = counts.get(state, 0) + 1
                time.sleep(rng.uniform(0.0, 0.3))
                http.delete(f"/admin/deployments/{deployment_id}")

    with running_sidecar(settings) as sc:
        auditor = threading.Thread(target=audit, daemon=True)
        auditor.start()
        deadline = time.monotonic() + STORM_SECONDS
        clients = [
            threading.Thread(target=client, args=(i, sc.url, deadline), daemon=True)
            for i in range(CLIENTS)
        ]
        for t in clients:
            t.start()
        for t in clients:
            t.join(STORM_SECONDS + 60)
        stop.set()
        auditor.join(10)
    print(f"storm: {counts}, violations: {len(violations)}", *violations[:5], sep="\n  ")
    assert counts["admitted"] > 0 and counts["refused"] > 0 and counts.get("ready", 0) > 0, counts
    assert counts["audits"] > 0
    assert violations == [], f"{len(violations)} over-commits, first: {violations[:3]}"


class StepClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def test_workers_turning_ready_between_snapshot_and_transaction_are_counted(
    tmp_path: Path,
) -> None:
    """The storm's race, interleaved by hand on the sidecar's own parts: the rehearsal
    inventory (held = the ledger's ready rows) and the admission it feeds."""
    policy = PlacementPolicy(share_gpus=True)
    request = PlacementRequest(resolve_model("Qwen/Qwen3-0.6B"), ServeOptions(max_model_len=4096))
    with Ledger(ledger_path(tmp_path), clock=StepClock()) as ledger:
        inventory = RehearsalInventory(
            StaticInventory(parse_declared_node("1xH100-80GB")), lambda: _held(ledger)
        )

        def one(deployment_id: str, since: float | None) -> bool:
            snapshot = inventory.snapshot()
            return admit(
                ledger,
                request,
                snapshot,
                deployment_id=deployment_id,
                policy=policy,
                ttl_seconds=600,
                since=since,
            ).admitted

        fits = 0
        while one(f"w{fits}", ledger.now()):
            fits += 1
        assert fits > 2
        since = ledger.now()
        snapshot = inventory.snapshot()  # every worker still pending: none held
        for i in range(fits):  # ... and now they all turn ready
            assert ledger.mark_ready(f"w{i}") == 1
        late = admit(
            ledger,
            request,
            snapshot,
            deployment_id="late",
            policy=policy,
            ttl_seconds=600,
            since=since,
        )
        assert not late.admitted, "the workers that turned ready were counted by neither"
        assert not one("fresh", ledger.now()), "a fresh snapshot holds the ready workers"
        (gpu,) = inventory.snapshot().gpus
        assert gpu.used_bytes == sum(promised_bytes(ledger.live()).values())
