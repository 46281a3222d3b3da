"""A fleet for the cluster storm (issue 29): GPU nodes, vLLM workloads drawn from the
catalog, their manifests, and ``gatekeeper webhook --mutate`` behind a real
MutatingWebhookConfiguration. Shared by ``python -m bench.cluster`` and
``tests/cluster/test_storm.py``.

Nodes are Node objects with a Ready status (no kubelet), labelled with the fleet's pool and
tainted so that only the fleet's pods (which select and tolerate them) land there. Their
GPUs are declared products (``gatekeeper.gpus.parse_declared_node``, each GPU given a uuid
of its node) published as each node's ResourceSlice by the node agent's own code
(``NodeAgent.publish``), as ``gatekeeper agent`` publishes them.

A workload is a ``vllm serve`` line as vLLM's docs write it: a model of the catalog, a
``--max-model-len``, sometimes ``--quantization fp8`` (for a checkpoint that is not
quantized already), ``--tensor-parallel-size`` 1, 2 or 4 (dividing the attention heads),
and ``nvidia.com/gpu`` = TP; no GPU product named (node pools decide). Three in four are
Deployments of one replica, the rest bare Pods.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.apps_v1 import Deployment, ReplicaSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate, ResourceSlice

from bench.kube_control_plane import KubeCluster
from bench.webhook_configs import MUTATING, shipped_configuration
from bench.webhook_process import WebhookProcess
from bench.webhook_process import start_webhook as start_process
from gatekeeper.cluster import DRIVER_NAME, slice_name
from gatekeeper.cluster.agent import AgentConfig, NodeAgent
from gatekeeper.gpus import InventorySnapshot, StaticInventory, parse_declared_node
from gatekeeper.models import catalog_entries

POOL_LABEL = "bench.vllm-gatekeeper.io/pool"
IMAGE = "vllm/vllm-openai:v0.32.0"
DEVICE_CLASS = (
    Path(__file__).resolve().parents[1] / "deploy/kubernetes/components/cluster/deviceclass.yaml"
)
LENGTHS = (2048, 4096, 8192, 16384, 32768)
MAX_PARAMETERS = 75_000_000_000
"""Models up to a 70B; the catalog's 100B-670B models would only be denied."""
GPUS_PER_NODE = 8
READY_SECONDS = 60.0
"""The longest wait for the webhook's warm-up."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One vLLM workload as it arrives: a Deployment of one replica or a bare Pod."""

    name: str
    model: str
    args: tuple[str, ...]
    tp: int
    kind: str


@dataclass(frozen=True, slots=True)
class Fleet:
    """Where a storm runs: its namespace, its pool of nodes (name, product) and taint."""

    namespace: str
    pool: str
    nodes: tuple[tuple[str, str], ...]

    @property
    def taint(self) -> dict[str, str]:
        return {"key": POOL_LABEL, "value": self.pool, "effect": "NoSchedule"}

    @property
    def gpus(self) -> int:
        return GPUS_PER_NODE * len(self.nodes)


def fleet(namespace: str, pool: str, products: Sequence[str]) -> Fleet:
    """A fleet of one node per product, named ``<pool>-<i>``."""
    return Fleet(namespace, pool, tuple((f"{pool}-{i}", p) for i, p in enumerate(products)))


def _heads(config: dict[str, Any]) -> int | None:
    heads = config.get("num_attention_heads")
    if heads is None:
        heads = (config.get("text_config") or {}).get("num_attention_heads")
    return int(heads) if heads else None


def _choices() -> list[tuple[str, int | None, int, bool]]:
    """(model, attention heads, longest context, already quantized) per eligible entry."""
    found = []
    for entry in catalog_entries():
        if entry.parameters is None or entry.parameters > MAX_PARAMETERS:
            continue
        config = entry.config
        text = config.get("text_config") or {}
        longest = config.get("max_position_embeddings") or text.get("max_position_embeddings")
        quantized = bool(config.get("quantization_config"))
        found.append((entry.repo_id, _heads(config), int(longest or 4096), quantized))
    return found


def draw_workloads(count: int, seed: int = 29) -> list[Workload]:
    """``count`` workloads drawn from the catalog, the same for the same seed."""
    rng = random.Random(seed)
    choices = _choices()
    drawn = []
    for i in range(count):
        model, heads, longest, quantized = rng.choice(choices)
        length = rng.choice([n for n in LENGTHS if n <= longest] or [longest])
        tp = rng.choice([t for t in (1, 1, 1, 2, 2, 4) if (heads or 1) % t == 0])
        args = [model, "--max-model-len", str(length), "--tensor-parallel-size", str(tp)]
        if not quantized and rng.random() < 0.3:
            args += ["--quantization", "fp8"]
        kind = "Pod" if rng.random() < 0.25 else "Deployment"
        drawn.append(Workload(f"w{i:03d}", model, tuple(args), tp, kind))
    return drawn


def node_manifest(name: str, f: Fleet) -> dict[str, Any]:
    """A Ready Node with room for many pods, labelled with the pool and tainted."""
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench"}
    capacity = {"cpu": "256", "memory": "2Ti", "pods": "1000"}
    labels = {"kubernetes.io/hostname": name, POOL_LABEL: f.pool}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [f.taint]},
        "status": {"conditions": [ready], "capacity": capacity, "allocatable": capacity},
    }


def declared_gpus(node: str, product: str) -> InventorySnapshot:
    """``8x<product>``, declared, each GPU with a uuid of its node."""
    declared = parse_declared_node(f"{GPUS_PER_NODE}x{product}")
    gpus = tuple(dataclasses.replace(g, uuid=f"GPU-{node}-{g.index}") for g in declared.gpus)
    return dataclasses.replace(declared, gpus=gpus)


def _create(client: Client, manifest: dict[str, Any]) -> None:
    """Creates ``manifest``; one that exists already (409) is left as it is."""
    try:
        client.create(from_dict(manifest))
    except ApiError as e:
        if e.status.code != 409:
            raise


def set_up(client: Client, f: Fleet) -> None:
    """The DeviceClass, the namespace, the nodes, and each node's slice as its agent
    publishes it."""
    _create(client, device_class())
    _create(client, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f.namespace}})
    for name, product in f.nodes:
        _create(client, node_manifest(name, f))
        snapshot = declared_gpus(name, product)
        NodeAgent(client, AgentConfig(node_name=name), StaticInventory(snapshot).snapshot).publish()


def tear_down(client: Client, f: Fleet) -> None:
    """Removes what a storm left in a shared control plane (no garbage collector runs
    there): the namespace's workloads, pods (at once: no kubelet ends them), claims and
    templates, then the fleet's slices and nodes. The namespace stays (no namespace
    controller runs either)."""
    ns = f.namespace
    for kind in (Deployment, ReplicaSet, ResourceClaimTemplate):
        client.deletecollection(kind, namespace=ns)
    client.deletecollection(Pod, namespace=ns, grace_period=0)
    client.deletecollection(ResourceClaim, namespace=ns)
    for name, _ in f.nodes:
        with contextlib.suppress(ApiError):
            client.delete(ResourceSlice, slice_name(name))
        with contextlib.suppress(ApiError):
            client.delete(Node, name)


def device_class() -> dict[str, Any]:
    """gatekeeper's DeviceClass as shipped (``DEVICE_CLASS``): the one source for the
    bench and the tests."""
    manifest: dict[str, Any] = yaml.safe_load(DEVICE_CLASS.read_text())
    return manifest


def _pod_spec(w: Workload, f: Fleet, whole_gpu: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "vllm",
        "image": IMAGE,
        "command": ["vllm", "serve"],
        "args": list(w.args),
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "tolerations": [{**f.taint, "operator": "Equal"}],
        "nodeSelector": {POOL_LABEL: f.pool},
    }
    if whole_gpu:
        container["resources"] = {"claims": [{"name": "gpus"}]}
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": f"whole-{w.tp}"}]
    else:
        container["resources"] = {"limits": {"nvidia.com/gpu": w.tp}}
    return spec


def manifest(w: Workload, f: Fleet, *, whole_gpu: bool = False) -> dict[str, Any]:
    """``w`` as it is applied: asking ``nvidia.com/gpu`` (gatekeeper's webhook turns that
    into its memory claim), or, ``whole_gpu``, a claim of one whole device per rank."""
    labels = {"app": w.name}
    spec = _pod_spec(w, f, whole_gpu)
    metadata = {"name": w.name, "namespace": f.namespace, "labels": labels}
    if w.kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    template = {"metadata": {"labels": labels}, "spec": spec}
    body = {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": body}


def whole_gpu_template(tp: int, namespace: str) -> dict[str, Any]:
    """One whole device per rank: ``count: 1`` and no capacity request, so each consumes
    the device's ``requestPolicy.default`` (KEP-5075), which the agent publishes as the
    whole capacity; the ranks on one node, on distinct GPUs."""
    ranks = [f"rank{i}" for i in range(tp)]
    requests = [{"name": r, "exactly": {"deviceClassName": DRIVER_NAME, "count": 1}} for r in ranks]
    devices: dict[str, Any] = {"requests": requests}
    if tp > 1:
        devices["constraints"] = [
            {"requests": ranks, "matchAttribute": f"{DRIVER_NAME}/node"},
            {"requests": ranks, "distinctAttribute": f"{DRIVER_NAME}/uuid"},
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"whole-{tp}", "namespace": namespace},
        "spec": {"spec": {"devices": devices}},
    }


def start_webhook(cluster: KubeCluster, directory: Path) -> WebhookProcess:
    """``gatekeeper webhook --mutate`` with the cluster's kubeconfig (it creates claim
    templates), ready on 127.0.0.1 over TLS and warmed up (``/readyz``: as a readiness
    probe keeps the apiserver's reviews away until then)."""
    directory.mkdir(parents=True, exist_ok=True)
    hook = start_process(directory, "--mutate", "--kubeconfig", str(cluster.kubeconfig))
    deadline = time.monotonic() + READY_SECONDS
    with httpx.Client(verify=hook.context(), timeout=2) as client:
        while client.get(hook.url("/readyz")).status_code not in (200, 404):  # 404: no warm-up
            if time.monotonic() > deadline:
                hook.stop()
                raise RuntimeError(f"gatekeeper webhook not ready in {READY_SECONDS} s")
            time.sleep(0.1)
    return hook


def webhook_metrics(hook: WebhookProcess) -> str:
    """The webhook's own ``/metrics`` text."""
    with httpx.Client(verify=hook.context(), timeout=5) as client:
        return client.get(hook.url("/metrics")).text


def webhook_configuration(name: str, hook: WebhookProcess, namespace: str) -> dict[str, Any]:
    """The shipped MutatingWebhookConfiguration (its rules) named ``name``, its webhook
    ``<name>.vllm-gatekeeper.io``, sending ``namespace``'s workloads to ``hook`` with
    ``failurePolicy: Fail`` (a workload the webhook did not see is not admitted, so none
    slips past the count)."""
    config = shipped_configuration(MUTATING, hook.url(""), hook.ca_bundle, namespace, "Fail")
    config["metadata"] = {"name": name}
    config["webhooks"][0]["name"] = f"{name}.vllm-gatekeeper.io"
    return config
