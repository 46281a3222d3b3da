"""What one refresh of the webhook's Nodes' labels costs (``gatekeeper webhook
--published-devices``, ``gatekeeper.k8s.published``): the bytes and the time of the full
list of the Nodes (what lightkube's ``list(Node)`` asks: the webhook's read before) against
the metadata-only list in pages of ``NODES_PAGE_SIZE`` (``read_node_labels``: its read now,
timed as a refresh runs it, with the connection it makes).

``--nodes`` Nodes (default 200) are made through the real apiserver of
``bench.kube_control_plane`` as a GPU node's kubelet and its neighbours write one: the
kubelet creates it (labels, ``spec.providerID``) and writes its status (capacity, five
conditions, addresses, ``nodeInfo``, the 50 images kubelet reports), GPU feature
discovery adds its ``nvidia.com/gpu.*`` labels, the controller manager the pod CIDR and
its annotation: each writer a field manager, so ``metadata.managedFields`` (which the
metadata-only list keeps) is as long as on a real node. Bytes are counted twice: on the
wire (``num_bytes_downloaded``: the apiserver gzips answers over 128 KiB) and decoded.

    python -m bench.node_list_bytes [--nodes 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.resources.core_v1 import Node

from bench.kube_control_plane import KubeCluster, kube_bin_dir, missing_reason, start_cluster
from gatekeeper.k8s.published import NODES_PAGE_SIZE, node_labels, read_node_labels

MERGE = {"Content-Type": "application/merge-patch+json"}
IMAGES = ["nvcr.io/nvidia/k8s-device-plugin", "nvcr.io/nvidia/k8s/dcgm-exporter",
          "nvcr.io/nvidia/gpu-feature-discovery", "vllm/vllm-openai", "registry.k8s.io/kube-proxy",
          "docker.io/calico/node", "docker.io/calico/cni", "registry.k8s.io/pause",
          "quay.io/prometheus/node-exporter", "ghcr.io/llm-d/llm-d-inference-scheduler"]  # fmt: skip


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def kubelet_node(name: str, i: int) -> dict[str, Any]:
    """A GPU node as its kubelet registers it (status written apart, ``kubelet_status``)."""
    labels = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": f"us-east-1{'abc'[i % 3]}",
        "node-role.kubernetes.io/gpu": "", "eks.amazonaws.com/nodegroup": "gpu-h100",
    }  # fmt: skip
    annotations = {"node.alpha.kubernetes.io/ttl": "0",
                   "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                   "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-0{i:016x}"})}  # fmt: skip
    spec = {"providerID": f"aws:///us-east-1a/i-0{i:016x}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "spec": spec,
            "metadata": {"name": name, "labels": labels, "annotations": annotations}}  # fmt: skip


def kubelet_status(name: str, i: int) -> dict[str, Any]:
    """The status a kubelet writes: capacity, conditions, addresses, nodeInfo, 50 images."""
    capacity = {"cpu": "192", "memory": "2097152000Ki", "pods": "110", "nvidia.com/gpu": "8",
                "ephemeral-storage": "3905664184Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}  # fmt: skip
    now = "2026-12-05T09:00:00Z"
    conditions = [
        {"type": kind, "status": status, "reason": reason, "message": message,
         "lastHeartbeatTime": now, "lastTransitionTime": now}
        for kind, status, reason, message in (
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ("NetworkUnavailable", "False", "CalicoIsUp", "Calico is running on this node"),
        )
    ]  # fmt: skip
    images = [
        {"names": [f"{repo}@{_digest(f'{repo}{v}{i % 7}')}", f"{repo}:v{v}.{i % 7}.0"],
         "sizeBytes": 100_000_000 + 37_000_000 * v + i}
        for v in range(5) for repo in IMAGES
    ]  # fmt: skip
    info = {"machineID": hashlib.md5(name.encode()).hexdigest(), "systemUUID": f"ec2{i:029x}",
            "bootID": hashlib.sha1(name.encode()).hexdigest(), "kernelVersion": "6.1.115-126.197.amzn2023.x86_64",
            "osImage": "Amazon Linux 2023.6.20241121", "containerRuntimeVersion": "containerd://1.7.23",
            "kubeletVersion": "v1.37.0", "kubeProxyVersion": "v1.37.0", "operatingSystem": "linux",
            "architecture": "amd64"}  # fmt: skip
    addresses = [{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250 + 2}"},
                 {"type": "Hostname", "address": name},
                 {"type": "InternalDNS", "address": f"{name}.ec2.internal"}]  # fmt: skip
    status = {"capacity": capacity, "allocatable": capacity, "conditions": conditions,
              "addresses": addresses, "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
              "nodeInfo": info, "images": images}  # fmt: skip
    return {"status": status}


def gfd_labels(i: int) -> dict[str, Any]:
    """The labels GPU feature discovery adds."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
              "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper",
              "nvidia.com/gpu.machine": "p5.48xlarge", "nvidia.com/gpu.compute.major": "9",
              "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "570",
              "nvidia.com/cuda.driver.minor": "86", "nvidia.com/cuda.driver.rev": "15",
              "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "8",
              "nvidia.com/gfd.timestamp": str(1764900000 + i), "nvidia.com/mig.capable": "true",
              "nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.dcgm-exporter": "true"}  # fmt: skip
    return {"metadata": {"labels": labels}}


def make_nodes(http: httpx2.Client, count: int) -> None:
    """``count`` Nodes, each written by its four field managers."""
    for i in range(count):
        name = f"gpu-node-{i:04d}"
        writes = [
            ("POST", "/api/v1/nodes", "kubelet", kubelet_node(name, i)),
            ("PATCH", f"/api/v1/nodes/{name}/status", "kubelet", kubelet_status(name, i)),
            ("PATCH", f"/api/v1/nodes/{name}", "gpu-feature-discovery", gfd_labels(i)),
            ("PATCH", f"/api/v1/nodes/{name}", "kube-controller-manager",
             {"spec": {"podCIDR": f"10.244.{i % 256}.0/24", "podCIDRs": [f"10.244.{i % 256}.0/24"]}}),
        ]  # fmt: skip
        for method, path, manager, body in writes:
            headers = MERGE if method == "PATCH" else {}
            answer = http.request(
                method, path, json=body, params={"fieldManager": manager}, headers=headers
            )
            answer.raise_for_status()


def measure(http: httpx2.Client, api: Client, repeat: int) -> dict[str, Any]:
    """Bytes (wire, decoded) and the median time of each way to read the labels."""
    full = http.get("/api/v1/nodes")  # what lightkube's list(Node) asks
    full.raise_for_status()
    pages: list[httpx2.Response] = []
    http.event_hooks["response"] = [pages.append]
    labels = node_labels(http)
    http.event_hooks["response"] = []
    before = [_timed(lambda: lightkube_labels(api))]
    after = [_timed(lambda: read_node_labels(api))]
    for _ in range(repeat - 1):
        before.append(_timed(lambda: lightkube_labels(api)))
        after.append(_timed(lambda: read_node_labels(api)))
    return {
        "nodes": len(labels),
        "same_labels": labels == lightkube_labels(api),
        "full_list": {"wire_bytes": full.num_bytes_downloaded, "bytes": len(full.content),
                      "requests": 1, "p50_ms": round(statistics.median(before) * 1000, 1)},
        "metadata_only": {"wire_bytes": sum(p.num_bytes_downloaded for p in pages),
                          "bytes": sum(len(p.content) for p in pages), "requests": len(pages),
                          "managed_fields_bytes": _managed_fields_bytes(pages),
                          "page_size": NODES_PAGE_SIZE,
                          "p50_ms": round(statistics.median(after) * 1000, 1)},
    }  # fmt: skip


def lightkube_labels(api: Client) -> dict[str, dict[str, str]]:
    """The labels as the webhook read them before: lightkube's list of the whole Nodes."""
    listed = (n.metadata for n in api.list(Node) if n.metadata is not None)
    return {str(m.name): dict(m.labels or {}) for m in listed}


def _managed_fields_bytes(pages: list[httpx2.Response]) -> int:
    """The bytes of ``metadata.managedFields`` in the pages (kept by the metadata-only list)."""
    items = [item for page in pages for item in page.json()["items"]]
    return sum(len(json.dumps(i["metadata"].get("managedFields", []))) for i in items)


def _timed(read: Any) -> float:
    start = time.perf_counter()
    read()
    return time.perf_counter() - start


def run(cluster: KubeCluster, count: int, repeat: int) -> dict[str, Any]:
    api = cluster.client()
    with HttpClient(api.config, ConnectionParams(trust_env=False)) as http:
        make_nodes(http, count)
        one = http.get(f"/api/v1/nodes/gpu-node-{0:04d}").content
        figures = measure(http, api, repeat)
    api.close()
    figures["one_node_bytes"] = len(one)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    reason = missing_reason(kube_bin_dir())
    if reason is not None:
        raise SystemExit(reason)
    with tempfile.TemporaryDirectory(prefix="bench-node-list-") as tmp:
        cluster = start_cluster(kube_bin_dir(), Path(tmp))
        try:
            figures = run(cluster, args.nodes, args.repeat)
        finally:
            cluster.stop()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
