"""GPU pods without a gatekeeper claim, caught afterwards (issue 38 item 4): ``gatekeeper
agent`` on the real control plane finds, in one pass, every pod bound to its node that holds
GPUs through ``nvidia.com/gpu`` in no gatekeeper claim (as a Deployment created while the
mutating webhook was down gets), posts one ``UnclaimedGpus`` Event on each and exports their
count (``gatekeeper_agent_unclaimed_gpu_pods``); a pod with gatekeeper's claim, one without
GPUs and one asking none are left alone. The pods are bound to the agent's Node by
``spec.nodeName`` (no kubelet runs them)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Event, Pod

from tests.support.agent_node import AgentNode, AgentProcess, agent_for, registered_client
from tests.support.kube_cluster import KubeCluster
from tests.support.polling import wait_for

pytestmark = pytest.mark.k8s

NODE = AgentNode("unclaimed-node", "unclaimed")
UNCLAIMED = ("whole-gpus", "init-gpu")


@pytest.fixture(scope="module")
def client(kube_cluster: KubeCluster) -> Iterator[Client]:
    with registered_client(kube_cluster, NODE) as client:
        yield client


@pytest.fixture(scope="module")
def agent(
    kube_cluster: KubeCluster, nvml_stub_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AgentProcess]:
    with agent_for(kube_cluster, NODE, nvml_stub_lib, tmp_path_factory.mktemp("unclaimed")) as a:
        yield a


def bound(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A pod bound to the agent's node, as the scheduler leaves it."""
    main = {"name": "main", "image": "vllm/vllm-openai:v0.32.0", **container}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NODE.namespace},
            "spec": {"nodeName": NODE.name, "containers": [main], **spec}}  # fmt: skip


def events(client: Client) -> dict[str, int]:
    """``UnclaimedGpus`` Events by pod."""
    out: dict[str, int] = {}
    for e in client.list(Event, namespace=NODE.namespace):
        event = e.to_dict()
        if event.get("reason") == "UnclaimedGpus":
            name = event["involvedObject"]["name"]
            out[name] = out.get(name, 0) + 1
    return out


def test_one_pass_reports_each_pod_holding_gpus_in_no_claim(
    client: Client, agent: AgentProcess
) -> None:
    gpus = {"resources": {"limits": {"nvidia.com/gpu": 2}}}
    warm = {"name": "warm", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    ours = {"resources": {"claims": [{"name": "vllm-gpus"}]}}
    claim = {"name": "vllm-gpus", "resourceClaimName": "claimed-vllm-gpus"}
    pods = [
        bound("whole-gpus", gpus),  # admitted as written while the webhook was down
        bound("init-gpu", {}, initContainers=[warm]),
        bound("claimed", ours, resourceClaims=[claim]),
        bound("no-gpu", {}),
    ]
    for manifest in pods:
        client.create(from_dict(manifest))
    start = time.monotonic()
    line = agent.once()  # one pass
    seconds = time.monotonic() - start
    found = events(client)
    print(
        f"{line}; unclaimed pods reported within one agent pass: {sorted(found)} ({seconds:.1f} s)"
    )
    assert found == dict.fromkeys(UNCLAIMED, 1)
    (event,) = [e.to_dict() for e in client.list(Event, namespace=NODE.namespace)
                if e.to_dict()["involvedObject"]["name"] == "whole-gpus"]  # fmt: skip
    assert event["type"] == "Warning" and event["source"]["host"] == NODE.name
    assert event["message"].startswith(
        f"pod {NODE.namespace}/whole-gpus holds 2 whole GPU(s) of node {NODE.name} through "
        "nvidia.com/gpu, in no gatekeeper claim"
    )


def _unclaimed(agent: AgentProcess) -> float | None:
    try:
        text = agent.metrics()
    except OSError:
        return None
    found = re.search(r"^gatekeeper_agent_unclaimed_gpu_pods (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_the_running_agent_exports_the_count_and_reports_each_pod_once(
    client: Client, agent: AgentProcess
) -> None:
    agent.start()
    wait_for("two unclaimed pods on the agent's metrics", lambda: _unclaimed(agent) == 2.0)
    time.sleep(1.0)  # several passes at 0.2 s
    assert events(client) == dict.fromkeys(UNCLAIMED, 2)  # once by the one pass, once by this
    client.delete(Pod, "whole-gpus", namespace=NODE.namespace, grace_period=0)
    wait_for("one left once the pod is gone", lambda: _unclaimed(agent) == 1.0)
