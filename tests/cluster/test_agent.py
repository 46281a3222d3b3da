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

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceSlice
from prometheus_client.parser import text_string_to_metric_families

from gatekeeper.cluster.accounting import SHARED_TAINT_KEY, TAINT_KEY
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.slices import uuid_device_name
from gatekeeper.gpus.stand_in import UNKNOWN, FakeFailure, FakeProcess, h100, write_state
from tests.support import agent_node
from tests.support.agent_node import (
    GATEKEEPER,
    AgentNode,
    AgentProcess,
    agent_for,
    registered_client,
    set_gpus,
)
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for

pytestmark = pytest.mark.k8s

NODE = "agent-node"
AGENT = AgentNode(NODE, "agent")
SLICE = AGENT.slice_name
GiB = 2**30
POD_NAMES = ("first", "second", "blocked")


def device_of(index: int) -> str:
    """The device name of the stand-in's ``h100(index)``: its uuid's, whatever its position."""
    return uuid_device_name(h100(index).uuid)


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    with registered_client(kube_cluster, AGENT) as client:
        yield client


@pytest.fixture(scope="module")
def agent(
    kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    work = tmp_path_factory.mktemp("agent")
    with agent_for(kube_cluster, AGENT, nvml_stub_lib, work) as started:
        yield started


def make_pod(client: Client, name: str, memory_bytes: int) -> None:
    agent_node.make_pod(client, AGENT, name, memory_bytes)


def bound_node(client: Client, name: str) -> str | None:
    return agent_node.bound_node(client, AGENT, name)


def allocation(client: Client, pod: str) -> dict[str, Any]:
    return agent_node.allocation(client, AGENT, pod)


def claim_names(client: Client) -> dict[str, str]:
    """Each pod's claim's name, by pod."""
    return {pod: c["metadata"]["name"] for pod, c in agent_node.claims(client, AGENT).items()}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A scrape's samples by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def tainted_gauges(agent: AgentProcess) -> list[float | None]:
    """``gatekeeper_agent_device_tainted`` of the two GPUs, as the agent serves it."""
    scraped = samples(agent.metrics())
    name = "gatekeeper_agent_device_tainted"
    return [scraped.get((name, (("device", device_of(i)),))) for i in (0, 1)]


def shared_gauge(agent: AgentProcess) -> float | None:
    """``gatekeeper_agent_devices{state="shared"}``, as the agent serves it."""
    return samples(agent.metrics()).get(("gatekeeper_agent_devices", (("state", "shared"),)))


def published(client: Client) -> dict[str, Any] | None:
    return agent_node.published(client, AGENT)


def scheduled_message(client: Client, pod: str) -> str | None:
    status = client.get(Pod, pod, namespace="agent").to_dict().get("status", {})
    for condition in status.get("conditions", []):
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition["message"])
    return None


def test_publishes_and_a_restart_keeps_the_pool_and_its_allocations(
    client: Client, agent: AgentProcess
) -> None:
    start = time.monotonic()
    agent.start()
    first = wait_for("the agent's slice", lambda: published(client))
    print(f"agent start to slice visible: {(time.monotonic() - start) * 1000:.0f} ms")
    spec = first["spec"]
    assert (spec["nodeName"], spec["pool"]["name"], spec["pool"]["generation"]) == (NODE, NODE, 1)
    assert [d["name"] for d in spec["devices"]] == [device_of(0), device_of(1)]
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
    client: Client, agent: AgentProcess
) -> None:
    generation = published(client)["spec"]["pool"]["generation"]  # type: ignore[index]
    start = time.monotonic()
    set_gpus(agent.state, used_bytes=60 * GiB)
    wait_for("taints", lambda: all(_taints(client).values()))
    print(f"foreign memory to tainted slice: {(time.monotonic() - start) * 1000:.0f} ms")
    assert {key for keys in _taints(client).values() for key in keys} == {TAINT_KEY}
    wait_for("both devices tainted in /metrics", lambda: tainted_gauges(agent) == [1, 1])
    make_pod(client, "blocked", GiB)
    message = wait_for("blocked's PodScheduled=False", lambda: scheduled_message(client, "blocked"))
    print(f"pending: {message}")
    assert "cannot allocate all claims" in message
    assert not bound_node(client, "blocked")

    start = time.monotonic()
    set_gpus(agent.state)
    wait_for("taints lifted", lambda: not any(_taints(client).values()))
    wait_for("no device tainted in /metrics", lambda: tainted_gauges(agent) == [0, 0])
    print(f"memory freed to untainted slice: {(time.monotonic() - start) * 1000:.0f} ms")
    assert wait_for("blocked bound", lambda: bound_node(client, "blocked")) == NODE
    assert published(client)["spec"]["pool"]["generation"] == generation  # type: ignore[index]


def test_a_gpu_another_driver_publishes_is_tainted_while_it_does(
    client: Client, agent: AgentProcess
) -> None:
    """NVIDIA's DRA driver publishing GPU 0 of this node too: its scheduler would book the
    same memory again, so gatekeeper's device for that GPU is tainted until it stops."""
    name = f"{NODE}-gpu.nvidia.com"
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"uuid": {"string": h100(0).uuid}, "type": {"string": "gpu"}},
                }
            ],
        },
    }
    client.create(from_dict(foreign))
    try:
        wait_for("GPU 0 tainted", lambda: _taints(client)[device_of(0)] == [SHARED_TAINT_KEY])
        assert _taints(client)[device_of(1)] == []
        taint = published(client)["spec"]["devices"]  # type: ignore[index]
        values = {d["name"]: [t["value"] for t in d.get("taints") or []] for d in taint}
        assert values[device_of(0)] == ["gpu.nvidia.com"]
        assert tainted_gauges(agent) == [0, 0], "not memory no claim books"
        wait_for("one shared device in /metrics", lambda: shared_gauge(agent) == 1)
        assert "another DRA driver publishes the same GPUs" in agent.log.read_text()
    finally:
        client.delete(ResourceSlice, name)
    wait_for("taint lifted", lambda: not any(_taints(client).values()))
    wait_for("no shared device in /metrics", lambda: shared_gauge(agent) == 0)


def test_each_pod_s_claim_and_the_memory_of_no_pod_are_exported(
    client: Client, agent: AgentProcess
) -> None:
    """Issue 30 item 3 through the installed agent: its pods' claims (the real scheduler's
    allocations) per pod and device, and a process in no pod (this test's own pid, whose
    real /proc/PID/cgroup names no pod) as foreign memory of its GPU, not a pod's. Below
    the taint tolerance, so the slice is left alone."""
    foreign = 256 * 2**20
    processes = [FakeProcess(0, os.getpid(), foreign)]
    write_state(agent.state, [h100(0, used_bytes=foreign), h100(1)], processes)

    def foreign_of(device: str) -> float | None:
        key = ("gatekeeper_agent_foreign_memory_bytes", (("device", device),))
        return samples(agent.metrics()).get(key)

    def every_pod() -> dict[Any, float] | None:
        found = samples(agent.metrics())
        pods = {k[1] for k in found if k[0] == "gatekeeper_pod_memory_headroom_bytes"}
        return found if len(pods) == len(POD_NAMES) else None

    wait_for("the foreign bytes", lambda: foreign_of(device_of(0)) == foreign)
    assert foreign_of(device_of(1)) == 0
    # the agent's claims watch brings the newest pod's reservation within the watch's
    # latency
    scraped = wait_for("every pod's claim", every_pod)
    claims = claim_names(client)
    for pod in POD_NAMES:
        result = allocation(client, pod)["devices"]["results"][0]
        labels = tuple(
            sorted(
                {
                    "claim": claims[pod],
                    "device": result["device"],
                    "namespace": "agent",
                    "pod": pod,
                }.items()
            )
        )
        claimed = quantity_bytes(result["consumedCapacity"]["memory"])
        assert scraped[("gatekeeper_worker_predicted_total_bytes", labels)] == claimed
        assert scraped[("gatekeeper_worker_actual_bytes", labels)] == 0
        assert scraped[("gatekeeper_pod_memory_headroom_bytes", labels)] == claimed
    headroom = [k for k in scraped if k[0] == "gatekeeper_pod_memory_headroom_bytes"]
    assert len(headroom) == len(POD_NAMES)
    set_gpus(agent.state)


def test_a_vanished_gpu_leaves_the_slice_and_its_pods_are_reported(
    client: Client, agent: AgentProcess
) -> None:
    device = allocation(client, "first")["devices"]["results"][0]["device"]
    before = published(client)
    assert before is not None
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in before["spec"]["devices"]}
    keep = 0 if device == device_of(1) else 1
    start = time.monotonic()
    set_gpus(agent.state, indices=(keep,))
    current = wait_for(
        "the new generation",
        lambda: (s := published(client)) and s["spec"]["pool"]["generation"] == 2 and s,
    )
    print(f"GPU {device} vanished to republished slice: {(time.monotonic() - start) * 1000:.0f} ms")
    # The GPU left is NVML's index 0 now, whichever it was; its device keeps its name.
    (left,) = current["spec"]["devices"]
    assert left["attributes"]["index"]["int"] == 0
    assert left["name"] == device_of(keep)
    assert left["attributes"]["uuid"]["string"] == uuids[device_of(keep)] == h100(keep).uuid
    gone = {device_of(1 - keep)}

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


def test_a_failed_gpu_reading_keeps_the_published_slice(
    client: Client, agent: AgentProcess
) -> None:
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
