"""The DRA kubelet plugin's prepare latency, the agent's /metrics with 50 pods, and a race
for one GPU's last bytes (#30).

Starts Kubernetes' control plane on loopback (``bench.kube_control_plane``: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager from ``build/k8s``) and the
installed ``gatekeeper agent --kubelet-plugin`` as operators run it, on the NVML stand-in
(``gatekeeper.gpus.stand_in``, built with gcc) serving 8 H100s. The agent publishes its
ResourceSlice; the device names come from it, as the scheduler reads them. Then, as
kubelet does (``bench.dra_kubelet``: the registration handshake, then
``NodePrepareResources`` over the plugin's unix socket):

1. **Latency.** ``--claims`` claims (50) of 1 GiB, round robin over the 8 GPUs, each
   prepared in its own call, one after another, so the last one's check runs with 49
   prepared claims on the node. Printed: the round trip's p50, p99 and max, and the same
   prepares again (answered from the checkpoint). Then all are unprepared.
2. **Scrape.** ``--claims`` pods (50) bound to the node (Pod objects; no kubelet runs
   them), each with its claim reserved for it and a real process in a real cgroup named
   after its UID (``bench.pod_cgroups``: root only; skipped, and said, otherwise) using
   1 GiB of its claim's GPU in the stand-in's process list: the agent's ``/metrics``
   (``--metrics-port``) fetched ``--scrapes`` times (100) over HTTP, NVML, the claims and
   the cgroups read at each. Printed: p50 and p99, the lines and bytes, and the pods
   attributed (must be all, each with its 1 GiB).
3. **Race.** GPU 0 holds a process no claim books (a foreign job) and has ``--race-free``
   bytes free (20 GiB); ``--racers`` claims (200) of ``--race-bytes`` (3 GiB) each on it are
   prepared at once, one call per claim from as many threads, released together by a
   barrier. The agent runs with ``--prepare-wait-seconds`` ``--wait`` (2 s): a racer whose
   bytes are not free waits for them in line (at most 12 wait; the rest are refused at
   once), then is refused. Printed: how many were admitted, refused after waiting and
   refused at once, the bytes admitted against the free bytes, and the bytes admitted
   beyond them (must be 0).
4. **Waiter.** One more claim of ``--race-bytes`` on the full GPU 0: its prepare waits;
   once the agent's log says so, one admitted racer is unprepared. Printed: how long after
   the unprepare's answer the waiter's admission came back (the unprepare wakes it; NVML
   is otherwise read again every 0.5 s).

The claims' allocations are written into their status as kube-scheduler writes them (the
result's pool, device and ``consumedCapacity.memory``: ``bench.dra_objects``), not by the
scheduler: the race needs more claims on one GPU than the slice's capacity, which is what
the node sees when memory no claim books is in use (the agent taints such a GPU, but
claims allocated before the taint still come). The prepared claims are reserved for no
pod, so the vLLM flag check is not part of these figures (the scrape's claims are
reserved for their pods and never prepared).

Run ``python -m bench.dra_prepare`` (about 15 s on 2 CPUs, most of it the control plane's
start and the racers' 2 s wait; ``--quick``: 10 claims and 40 racers, about 10 s). The
last line is one JSON object with every figure (sizes in bytes, times in seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from bench.dra_kubelet import Kubelet, registered
from bench.dra_objects import allocated_claim, bound_pod, device_names
from bench.kube_control_plane import KubeCluster, kube_bin_dir, missing_reason, start_cluster
from bench.pod_cgroups import cgroup_root, pod_processes
from bench.serve_process import free_port, stop
from gatekeeper.cluster import DRIVER_NAME, slice_name
from gatekeeper.cluster.kubelet_plugin import PluginSockets
from gatekeeper.cluster.prepared import ClaimRef
from gatekeeper.gpus.stand_in import FakeProcess, build_stub, h100, subprocess_env, write_state
from gatekeeper.units import GIB

NODE = "bench-node"
NS = "dra-prepare-bench"
GPUS = 8
FOREIGN_PID = 4242


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def agent_argv(
    cluster: KubeCluster, sockets: PluginSockets, cdi: Path, metrics_port: int, wait: float
) -> list[str]:
    return [
        str(Path(sys.executable).with_name("gatekeeper")),
        "agent",
        f"--node-name={NODE}",
        "--gpus=nvml",
        f"--kubeconfig={cluster.kubeconfig}",
        "--interval=3600",
        "--kubelet-plugin",
        f"--plugin-dir={sockets.plugin_dir}",
        f"--registry-dir={sockets.registry_dir}",
        f"--cdi-dir={cdi}",
        f"--metrics-port={metrics_port}",
        f"--prepare-wait-seconds={wait}",
        "--log-format=json",  # with the INFO lines: a prepare's wait is seen in its log
    ]


@contextmanager
def agent(
    cluster: KubeCluster, work: Path, state: Path, library: Path, metrics_port: int, wait: float
) -> Iterator[Kubelet]:
    """The installed agent with its kubelet plugin, registered; stopped with SIGTERM (then
    SIGKILL), also when it never registers."""
    short = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # unix socket paths: 107 bytes
    sockets = PluginSockets(short / "plugins", short / "registry", DRIVER_NAME)
    log = work / "agent.log"
    env = subprocess_env(library.parent, state)
    with log.open("ab") as out:
        process = subprocess.Popen(
            agent_argv(cluster, sockets, work / "cdi", metrics_port, wait),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    kubelet: Kubelet | None = None
    try:  # the agent stopped however this ends: registration that fails included
        kubelet = registered(sockets, process, log)
        kubelet.timeout_seconds = 120.0
        yield kubelet
    finally:
        if kubelet is not None:
            kubelet.close()
        stop(process, 30)
        shutil.rmtree(short)


def timed_prepare(kubelet: Kubelet, ref: ClaimRef) -> tuple[float, str]:
    start = time.perf_counter()
    answer = kubelet.prepare(ref)[ref.uid]
    return time.perf_counter() - start, str(answer.error)


def latency(client: Client, kubelet: Kubelet, names: dict[int, str], claims: int) -> dict[str, Any]:
    refs = [
        allocated_claim(client, f"lat-{i}", GIB, names[i % GPUS], namespace=NS, node=NODE)
        for i in range(claims)
    ]
    first = [timed_prepare(kubelet, r) for r in refs]
    again = [timed_prepare(kubelet, r) for r in refs]
    errors = [e for _, e in first + again if e]
    if errors:
        raise RuntimeError(f"prepares refused: {errors[:3]}")
    kubelet.unprepare(*refs)
    seconds = [s for s, _ in first]
    return {
        "claims": claims,
        "prepare_p50_seconds": round(percentile(seconds, 50), 4),
        "prepare_p99_seconds": round(percentile(seconds, 99), 4),
        "prepare_max_seconds": round(max(seconds), 4),
        "again_p50_seconds": round(percentile([s for s, _ in again], 50), 4),
    }


def race(
    client: Client, kubelet: Kubelet, device: str, plan: Plan
) -> tuple[dict[str, Any], list[ClaimRef]]:
    """The figures, and the claims admitted."""
    claim_bytes, free = plan.race_claim_bytes, plan.race_free_bytes
    refs = [
        allocated_claim(client, f"race-{i}", claim_bytes, device, namespace=NS, node=NODE)
        for i in range(plan.racers)
    ]
    barrier = threading.Barrier(plan.racers)
    answers: dict[str, tuple[float, str]] = {}

    def one(ref: ClaimRef) -> None:
        barrier.wait()
        answers[ref.uid] = timed_prepare(kubelet, ref)

    threads = [threading.Thread(target=one, args=(r,)) for r in refs]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    admitted = [r for r in refs if not answers[r.uid][1]]
    refused = [e for _, e in answers.values() if e]
    wrong = [e for e in refused if "are free for it" not in e]
    if wrong:
        raise RuntimeError(f"refused for another reason: {wrong[:3]}")
    admitted_bytes = len(admitted) * claim_bytes
    figures = {
        "racers": plan.racers,
        "race_claim_bytes": claim_bytes,
        "race_free_bytes": free,
        "admitted": len(admitted),
        "refused": len(refused),
        "refused_after_waiting": sum("It waited" in e for e in refused),
        "refused_at_once_line_full": sum("It did not wait" in e for e in refused),
        "fit": free // claim_bytes,
        "admitted_bytes": admitted_bytes,
        "over_admitted_bytes": max(0, admitted_bytes - free),
        "race_seconds": round(elapsed, 3),
        "race_prepare_p99_seconds": round(percentile([s for s, _ in answers.values()], 99), 4),
    }
    return figures, admitted


def waiter(
    client: Client, kubelet: Kubelet, device: str, plan: Plan, holder: ClaimRef, log: Path
) -> dict[str, Any]:
    """One more claim on the full GPU ``device`` waits; ``holder`` (admitted) is unprepared
    once the agent's log shows the wait: how long after the unprepare's answer the
    waiter's own answer came."""
    ref = allocated_claim(client, "waiter", plan.race_claim_bytes, device, namespace=NS, node=NODE)
    answer: list[tuple[float, str, float]] = []
    thread = threading.Thread(
        target=lambda: answer.append((*timed_prepare(kubelet, ref), time.perf_counter()))
    )
    thread.start()
    deadline = time.monotonic() + plan.wait_seconds
    while f"claim {ref} waits up to" not in log.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the waiter never waited:\n{log.read_text()[-2000:]}")
        time.sleep(0.005)
    kubelet.unprepare(holder)
    unprepared = time.perf_counter()
    thread.join()
    (waited, error, answered) = answer[0]
    if error:
        raise RuntimeError(f"the waiter was refused after the unprepare: {error}")
    return {
        "waiter_admitted_after_unprepare_seconds": round(answered - unprepared, 4),
        "waiter_waited_seconds": round(waited, 4),
    }


def scrape(
    client: Client, state: Path, names: dict[int, str], port: int, plan: Plan
) -> dict[str, Any]:
    """``plan.claims`` pods bound to the node, each with its claim reserved for it and a
    real process in a cgroup named after it (``bench.pod_cgroups``) using 1 GiB of its
    claim's GPU in the stand-in's process list; then the agent's ``/metrics`` fetched
    ``plan.scrapes`` times over HTTP, as Prometheus does (NVML, the claims and the
    cgroups read at each scrape)."""
    pods = [
        bound_pod(client, f"vllm-{i}", f"pod-{i}", namespace=NS, node=NODE)
        for i in range(plan.claims)
    ]
    for i, pod in enumerate(pods):
        allocated_claim(client, f"pod-{i}", 2 * GIB, names[i % GPUS], pod, namespace=NS, node=NODE)
    with pod_processes([u for _, u in pods]) as pids:
        used = [FakeProcess(i % GPUS, pids[u], GIB) for i, (_, u) in enumerate(pods)]
        gpus = [h100(g, used_bytes=GIB * sum(p.gpu == g for p in used)) for g in range(GPUS)]
        write_state(state, gpus, used)
        seconds, text = [], ""
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for _ in range(plan.scrapes):
                start = time.perf_counter()
                text = http.get("/metrics").raise_for_status().text
                seconds.append(time.perf_counter() - start)
    attributed = [
        line for line in text.splitlines() if line.startswith("gatekeeper_worker_actual_bytes{")
    ]
    if len(attributed) != plan.claims or any(
        not line.endswith(" 1.073741824e+09") for line in attributed
    ):
        raise RuntimeError(
            f"{len(attributed)} pods in /metrics, not {plan.claims}:\n{text[-2000:]}"
        )
    return {
        "scrape_pods": len(attributed),
        "scrape_p50_seconds": round(percentile(seconds, 50), 4),
        "scrape_p99_seconds": round(percentile(seconds, 99), 4),
        "scrape_lines": text.count("\n"),
        "scrape_bytes": len(text.encode()),
    }


@dataclass(frozen=True)
class Plan:
    """What to measure."""

    claims: int = 50
    racers: int = 200
    race_free_bytes: int = 20 * GIB
    race_claim_bytes: int = 3 * GIB
    scrapes: int = 100
    wait_seconds: float = 2.0
    """The agent's ``--prepare-wait-seconds``: short, so that the race's waiters end soon."""


def measure(cluster: KubeCluster, work: Path, library: Path, plan: Plan) -> dict[str, Any]:
    """Both parts on a started control plane, with the stand-in built at ``library``; the
    claims and the agent's slice are deleted at the end."""
    state = work / "nvml_state.txt"
    write_state(state, [h100(i) for i in range(GPUS)])
    client = cluster.client()
    with contextlib.suppress(ApiError):  # made by an earlier run on this control plane
        client.create(Namespace(metadata=ObjectMeta(name=NS)))
    try:
        port = free_port()
        with agent(cluster, work, state, library, port, plan.wait_seconds) as kubelet:
            names = device_names(client, NODE)
            figures = latency(client, kubelet, names, plan.claims)
            print(f"latency: {json.dumps(figures)}")
            if cgroup_root() is None:
                print("scrape: skipped, no writable cgroup hierarchy (run as root)")
            else:
                scraped = scrape(client, state, names, port, plan)
                print(f"scrape: {json.dumps(scraped)}")
                figures |= scraped
            foreign = h100(0).total_bytes - h100(0).reserved_bytes - plan.race_free_bytes
            gpus = [h100(0, used_bytes=foreign), *(h100(i) for i in range(1, GPUS))]
            write_state(state, gpus, [FakeProcess(0, FOREIGN_PID, foreign)])
            raced, admitted = race(client, kubelet, names[0], plan)
            print(f"race: {json.dumps(raced)}")
            waited = waiter(client, kubelet, names[0], plan, admitted[0], work / "agent.log")
            print(f"waiter: {json.dumps(waited)}")
            figures |= raced | waited
    finally:
        client.deletecollection(Pod, namespace=NS)
        client.deletecollection(ResourceClaim, namespace=NS)
        client.delete(ResourceSlice, slice_name(NODE))
        client.close()
    return figures | {"gpus": GPUS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=Plan.claims)
    parser.add_argument("--racers", type=int, default=Plan.racers)
    parser.add_argument(
        "--race-free", type=int, default=Plan.race_free_bytes, help="bytes free on GPU 0"
    )
    parser.add_argument(
        "--race-bytes", type=int, default=Plan.race_claim_bytes, help="each racer's claim"
    )
    parser.add_argument("--scrapes", type=int, default=Plan.scrapes, help="/metrics fetches")
    parser.add_argument(
        "--wait", type=float, default=Plan.wait_seconds, help="the agent's prepare wait, s"
    )
    parser.add_argument("--quick", action="store_true", help="10 claims, 40 racers")
    args = parser.parse_args()
    claims, racers = (10, 40) if args.quick else (args.claims, args.racers)
    plan = Plan(claims, racers, args.race_free, args.race_bytes, args.scrapes, args.wait)
    reason = missing_reason(kube_bin_dir())
    if reason is not None:
        raise SystemExit(reason)
    load = os.getloadavg()[0]
    print(f"bench.dra_prepare: {GPUS} stand-in H100s, {claims} claims, {racers} racers; "
          f"{os.cpu_count()} CPUs, load {load:.2f}")  # fmt: skip
    figures = on_control_plane(
        "bench-dra-",
        load,
        lambda cluster, work: measure(cluster, work, build_stub(work / "lib"), plan),
    )
    print(json.dumps(figures))


def on_control_plane(
    prefix: str, load: float, run: Callable[[KubeCluster, Path], dict[str, Any]]
) -> dict[str, Any]:
    """``run(cluster, work)`` on a control plane started in a temporary directory
    ``work`` (``prefix``), stopped after; its figures with the 1-minute load average
    ``load`` (before) and now."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        (work / "kube").mkdir()
        cluster = start_cluster(kube_bin_dir(), work / "kube")
        try:
            figures = run(cluster, work)
        finally:
            cluster.stop()
    return figures | {"load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}


if __name__ == "__main__":
    main()
