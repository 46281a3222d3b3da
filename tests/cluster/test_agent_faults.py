"""The node agent killed around a GPU that vanishes (issue 29, "Bad input and faults").

``gatekeeper agent`` as its own process on the NVML stand-in, for a Node of its own
(``faults-node``, tainted; pods in namespace ``agent-faults``). A pod's 12 GiB claim is
allocated; the agent is SIGKILLed; the GPU under the claim vanishes while no agent runs;
the next agent republishes (generation 2), reports the pod once (a ``GpuVanished`` Event,
``gatekeeper_agent_orphaned_pod_info``) and records it on the slice
(``accounting.VANISHED_ANNOTATION``); killed and started again, it lists the pod without
writing the slice or reporting it again, and a later change of the slice (a taint) reports
nothing either; the pod deleted, its claim is deallocated and the record goes; a damaged
record is written again (with a warning), the agent running on. The tests run in
order and build on each other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.types import PatchType

from gatekeeper.cluster.accounting import TAINT_KEY, VANISHED_ANNOTATION
from gatekeeper.cluster.slices import uuid_device_name
from gatekeeper.gpus.stand_in import h100
from tests.support.agent_node import (
    AgentNode,
    AgentProcess,
    agent_for,
    allocation,
    bound_node,
    claims,
    make_pod,
    published,
    registered_client,
    set_gpus,
)
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for

pytestmark = pytest.mark.k8s

NODE = AgentNode("faults-node", "agent-faults")
GiB = 2**30
POD = "held"


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    with registered_client(kube_cluster, NODE) as client:
        yield client


@pytest.fixture(scope="module")
def agent(
    kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    work = tmp_path_factory.mktemp("agent-faults")
    with agent_for(kube_cluster, NODE, nvml_stub_lib, work) as started:
        yield started


def vanished_events(client: Client) -> list[dict[str, Any]]:
    events = [e.to_dict() for e in client.list(Event, namespace=NODE.namespace)]
    return [e for e in events if e.get("reason") == "GpuVanished"]


def record_text(client: Client) -> str:
    """The slice's record of allocations on vanished GPUs, as written ("" when none)."""
    current = published(client, NODE)
    assert current is not None
    return str((current["metadata"].get("annotations") or {}).get(VANISHED_ANNOTATION, ""))


def recorded(client: Client) -> list[dict[str, Any]]:
    text = record_text(client)
    rows: list[dict[str, Any]] = json.loads(text) if text else []
    return rows


def orphan_lines(agent: AgentProcess) -> list[str]:
    return re.findall(r"^gatekeeper_agent_orphaned_pod_info\{.*$", agent.metrics(), re.MULTILINE)


def passes(agent: AgentProcess, outcome: str) -> float:
    """The agent's passes with ``outcome``; 0 while its metrics port is not open yet."""
    try:
        text = agent.metrics()
    except OSError:
        return 0.0
    pattern = rf'^gatekeeper_agent_passes_total\{{outcome="{outcome}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def taints(client: Client) -> list[str] | None:
    """The taint keys of the one published device."""
    current = published(client, NODE)
    assert current is not None
    (device,) = current["spec"]["devices"]
    return [t["key"] for t in device.get("taints") or []]


def test_a_gpu_that_vanished_while_the_agent_was_down_is_reported_by_the_next(
    client: Client, agent: AgentProcess
) -> None:
    agent.start()
    first = wait_for("the agent's slice", lambda: published(client, NODE))
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in first["spec"]["devices"]}
    make_pod(client, NODE, POD, 12 * GiB)
    assert wait_for("held bound", lambda: bound_node(client, NODE, POD)) == NODE.name
    device = allocation(client, NODE, POD)["devices"]["results"][0]["device"]

    agent.kill()
    keep = 0 if device == uuid_device_name(h100(1).uuid) else 1
    set_gpus(agent.state, indices=(keep,))  # the GPU under the claim is gone
    agent.start()
    current = wait_for(
        "generation 2",
        lambda: (s := published(client, NODE)) and s["spec"]["pool"]["generation"] == 2 and s,
    )
    (left,) = current["spec"]["devices"]
    assert left["name"] == uuid_device_name(h100(keep).uuid)  # its name follows its uuid
    assert left["attributes"]["uuid"]["string"] == uuids[left["name"]] == h100(keep).uuid
    wait_for("the GpuVanished event", lambda: vanished_events(client))
    claim = claims(client, NODE)[POD]["metadata"]["name"]
    labels = (
        f'claim="{claim}",device="{device}",namespace="{NODE.namespace}",pod="{POD}",'
        f'uuid="{uuids[device]}"'
    )
    assert orphan_lines(agent) == [f"gatekeeper_agent_orphaned_pod_info{{{labels}}} 1.0"]
    assert recorded(client) == [
        {"namespace": NODE.namespace, "claim": claim, "device": device, "uuid": uuids[device],
         "memoryBytes": 12 * GiB, "pods": [POD]}
    ]  # fmt: skip


def test_a_restarted_agent_still_lists_the_pod_and_reports_it_no_more(
    client: Client, agent: AgentProcess
) -> None:
    before = published(client, NODE)
    assert before is not None
    lines = orphan_lines(agent)
    agent.kill()
    agent.start()
    wait_for("a pass of the new agent", lambda: passes(agent, "unchanged") >= 1)
    assert orphan_lines(agent) == lines  # read back from the slice
    after = published(client, NODE)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # A later change of the same slice (a taint) writes the record as it was.
    (left,) = after["spec"]["devices"]
    keep = next(i for i in (0, 1) if h100(i).uuid == left["attributes"]["uuid"]["string"])
    set_gpus(agent.state, used_bytes=60 * GiB, indices=(keep,))
    wait_for("the taint", lambda: taints(client) == [TAINT_KEY])
    set_gpus(agent.state, indices=(keep,))
    wait_for("the taint lifted", lambda: taints(client) == [])
    assert len(vanished_events(client)) == 1
    assert orphan_lines(agent) == lines
    assert published(client, NODE)["spec"]["pool"]["generation"] == 2  # type: ignore[index]


def test_the_record_goes_with_the_allocation(client: Client, agent: AgentProcess) -> None:
    client.delete(Pod, POD, namespace=NODE.namespace, grace_period=0)
    # The resource-claim controller deallocates the claim of a deleted pod (the garbage
    # collector, which does not run here, would then delete it).
    wait_for(
        "the claim deallocated", lambda: "allocation" not in claims(client, NODE)[POD]["status"]
    )
    wait_for("the record removed", lambda: not recorded(client))
    assert not orphan_lines(agent)
    assert published(client, NODE)["spec"]["pool"]["generation"] == 2  # type: ignore[index]


def test_a_damaged_record_is_written_again_with_a_warning(
    client: Client, agent: AgentProcess
) -> None:
    patch = {"metadata": {"annotations": {VANISHED_ANNOTATION: "{"}}}
    client.patch(ResourceSlice, NODE.slice_name, patch, patch_type=PatchType.MERGE)
    wait_for("the damaged record replaced", lambda: record_text(client) != "{")
    assert not record_text(client)  # nothing is orphaned now
    assert f"annotation {VANISHED_ANNOTATION} is '{{'" in agent.log.read_text()
    assert agent.proc is not None and agent.proc.poll() is None
