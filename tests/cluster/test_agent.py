"""``gatekeeper agent`` on the real control plane (issue 29 item 1).

The agent runs as its own process (the installed ``gatekeeper`` command) with
``--gpus nvml`` on the NVML stand-in driver (``gatekeeper/gpus/stand_in``, built by the
suite): two H100s whose used memory, and whose presence, the tests change through the
stand-in's state file, re-read on every NVML call. One Node, ``agent-node``, tainted so that only these tests' pods (which
tolerate it) land there and the other cluster tests' pods never do; its slice and Node are
deleted at the end. The real scheduler allocates the claims and binds the pods.

Figures printed: agent start to slice visible, and a GPU change to the republished slice.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.cluster.accounting import TAINT_KEY
from gatekeeper.gpus.stand_in import UNKNOWN, FakeFailure, h100, subprocess_env, write_state
from tests.support.kube_cluster import KubeCluster, ready_node
from tests.support.prometheus_server import free_port

pytestmark = pytest.mark.k8s

NODE = "agent-node"
SLICE = f"{NODE}-{DRIVER_NAME}"
NODE_TAINT = {"key": "gatekeeper.dev/agent-test", "value": "only", "effect": "NoSchedule"}
GiB = 2**30
GATEKEEPER = Path(sys.executable).with_name("gatekeeper")
TIMEOUT_SECONDS = 30.0
POD_NAMES = ("first", "second", "blocked")
INTERVAL = "0.2"


def set_gpus(state: Path, used_bytes: int = 0, indices: tuple[int, ...] = (0, 1)) -> None:
    """The stand-in serves these H100s (NVML indices are positions in this list)."""
    write_state(state, [h100(i, used_bytes=used_bytes) for i in indices])


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{what}: not seen in {TIMEOUT_SECONDS} s")


@dataclasses.dataclass
class Agent:
    """Starts and kills ``gatekeeper agent`` processes on one stand-in NVML state."""

    cluster: KubeCluster
    state: Path
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text: str = answer.read().decode()
            return text

    def argv(self, *extra: str) -> list[str]:
        return [
            str(GATEKEEPER),
            "agent",
            f"--node-name={NODE}",
            "--gpus=nvml",
            f"--kubeconfig={self.cluster.kubeconfig}",
            *extra,
        ]

    def start(self) -> None:
        self.metrics_port = free_port()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(f"--interval={INTERVAL}", f"--metrics-port={self.metrics_port}"),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def once(self) -> str:
        done = subprocess.run(
            self.argv("--once"), capture_output=True, text=True, timeout=60, env=self.env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    client = kube_cluster.client()
    node = ready_node(NODE, (NODE_TAINT,))
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
    }
    client.create(from_dict(node))
    made_class = True
    try:
        client.create(from_dict(device_class))
    except ApiError as e:  # another cluster test module made it first
        assert e.status.code == 409, e
        made_class = False
    client.create(Namespace(metadata=ObjectMeta(name="agent")))
    yield client
    client.delete(Node, NODE)
    client.delete(ResourceSlice, SLICE)
    if made_class:  # the other modules create it as their own
        client.delete(DeviceClass, DRIVER_NAME)
    client.close()


@pytest.fixture(scope="module")
def agent(
    kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    work = tmp_path_factory.mktemp("agent")
    state = work / "nvml_state.txt"
    set_gpus(state)
    env = subprocess_env(nvml_stub_lib.parent, state)
    started = Agent(kube_cluster, state, env, work / "agent.log")
    yield started
    started.kill()


def make_pod(client: Client, name: str, memory_bytes: int) -> None:
    request = {
        "name": "rank0",
        "exactly": {
            "deviceClassName": DRIVER_NAME,
            "capacity": {"requests": {"memory": str(memory_bytes)}},
        },
    }
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "agent"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    toleration = {k: NODE_TAINT[k] for k in ("key", "value", "effect")} | {"operator": "Equal"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "agent"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [toleration],
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    client.create(from_dict(template))
    client.create(from_dict(pod))


def bound_node(client: Client, name: str) -> str | None:
    found = client.get(Pod, name, namespace="agent")
    return found.spec.nodeName if found.spec is not None else None


def allocation(client: Client, pod: str) -> dict[str, Any]:
    for claim in client.list(ResourceClaim, namespace="agent"):
        raw = claim.to_dict()
        if raw["metadata"]["ownerReferences"][0]["name"] == pod:
            result: dict[str, Any] = raw["status"]["allocation"]
            return result
    raise AssertionError(f"no claim for pod {pod}")


def claim_names(client: Client) -> dict[str, str]:
    """Each pod's claim's name, by pod."""
    names = {}
    for claim in client.list(ResourceClaim, namespace="agent"):
        raw = claim.to_dict()
        names[raw["metadata"]["ownerReferences"][0]["name"]] = raw["metadata"]["name"]
    return names


def published(client: Client) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.get(ResourceSlice, SLICE).to_dict()
    except ApiError:
        return None
    return found


def scheduled_message(client: Client, pod: str) -> str | None:
    status = client.get(Pod, pod, namespace="agent").to_dict().get("status", {})
    for condition in status.get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition["message"])
    return None


def test_publishes_and_a_restart_keeps_the_pool_and_its_allocations(
    client: Client, agent: Agent
) -> None:
    start = time.monotonic()
    agent.start()
    first = wait_for("the agent's slice", lambda: published(client))
    print(f"agent start to slice visible: {(time.monotonic() - start) * 1000:.0f} ms")
    spec = first["spec"]
    assert (spec["nodeName"], spec["pool"]["name"], spec["pool"]["generation"]) == (NODE, NODE, 1)
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert not any(d.get("taints") for d in spec["devices"])

    make_pod(client, "first", 12 * GiB)
    assert wait_for("first bound", lambda: bound_node(client, "first")) == NODE
    before = allocation(client, "first")

    agent.kill()
    assert agent.once() == f"slice {SLICE} unchanged: generation 1"
    after = published(client)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert allocation(client, "first") == before
    agent.start()
    make_pod(client, "second", 12 * GiB)
    assert wait_for("second bound", lambda: bound_node(client, "second")) == NODE
    assert allocation(client, "first") == before


def _taints(client: Client) -> dict[str, list[str]]:
    current = published(client)
    assert current is not None
    return {
        d["name"]: [t["key"] for t in d.get("taints") or []] for d in current["spec"]["devices"]
    }


def test_memory_no_claim_books_taints_the_device_until_it_is_free(
    client: Client, agent: Agent
) -> None:
    generation = published(client)["spec"]["pool"]["generation"]  # type: ignore[index]
    start = time.monotonic()
    set_gpus(agent.state, used_bytes=60 * GiB)
    wait_for("taints", lambda: all(_taints(client).values()))
    print(f"foreign memory to tainted slice: {(time.monotonic() - start) * 1000:.0f} ms")
    assert {key for keys in _taints(client).values() for key in keys} == {TAINT_KEY}
    make_pod(client, "blocked", GiB)
    message = wait_for("blocked's PodScheduled=False", lambda: scheduled_message(client, "blocked"))
    print(f"pending: {message}")
    assert "cannot allocate all claims" in message
    assert not bound_node(client, "blocked")

    start = time.monotonic()
    set_gpus(agent.state)
    wait_for("taints lifted", lambda: not any(_taints(client).values()))
    print(f"memory freed to untainted slice: {(time.monotonic() - start) * 1000:.0f} ms")
    assert wait_for("blocked bound", lambda: bound_node(client, "blocked")) == NODE
    assert published(client)["spec"]["pool"]["generation"] == generation  # type: ignore[index]


def test_a_vanished_gpu_leaves_the_slice_and_its_pods_are_reported(
    client: Client, agent: Agent
) -> None:
    device = allocation(client, "first")["devices"]["results"][0]["device"]
    before = published(client)
    assert before is not None
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in before["spec"]["devices"]}
    keep = 0 if device == "gpu-1" else 1
    start = time.monotonic()
    set_gpus(agent.state, indices=(keep,))
    current = wait_for(
        "the new generation",
        lambda: (s := published(client)) and s["spec"]["pool"]["generation"] == 2 and s,
    )
    print(f"GPU {device} vanished to republished slice: {(time.monotonic() - start) * 1000:.0f} ms")
    # NVML's indices are positions: the GPU left is gpu-0 now, whichever it was.
    (left,) = current["spec"]["devices"]
    assert left["name"] == "gpu-0"
    assert left["attributes"]["uuid"]["string"] == uuids[f"gpu-{keep}"]
    # gpu-1 is gone by name, and gpu-0 now names another GPU if gpu-0 vanished.
    gone = {"gpu-1"} | ({"gpu-0"} if keep == 1 else set())

    def vanished_events() -> list[dict[str, Any]]:
        events = [e.to_dict() for e in client.list(Event, namespace="agent")]
        return [e for e in events if e.get("reason") == "GpuVanished"]

    results = {p: allocation(client, p)["devices"]["results"][0] for p in POD_NAMES}
    on_vanished = {p for p, result in results.items() if result["device"] in gone}
    assert "first" in on_vanished

    def reported() -> set[str]:
        return {e["involvedObject"]["name"] for e in vanished_events()}

    wait_for("a GpuVanished event per pod on the GPU", lambda: reported() >= on_vanished)
    time.sleep(0.5)  # a few more passes: nothing else is reported, nothing twice
    events = vanished_events()
    assert sorted(e["involvedObject"]["name"] for e in events) == sorted(on_vanished)
    for event in events:
        name = results[event["involvedObject"]["name"]]["device"]
        assert f"GPU {name} ({uuids[name]}) of node {NODE}" in event["message"]
    assert f"pod agent/first: GPU {device} ({uuids[device]})" in agent.log.read_text()
    scraped = agent.metrics()
    claims = claim_names(client)
    for pod in on_vanished:
        name = results[pod]["device"]
        assert (
            f'gatekeeper_agent_orphaned_pod_info{{claim="{claims[pod]}",'
            f'device="{name}",namespace="agent",pod="{pod}",uuid="{uuids[name]}"}} 1.0'
        ) in scraped, scraped
    assert scraped.count("gatekeeper_agent_orphaned_pod_info{") == len(on_vanished)
    assert "gatekeeper_agent_pool_generation 2.0" in scraped
    assert 'gatekeeper_agent_devices{state="published"} 1.0' in scraped


def test_a_failed_gpu_reading_keeps_the_published_slice(client: Client, agent: Agent) -> None:
    before = published(client)
    assert before is not None
    generation = before["spec"]["pool"]["generation"]
    failure = FakeFailure(UNKNOWN, symbol="nvmlDeviceGetCount_v2")
    write_state(agent.state, [h100(0)], failures=[failure])
    assert agent.once() == f"slice {SLICE} kept: generation {generation}"
    wait_for("the running agent's warning", lambda: "GPU reading failed" in agent.log.read_text())
    time.sleep(0.5)  # a few of the running agent's passes
    after = published(client)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    kept = re.search(r'gatekeeper_agent_passes_total\{outcome="kept"\} (\S+)', agent.metrics())
    assert kept is not None and float(kept.group(1)) >= 1
    set_gpus(agent.state, indices=(0,))


def test_without_a_node_name_the_agent_says_how_to_give_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [str(GATEKEEPER), "agent", "--once"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2
    assert "--node-name is empty and $NODE_NAME is not set" in done.stderr
    assert "spec.nodeName" in done.stderr
