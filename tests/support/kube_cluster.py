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

import pytest

from bench.kube_control_plane import (
    BINARIES,
    KUBE_BIN_ENV,
    Component,
    KubeCluster,
    kube_bin_dir,
    missing_reason,
    start_cluster,
)

__all__ = [
    "BINARIES",
    "KUBE_BIN_ENV",
    "Component",
    "KubeCluster",
    "kube_bin_dir",
    "kube_cluster",
    "missing_reason",
    "start_cluster",
]


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
