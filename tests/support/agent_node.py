"""A node of its own for tests of ``gatekeeper agent`` on the real control plane.

``AgentNode`` names a Node (tainted, so that only pods that tolerate the taint land
there) and the namespace of its tests' pods; ``AgentProcess`` starts and kills
``gatekeeper agent`` processes for it (the installed command, ``--gpus nvml`` on the
stand-in driver, whose state file ``set_gpus`` writes). The helpers make a pod with a
one-rank memory claim, and read back the slice, the pod's node and its claim's allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from bench.cluster_fleet import device_class
from gatekeeper.cluster import DRIVER_NAME
from gatekeeper.gpus.stand_in import h100, subprocess_env, write_state
from tests.support.kube_cluster import KubeCluster
from tests.support.prometheus_server import free_port

GATEKEEPER = Path(sys.executable).with_name("gatekeeper")
INTERVAL = "0.2"


@dataclasses.dataclass(frozen=True)
class AgentNode:
    """A tainted Node and the namespace of its pods."""

    name: str
    namespace: str

    @property
    def slice_name(self) -> str:
        return f"{self.name}-{DRIVER_NAME}"

    @property
    def taint(self) -> dict[str, str]:
        return {"key": "gatekeeper.dev/agent-test", "value": self.name, "effect": "NoSchedule"}


def set_gpus(state: Path, used_bytes: int = 0, indices: tuple[int, ...] = (0, 1)) -> None:
    """The stand-in serves these H100s (NVML indices are positions in this list)."""
    write_state(state, [h100(i, used_bytes=used_bytes) for i in indices])


@dataclasses.dataclass
class AgentProcess:
    """Starts and kills ``gatekeeper agent`` processes for ``node`` on one stand-in NVML
    state file."""

    kubeconfig: Path
    node: AgentNode
    state: Path
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0

    def metrics(self) -> str:
        """The agent's /metrics; a failed scrape fails with the end of the agent's log
        (where the collector's traceback is)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                text: str = answer.read().decode()
                return text
        except urllib.error.HTTPError as e:
            tail = self.log.read_text(errors="replace")[-4000:] if self.log.is_file() else ""
            raise AssertionError(f"GET {url}: {e}; the agent's log ends:\n{tail}") from e

    def argv(self, *extra: str) -> list[str]:
        return [
            str(GATEKEEPER),
            "agent",
            f"--node-name={self.node.name}",
            "--gpus=nvml",
            f"--kubeconfig={self.kubeconfig}",
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
        """SIGKILL: no goodbye, as a node's OOM killer or a deleted pod's grace ending."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def once(self) -> str:
        done = subprocess.run(
            self.argv("--once"), capture_output=True, text=True, timeout=60, env=self.env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


def agent_process(
    kubeconfig: Path, node: AgentNode, nvml_stub_lib: Path, work: Path
) -> AgentProcess:
    """An agent (not started yet) for ``node`` on two idle stand-in H100s, its state file
    and log in ``work``."""
    state = work / "nvml_state.txt"
    set_gpus(state)
    env = subprocess_env(nvml_stub_lib.parent, state)
    return AgentProcess(kubeconfig, node, state, env, work / "agent.log")


@contextlib.contextmanager
def agent_for(
    cluster: KubeCluster, node: AgentNode, nvml_stub_lib: Path, work: Path
) -> Iterator[AgentProcess]:
    """``agent_process`` on ``cluster`` for a module fixture; killed at the end."""
    started = agent_process(cluster.kubeconfig, node, nvml_stub_lib, work)
    yield started
    started.kill()


@contextlib.contextmanager
def registered_client(cluster: KubeCluster, node: AgentNode) -> Iterator[Client]:
    """A client of ``cluster`` with ``node`` ``registered``, for a module fixture."""
    client = cluster.client()
    with registered(client, node):
        yield client
    client.close()


@contextlib.contextmanager
def registered(client: Client, node: AgentNode) -> Iterator[None]:
    """The Node (Ready, tainted), the DeviceClass (unless another module made it) and the
    namespace, for a module fixture; at the end the Node and its slice are deleted."""
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    manifest = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name}},
        "spec": {"taints": [node.taint]},
        "status": {"conditions": [ready], "capacity": capacity, "allocatable": capacity},
    }
    client.create(from_dict(manifest))
    made_class = True
    try:
        client.create(from_dict(device_class()))
    except ApiError as e:  # another cluster test module made it first
        assert e.status.code == 409, e
        made_class = False
    client.create(Namespace(metadata=ObjectMeta(name=node.namespace)))
    yield
    client.delete(Node, node.name)
    try:
        client.delete(ResourceSlice, node.slice_name)
    except ApiError as e:
        assert e.status.code == 404, e
    if made_class:  # the other modules create it as their own
        client.delete(DeviceClass, DRIVER_NAME)


def make_pod(client: Client, node: AgentNode, name: str, memory_bytes: int) -> None:
    """A pod on ``node`` with a claim template of one rank of ``memory_bytes``."""
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
        "metadata": {"name": name, "namespace": node.namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    toleration = {**node.taint, "operator": "Equal"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": node.namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
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


def bound_node(client: Client, node: AgentNode, pod: str) -> str | None:
    found = client.get(Pod, pod, namespace=node.namespace)
    return found.spec.nodeName if found.spec is not None else None


def claims(client: Client, node: AgentNode) -> dict[str, dict[str, Any]]:
    """Each pod's claim (its API dict), by pod."""
    found = {}
    for claim in client.list(ResourceClaim, namespace=node.namespace):
        raw = claim.to_dict()
        found[raw["metadata"]["ownerReferences"][0]["name"]] = raw
    return found


def allocation(client: Client, node: AgentNode, pod: str) -> dict[str, Any]:
    """The allocation of ``pod``'s claim."""
    claim = claims(client, node).get(pod)
    assert claim is not None, f"no claim for pod {pod}"
    result: dict[str, Any] = claim["status"]["allocation"]
    return result


def published(client: Client, node: AgentNode) -> dict[str, Any] | None:
    """``node``'s slice, or None while there is none."""
    try:
        found: dict[str, Any] = client.get(ResourceSlice, node.slice_name).to_dict()
    except ApiError:
        return None
    return found
