"""The cluster wing's edges to the apiserver when it cannot be reached: lightkube talks
through httpx2, whose errors are neither httpx's nor OSError's, so each edge must name
them. The mutating webhook's template store denies the workload with the reason (never an
internal error that lets it through unclaimed), and the node agent's loop logs the failed
pass and goes on (never ends). A real lightkube client on a loopback port where nothing
listens."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from lightkube import Client, KubeConfig

from gatekeeper.cluster.agent import AgentConfig, NodeAgent
from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.k8s.template_store import ApiTemplateStore


@pytest.fixture
def nowhere() -> Client:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    return Client(KubeConfig.from_dict(config), trust_env=False)


TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "vllm-abc", "namespace": "default"},
    "spec": {"spec": {"devices": {"requests": []}}},
}


def test_the_template_store_denies_with_the_reason_when_the_apiserver_is_away(
    nowhere: Client,
) -> None:
    with pytest.raises(GatekeeperError, match="cannot be reached") as caught:
        ApiTemplateStore(nowhere).ensure(TEMPLATE)
    assert caught.value.field == "resourceclaimtemplates"


def test_the_agent_loop_logs_a_failed_pass_and_goes_on(
    nowhere: Client, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot = StaticInventory(parse_declared_node("2xH100-80GB")).snapshot
    agent = NodeAgent(nowhere, AgentConfig(node_name="node-x", interval_seconds=0.05), snapshot)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    with caplog.at_level(logging.WARNING, logger="gatekeeper.cluster.agent"):
        runner.start()
        try:
            for _ in range(100):
                if sum("failed, retrying" in r.getMessage() for r in caplog.records) >= 2:
                    break
                stop.wait(0.05)
            assert runner.is_alive(), "the agent's loop ended on an unreachable apiserver"
        finally:
            stop.set()
            runner.join(10)
    assert sum("failed, retrying" in r.getMessage() for r in caplog.records) >= 2
