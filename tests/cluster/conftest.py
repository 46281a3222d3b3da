"""The cluster tests' control plane: ``kube_cluster`` (tests/support/kube_cluster.py)."""

from tests.support.kube_cluster import kube_cluster

__all__ = ["kube_cluster"]
