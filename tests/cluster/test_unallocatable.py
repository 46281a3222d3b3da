"""A pod whose GPU claim kube-scheduler cannot allocate gets an ``Unallocatable`` Event with
the bytes (issue 39 item 2): the node agent's pass (``NodeAgent``, in this process) on the
real control plane, which publishes its node's slice; the real scheduler allocates two
40 GiB claims (one per H100, 37.11 GiB left on each) and leaves a 60 GiB one Pending with
"cannot allocate all claims". One Event, however many agents and passes see it.

Costs the session's control plane and about 2 s of its own (three pods bound or refused).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceClaim

from gatekeeper.cluster.agent import AgentConfig, NodeAgent, quantity_bytes
from gatekeeper.cluster.allocation_events import REASON, AllocationReporter
from gatekeeper.cluster.slices import DRIVER_NAME
from gatekeeper.gpus import InventorySnapshot, StaticInventory
from gatekeeper.units import format_gib
from tests.support import agent_node
from tests.support.agent_node import AgentNode, registered_client
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for

pytestmark = pytest.mark.k8s

NODE = AgentNode("unallocatable-node", "unallocatable")
GiB = 2**30
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"


def _gpus() -> InventorySnapshot:
    """Two idle recorded H100s, with this node's uuids."""
    recorded = StaticInventory.from_json(FIXTURES / "h100_80g_x8.json").snapshot()
    gpus = tuple(
        dataclasses.replace(g, uuid=f"GPU-{NODE.name}-{i}", processes=(), used_bytes=0)
        for i, g in enumerate(recorded.gpus[2:4])
    )
    return dataclasses.replace(recorded, gpus=gpus)


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    with registered_client(kube_cluster, NODE) as client:
        yield client


def _claims(client: Client) -> list[dict[str, Any]]:
    return [c.to_dict() for c in client.list(ResourceClaim, namespace="*")]


def _agent(client: Client) -> NodeAgent:
    config = AgentConfig(node_name=NODE.name)
    return NodeAgent(client, config, _gpus, list_claims=lambda: _claims(client))


def _unschedulable(client: Client, name: str) -> str:
    pod = client.get(Pod, name, namespace=NODE.namespace).to_dict()
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", ""))
    return ""


def _events(client: Client) -> list[dict[str, Any]]:
    found = [e.to_dict() for e in client.list(Event, namespace=NODE.namespace)]
    return [e for e in found if e.get("reason") == REASON]


def test_a_claim_no_device_holds_gets_one_event_with_the_bytes(client: Client) -> None:
    agent = _agent(client)
    agent.publish()  # the node's slice: two devices of 77.10 GiB
    for name in ("first", "second"):
        agent_node.make_pod(client, NODE, name, 40 * GiB)
    wait_for("both 40 GiB pods bound", lambda: all(
        agent_node.bound_node(client, NODE, p) == NODE.name for p in ("first", "second")
    ))  # fmt: skip
    agent_node.make_pod(client, NODE, "large", 60 * GiB)
    start = time.monotonic()
    wait_for("the scheduler's refusal", lambda: "cannot allocate all claims" in
             _unschedulable(client, "large"))  # fmt: skip
    agent.publish()  # the pass that sees it
    seconds = time.monotonic() - start
    (event,) = _events(client)
    print(f"refused to Event: {seconds * 1000:.0f} ms; {event['message']}")
    assert event["involvedObject"]["name"] == "large"
    assert event["type"] == "Warning" and event["source"]["host"] == NODE.name
    claim = agent_node.claims(client, NODE)["large"]["metadata"]["name"]
    published = agent_node.published(client, NODE)
    assert published is not None
    (capacity,) = {quantity_bytes(d["capacity"]["memory"]["value"])
                   for d in published["spec"]["devices"]}  # fmt: skip
    free = f"{(capacity - 40 * GiB) / GiB:.2f}"
    assert event["message"].startswith(
        f"claim {claim} asks 1 device with 60.00 GiB ({60 * GiB} bytes) free, and no node the "
        f"pod may land on (its node selector names {NODE.name}) has them: {NODE.name}: "
        f"{free}, {free} GiB free of {format_gib(capacity)} each (2 devices). Lower what a "
        "rank needs"
    )
    # More passes, and a second agent that has not seen it: still one Event.
    agent.publish()
    other = AllocationReporter(client, DRIVER_NAME, "other-node", lambda: _claims(client),
                               quantity_bytes)  # fmt: skip
    # (other modules' pods on the session's shared control plane may be Pending too: the
    # reporter lists the cluster's; this pod's Event is the one to hold)
    ours = [n for n in other.report() if n.startswith("large.")]
    assert ours == [event["metadata"]["name"]]
    assert len(_events(client)) == 1
