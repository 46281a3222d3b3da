"""The validating webhook's edge to the apiserver in cluster mode: the ResourceSlices that
gatekeeper's node agents publish, read and cached.

``PublishedDevices`` lists the slices of driver ``gpu.gatekeeper.dev`` (a field selector
on ``spec.driver``, one API call) at most once per ``refresh_seconds`` (default 10, the
node agents' interval) and gives the ``Fleet`` of device shapes ``gatekeeper.k8s.fleet``
makes of them; reviews in between use the cached fleet. With them it lists the Nodes
(one more call) for their labels, which ``gatekeeper.k8s.node_scope`` matches to a pod's
node selector and required affinity. A failed read keeps the last good fleet (or Nodes'
labels), logged; with none yet, the fleet carries the error, and the webhook falls back to
product mode (without the Nodes, it judges a pod on every published GPU) with a warning.
RBAC: ``resourceslices`` and ``nodes`` list. Uses lightkube (the ``cluster`` extra);
imported only by ``gatekeeper webhook --published-devices``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import httpx2
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.slices import DRIVER_NAME
from gatekeeper.k8s.fleet import Fleet, fleet_from_slices

__all__ = ["PublishedDevices"]

logger = logging.getLogger(__name__)


class PublishedDevices:
    """A callable giving the published ``Fleet``, read through ``client`` when older than
    ``refresh_seconds``; safe to call from several review threads at once."""

    def __init__(
        self,
        client: Client,
        *,
        refresh_seconds: float = 10.0,
        driver: str = DRIVER_NAME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._refresh = refresh_seconds
        self._driver = driver
        self._clock = clock
        self._lock = threading.Lock()
        self._fleet: Fleet | None = None
        self._read_at = 0.0

    def __call__(self) -> Fleet:
        with self._lock:
            now = self._clock()
            if self._fleet is not None and now - self._read_at < self._refresh:
                return self._fleet
            self._read_at = now
            self._fleet = self._read(self._fleet)
            return self._fleet

    def _read(self, last: Fleet | None) -> Fleet:
        try:
            slices = [
                s.to_dict()
                for s in self._client.list(ResourceSlice, fields={"spec.driver": self._driver})
            ]
        except (ApiError, httpx2.HTTPError, OSError) as e:
            error = _why(e, "resourceslices")
        else:
            nodes, nodes_error = self._nodes(last)
            return fleet_from_slices(
                slices, quantity_bytes, self._driver, nodes=nodes, nodes_error=nodes_error
            )
        if last is not None and last.error is None:
            logger.warning("webhook: %s; judging by the devices read before", error)
            return last
        return Fleet(error=error)

    def _nodes(
        self, last: Fleet | None
    ) -> tuple[Mapping[str, Mapping[str, str]] | None, str | None]:
        """Each Node's labels by name, or the last ones read, or None and why."""
        try:
            listed = [n.metadata for n in self._client.list(Node) if n.metadata is not None]
        except (ApiError, httpx2.HTTPError, OSError) as e:
            error = _why(e, "nodes")
        else:
            return {str(m.name): dict(m.labels or {}) for m in listed}, None
        if last is not None and last.nodes is not None:
            logger.warning("webhook: %s; matching pods to the nodes read before", error)
            return last.nodes, None
        return None, error


def _why(e: Exception, resource: str) -> str:
    if isinstance(e, ApiError):
        return f"the apiserver refused to list {resource} ({e.status.code}: {e.status.message})"
    return f"the apiserver cannot be reached ({type(e).__name__}: {e})"
