"""Certificates for TLS tests: ``bench/tls_certs.py``, which the cluster bench shares
(``bench.kube_control_plane`` starts the apiserver with them)."""

from bench.tls_certs import Authority, issue, make_ca

__all__ = ["Authority", "issue", "make_ca"]
