"""Prometheus HTTP service discovery of the workers: ``GET /discovery/workers``.

Prometheus' ``http_sd_configs`` reads a JSON list of target groups,
``[{"targets": ["host:port"], "labels": {...}}]``, and scrapes each target's
``/metrics``, so the workers' own ``vllm:*`` series (KV cache usage, waiting requests,
time to first token, ``vllm:cache_config_info``) are collected beside gatekeeper's.
One group per worker that serves (``ready``, or ``stopping`` while it drains), with the
labels ``model`` and ``worker`` of gatekeeper's own worker series, DCGM exporter's
``gpu``, ``UUID`` and ``Hostname``, and kube-state-metrics' ``node``. A worker on
several GPUs (tensor parallel) lists them comma-separated in ``gpu`` and ``UUID``.

This module is a pure view of the deployments: no I/O. The address a target is given is
``advertised_host(worker_host, request_host)``: the workers' listen address, or, when
they listen on every interface, the host Prometheus reached the sidecar by.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gatekeeper.sidecar.deployment import Deployment

__all__ = ["SCRAPED_STATES", "advertised_host", "worker_targets"]

SCRAPED_STATES = frozenset({"ready", "stopping"})
"""States in which a worker serves ``/metrics``."""

_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def advertised_host(worker_host: str, request_host: str) -> str:
    """The host of a worker target: ``worker_host``, or ``request_host`` (the host part
    of the request's ``Host``) when workers listen on every interface. IPv6 addresses
    get brackets."""
    host = request_host if worker_host in _WILDCARDS else worker_host
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


def worker_targets(
    deployments: Iterable[Deployment], *, host: str, node: str
) -> list[dict[str, Any]]:
    """The target groups of the serving workers, sorted by worker id."""
    groups = []
    for d in sorted(deployments, key=lambda d: d.id):
        if d.state not in SCRAPED_STATES or not d.port:
            continue
        labels = {
            "model": d.name,
            "worker": d.id,
            "gpu": ",".join(str(i) for i in d.gpu_indices),
            "UUID": ",".join(d.gpu_uuids),
            "Hostname": node,
            "node": node,
        }
        groups.append({"targets": [f"{host}:{d.port}"], "labels": labels})
    return groups
