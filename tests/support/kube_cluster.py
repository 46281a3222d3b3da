"""Kubernetes' own control plane on loopback for the cluster tests (issue 29).

The session fixture ``kube_cluster`` around ``bench.kube_control_plane.start_cluster``
(shared with ``python -m bench.cluster``): etcd, kube-apiserver, kube-scheduler and
kube-controller-manager built by ``scripts/k8s-components.sh`` into ``build/k8s/`` (or
``$GATEKEEPER_KUBE_BIN``), each on ``127.0.0.1`` with free ports and its state under a
pytest temporary directory; skipped, naming the command that builds them, where a binary
is missing. There is no kubelet: tests register Node objects with a Ready status
themselves.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace

from bench.cluster_fleet import webhook_configuration
from bench.kube_control_plane import (
    BINARIES,
    KUBE_BIN_ENV,
    Component,
    KubeCluster,
    kube_bin_dir,
    missing_reason,
    start_cluster,
)
from bench.webhook_process import WebhookProcess

__all__ = [
    "BINARIES",
    "KUBE_BIN_ENV",
    "Component",
    "KubeCluster",
    "create_unless_present",
    "kube_bin_dir",
    "kube_cluster",
    "missing_reason",
    "mutating_route",
    "namespace_client",
    "ready_node",
    "start_cluster",
]


def ready_node(name: str, taints: tuple[dict[str, str], ...] = ()) -> dict[str, Any]:
    """A Node as a kubelet would register it, Ready, with room for pods (no kubelet here:
    the apiserver keeps the status given at creation); ``taints`` keep other modules' pods
    off it."""
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"conditions": [ready], "capacity": capacity, "allocatable": capacity},
    }
    if taints:
        node["spec"] = {"taints": list(taints)}
    return node


def create_unless_present(api: Client, manifest: dict[str, Any]) -> None:
    """Creates ``manifest``; one already there (409: another module of the session made
    it, the DeviceClass most often) is left as it is."""
    try:
        api.create(from_dict(manifest))
    except ApiError as e:
        if e.status.code != 409:
            raise


@contextmanager
def namespace_client(cluster: KubeCluster, namespace: str) -> Iterator[Client]:
    """A client of ``cluster`` and the namespace ``namespace`` made for it, both gone after."""
    client = cluster.client()
    client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    try:
        yield client
    finally:
        client.delete(Namespace, namespace)
        client.close()


@contextmanager
def mutating_route(api: Client, name: str, hook: WebhookProcess, namespace: str) -> Iterator[None]:
    """The namespace (unless present) and the shipped MutatingWebhookConfiguration, named
    ``name``, sending its workloads to ``hook`` (``failurePolicy: Fail``); the
    configuration is deleted after."""
    create_unless_present(
        api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    api.create(from_dict(webhook_configuration(name, hook, namespace)))
    try:
        yield
    finally:
        api.delete(MutatingWebhookConfiguration, name)


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """The control plane for the whole session; skipped where the binaries are absent."""
    bin_dir = kube_bin_dir()
    reason = missing_reason(bin_dir)
    if reason is not None:
        pytest.skip(reason)
    cluster = start_cluster(bin_dir, tmp_path_factory.mktemp("kube"))
    try:
        yield cluster
    finally:
        cluster.stop()
