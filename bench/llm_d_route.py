"""The llm-d router run for real behind Envoy, routing by gatekeeper's per-pod memory
headroom (issue 30 item 4; docs/cluster.md "The llm-d router for real").

Kubernetes' control plane on loopback (``bench.kube_control_plane``), the InferencePool
CRD (gateway-api-inference-extension, at the version the router requires) and one
InferencePool selecting ``--pods`` Pods (3). The Pods are bound to a node that no kubelet
runs: the bench writes their ``status.podIP`` (127.0.0.11, .12, ...) and Ready condition
through the status subresource, as kubelet would. Each pod has a ResourceClaim of 8 GiB
allocated on its own GPU and reserved for it (``bench.dra_objects.allocated_claim``), and
a real process in a real cgroup named after its UID (``bench.pod_cgroups``: root only)
that the NVML stand-in lists on that GPU with bytes the bench sets. The installed
``gatekeeper agent`` (on the stand-in) attributes each process to its pod and serves
``gatekeeper_pod_memory_headroom_bytes``; behind each pod's IP run the simulator (:8000)
and gatekeeper's relay (:9464) reading the agent (``bench.llm_d_stack``). The endpoint
picker (``build/llm-d/epp`` from github.com/llm-d/llm-d-router) runs with
``deploy/llm-d/epp/endpoint-picker-config.yaml`` as shipped, and Envoy
(``build/llm-d/envoy``) asks it over ext_proc where each request goes.

1. **Before.** Pod 0 uses 10 GiB of its 8 GiB claim (headroom -2 GiB), the others 6 GiB
   (headroom 2 GiB each). ``--requests`` completions (60) through Envoy: counted per pod by
   the upstream address Envoy reports. Pod 0 must get none; the others share them.
2. **Switch.** Pod 0 back to 6 GiB, pod 1 to 10 GiB, written at once; completions are sent
   one after another for ``--watch`` seconds (8). Printed: the seconds from the write to
   the first request after which none goes to pod 1 (the routing followed), and the
   requests per pod after it (pod 1 none, pod 0 some).
3. **Latency.** ``--requests`` completions straight to a pod's simulator and as many
   through Envoy and the picker: p50 of each and the difference (what the router adds).
4. **All over.** Every pod at 10 GiB: the filter keeps none, so its ``fallbackOnEmpty``
   keeps them all; ``--requests`` completions, counted per pod (each gets some).

Run ``sudo .venv/bin/python -m bench.llm_d_route`` after ``scripts/llm-d-router.sh``
(``--quick``: 20 requests, 5 s watch). The picker refreshes each pod's metrics every
``--refresh`` seconds (0.5; the picker's default is 0.05, which on this 2-core machine
would make each relay read the agent 20 times a second). The last line is one JSON
object (sizes in bytes, times in seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType
from prometheus_client.parser import text_string_to_metric_families

from bench.dra_objects import allocated_claim, bound_pod
from bench.dra_prepare import on_control_plane, percentile
from bench.kube_control_plane import KubeCluster, kube_bin_dir
from bench.kube_control_plane import missing_reason as kube_missing
from bench.llm_d_stack import LLM_D, MODEL, RELAY_PORT, SERVED_BY, Ports, envoy, epp, pod_servers
from bench.llm_d_stack import missing_reason as router_missing
from bench.pod_cgroups import cgroup_root, pod_processes
from bench.serve_process import free_port, stop
from gatekeeper.cluster import slice_name
from gatekeeper.cluster.pod_relay import HEADROOM
from gatekeeper.cluster.slices import uuid_device_name
from gatekeeper.gpus.stand_in import FakeProcess, build_stub, h100, subprocess_env, write_state
from gatekeeper.units import GIB

NODE = "llm-d-node"
NS = "llm-d-route"
POOL = "vllm"
LABELS = {"app": "vllm-llm-d-route"}
CLAIM_BYTES = 8 * GIB
WITHIN_BYTES = 6 * GIB
OVER_BYTES = 10 * GIB
InferencePool = create_namespaced_resource(
    "inference.networking.k8s.io", "v1", "InferencePool", "inferencepools"
)


@dataclass(frozen=True)
class Plan:
    """What to measure."""

    pods: int = 3
    requests: int = 60
    watch_seconds: float = 8.0
    refresh_seconds: float = 0.5


def missing_reason() -> str | None:
    """Why this cannot run here, or None."""
    if cgroup_root() is None:
        return "no writable cgroup hierarchy: the pods' processes need one (run as root)"
    return kube_missing(kube_bin_dir()) or router_missing()


def install_pool(client: Client) -> None:
    """The InferencePool CRD (``scripts/llm-d-router.sh`` copies it), the namespace, and
    the pool of pods labelled ``LABELS`` serving on port 8000."""
    crd = yaml.safe_load((LLM_D / "crd" / "inferencepools.yaml").read_text())
    for manifest in (crd, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}):
        with contextlib.suppress(ApiError):  # made by an earlier run on this control plane
            client.create(from_dict(manifest))
    pool = InferencePool(
        metadata=ObjectMeta(name=POOL, namespace=NS),
        spec={
            "targetPorts": [{"number": 8000}],
            "selector": {"matchLabels": LABELS},
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    )
    established(client, crd["metadata"]["name"])
    with contextlib.suppress(ApiError):  # 409: made by an earlier run
        client.create(pool)


def established(client: Client, name: str) -> None:
    """Until the CRD ``name`` is Established (its API served)."""
    deadline = time.monotonic() + 30
    while True:
        found: Any = client.get(CustomResourceDefinition, name)
        conditions = (found.status.conditions if found.status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the CRD {name} was not Established in 30 s: {conditions}")
        time.sleep(0.2)


def ready_pod(client: Client, name: str, ip: str) -> tuple[str, str]:
    """A Pod of the pool bound to ``NODE`` using claim ``name``, Running and Ready at
    ``ip`` (the status kubelet would write): (name, UID)."""
    pod = bound_pod(client, name, name, namespace=NS, node=NODE, labels=LABELS)
    ready = {"type": "Ready", "status": "True"}
    status = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [ready]}
    client.patch(Pod.Status, name, {"status": status}, namespace=NS, patch_type=PatchType.MERGE)
    return pod


@contextlib.contextmanager
def node_agent(
    cluster: KubeCluster, work: Path, library: Path, state: Path, port: int
) -> Iterator[None]:
    """The installed ``gatekeeper agent`` on the NVML stand-in (built at ``library``),
    serving /metrics on ``port``; stopped with SIGTERM (then SIGKILL)."""
    argv = [str(Path(sys.executable).with_name("gatekeeper")), "agent", f"--node-name={NODE}"]
    argv += ["--gpus=nvml", f"--kubeconfig={cluster.kubeconfig}", "--interval=3600"]
    argv += ["--no-kubelet-plugin", f"--metrics-port={port}"]
    with (work / "agent.log").open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=subprocess_env(library.parent, state)
        )
    try:
        deadline = time.monotonic() + 60
        while not _answers(f"http://127.0.0.1:{port}/metrics"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the agent did not serve /metrics:\n{(work / 'agent.log').read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield
    finally:
        stop(process, 30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


class Usage:
    """The bytes each pod's process uses on its GPU (pod i on GPU i), in the stand-in."""

    def __init__(self, state: Path, pids: list[int]) -> None:
        self.state, self.pids = state, pids

    def set(self, used: list[int]) -> None:
        gpus = [h100(i, used_bytes=b) for i, b in enumerate(used)]
        write_state(
            self.state,
            gpus,
            [FakeProcess(i, p, b) for i, (p, b) in enumerate(zip(self.pids, used, strict=True))],
        )


def completion(http: httpx.Client, url: str) -> str:
    """One completion; the upstream address that served it (Envoy's ``SERVED_BY``)."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1}
    answer = http.post(url, json=body).raise_for_status()
    return str(answer.headers.get(SERVED_BY, url))


def routed(http: httpx.Client, url: str, count: int) -> list[str]:
    """``count`` completions through Envoy: the pod IP each went to."""
    return [completion(http, url).rsplit(":", 1)[0] for _ in range(count)]


def wait_routing(http: httpx.Client, url: str) -> None:
    """Until the picker knows the pool and a completion through Envoy succeeds."""
    deadline = time.monotonic() + 60
    while True:
        try:
            completion(http, url)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def follow(http: httpx.Client, url: str, avoid: str, watch_seconds: float) -> dict[str, Any]:
    """Completions for ``watch_seconds`` after a change: the seconds until the last one
    that went to ``avoid`` (0 when none did), and the counts per pod after it."""
    start = time.monotonic()
    seen: list[tuple[float, str]] = []
    while time.monotonic() - start < watch_seconds:
        ip = completion(http, url).rsplit(":", 1)[0]
        seen.append((time.monotonic() - start, ip))
    last = max((i for i, (_, ip) in enumerate(seen) if ip == avoid), default=-1)
    after = seen[last + 1 :]
    return {
        "follow_seconds": round(seen[last][0], 3) if last >= 0 else 0.0,
        "after": dict(Counter(ip for _, ip in after)),
        "after_requests": len(after),
        "watched_requests": len(seen),
    }


def latency(http: httpx.Client, routed_url: str, direct_url: str, count: int) -> dict[str, Any]:
    """p50 of ``count`` completions straight to one simulator and through Envoy."""
    timings: dict[str, list[float]] = {"direct": [], "routed": []}
    for _ in range(count):
        for key, url in (("direct", direct_url), ("routed", routed_url)):
            start = time.perf_counter()
            completion(http, url)
            timings[key].append(time.perf_counter() - start)
    direct, via = percentile(timings["direct"], 50), percentile(timings["routed"], 50)
    return {
        "direct_p50_seconds": round(direct, 4),
        "routed_p50_seconds": round(via, 4),
        "added_p50_seconds": round(via - direct, 4),
    }


def relay_headroom(http: httpx.Client, ips: list[str]) -> dict[str, int | None]:
    """What each pod's relay serves the picker as its headroom (None: no sample)."""
    found: dict[str, int | None] = {}
    for ip in ips:
        text = http.get(f"http://{ip}:{RELAY_PORT}/metrics").raise_for_status().text
        values = [
            int(sample.value)
            for family in text_string_to_metric_families(text)
            if family.name == HEADROOM
            for sample in family.samples
        ]
        found[ip] = values[0] if values else None
    return found


def served_headroom(
    http: httpx.Client, ips: list[str], over: Collection[str]
) -> dict[str, int | None]:
    """Until every pod's relay serves a headroom, negative for those ``over`` only: the agent
    attributes a pod once its claims are read (cached up to 5 s) and its process seen; a
    pod without a sample passes the filter (``onMissing: Pass``) and scores nothing."""
    deadline = time.monotonic() + 60
    while True:
        found = relay_headroom(http, ips)
        if all(v is not None and (v < 0) == (ip in over) for ip, v in found.items()):
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"the relays never served the expected headroom: {found}")
        time.sleep(0.25)


def scenario(
    http: httpx.Client, url: str, ips: list[str], usage: Usage, plan: Plan
) -> dict[str, Any]:
    """Before, switch and latency (module docstring) on a running stack."""
    wait_routing(http, url)
    headroom_before = served_headroom(http, ips, {ips[0]})
    time.sleep(2 * plan.refresh_seconds)  # the picker scrapes each relay in that time
    before = Counter(routed(http, url, plan.requests))
    usage.set([WITHIN_BYTES, OVER_BYTES, *[WITHIN_BYTES] * (plan.pods - 2)])
    switched = follow(http, url, ips[1], plan.watch_seconds)
    figures = {
        "headroom_before_bytes": headroom_before,
        "headroom_after_bytes": relay_headroom(http, ips),
        "before": {ip: before.get(ip, 0) for ip in ips},
        "over_claim_before": ips[0],
        "over_claim_after": ips[1],
        **switched,
        "after": {ip: switched["after"].get(ip, 0) for ip in ips},
    }
    figures |= latency(http, url, f"http://{ips[2]}:8000/v1/completions", plan.requests)
    usage.set([OVER_BYTES] * plan.pods)
    served_headroom(http, ips, set(ips))
    time.sleep(2 * plan.refresh_seconds)  # the picker scrapes each relay in that time
    everyone = Counter(routed(http, url, plan.requests))
    figures["all_over"] = {ip: everyone.get(ip, 0) for ip in ips}
    return figures


def measure(cluster: KubeCluster, work: Path, library: Path, plan: Plan) -> dict[str, Any]:
    """The whole run on a started control plane with the NVML stand-in built at
    ``library`` (root: the pods' cgroups); the pool's pods and claims are deleted at the
    end."""
    client = cluster.client()
    install_pool(client)
    ips = [f"127.0.0.{11 + i}" for i in range(plan.pods)]
    names = [f"vllm-{i}" for i in range(plan.pods)]
    state, agent_port, ports = work / "nvml_state.txt", free_port(), Ports.free()
    try:
        pods = [ready_pod(client, n, ip) for n, ip in zip(names, ips, strict=True)]
        for i, pod in enumerate(pods):
            device = uuid_device_name(h100(i).uuid)
            allocated_claim(client, pod[0], CLAIM_BYTES, device, pod, namespace=NS, node=NODE)
        with pod_processes([u for _, u in pods]) as pids:
            usage = Usage(state, [pids[u] for _, u in pods])
            usage.set([OVER_BYTES, *[WITHIN_BYTES] * (plan.pods - 1)])
            agent_url = f"http://127.0.0.1:{agent_port}/metrics"
            with (
                node_agent(cluster, work, library, state, agent_port),
                pod_servers(work, dict(zip(names, ips, strict=True)), NS, agent_url),
                epp(work, cluster.kubeconfig, NS, POOL, ports, plan.refresh_seconds),
                envoy(work, ports),
                httpx.Client(timeout=30) as http,
            ):
                url = f"http://127.0.0.1:{ports.listen}/v1/completions"
                figures = scenario(http, url, ips, usage, plan)
    finally:
        client.deletecollection(Pod, namespace=NS)
        client.deletecollection(ResourceClaim, namespace=NS)
        with contextlib.suppress(ApiError):  # published by the agent at its start
            client.delete(ResourceSlice, slice_name(NODE))
        client.close()
    return figures | {
        "pods": plan.pods,
        "refresh_seconds": plan.refresh_seconds,
        "claim_bytes": CLAIM_BYTES,
        "within_bytes": WITHIN_BYTES,
        "over_bytes": OVER_BYTES,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=Plan.pods)
    parser.add_argument("--requests", type=int, default=Plan.requests)
    parser.add_argument("--watch", type=float, default=Plan.watch_seconds)
    parser.add_argument("--refresh", type=float, default=Plan.refresh_seconds)
    parser.add_argument("--quick", action="store_true", help="20 requests, 5 s watch")
    args = parser.parse_args()
    requests, watch = (20, 5.0) if args.quick else (args.requests, args.watch)
    plan = Plan(max(3, args.pods), requests, watch, args.refresh)
    reason = missing_reason()
    if reason is not None:
        raise SystemExit(reason)
    load = os.getloadavg()[0]
    print(f"bench.llm_d_route: {plan.pods} pods, {requests} requests; load {load:.2f}")
    print(json.dumps(on_control_plane("bench-llm-d-", load, lambda c, w: run(c, w, plan))))


def run(cluster: KubeCluster, work: Path, plan: Plan) -> dict[str, Any]:
    """``measure`` with the stand-in built in ``work``; the processes' logs printed when
    it fails."""
    try:
        return measure(cluster, work, build_stub(work / "lib"), plan)
    except BaseException:
        for log in sorted(work.glob("*.log")):
            print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-2000:]}")
        raise


if __name__ == "__main__":
    main()
