"""The validating webhook's edge to the apiserver in cluster mode: the ResourceSlices that
gatekeeper's node agents publish, read and cached.

``PublishedDevices`` lists the slices of driver ``gpu.gatekeeper.dev`` (a field selector
on ``spec.driver``, one API call) at most once per ``refresh_seconds`` (default 10, the
node agents' interval) and gives the ``Fleet`` of device shapes ``gatekeeper.k8s.fleet``
makes of them; reviews in between use the cached fleet. With ``background`` (as
``gatekeeper webhook --published-devices`` runs it) only the first review reads through
the apiserver: a fleet older than ``refresh_seconds`` is served while a background thread
reads the new one (one at a time), so no review waits on a refresh; without it, the
review that finds the fleet stale reads it. With them it lists the Nodes'
labels, which ``gatekeeper.k8s.node_scope`` matches to a pod's node selector and required
affinity: metadata only (``node_labels``: ``Accept: application/json;as=
PartialObjectMetadataList;g=meta.k8s.io;v=v1``: 4.7 kB a Node, most of it
``managedFields``, instead of 15.6 kB with its status and images, ``bench.node_list_bytes``),
in pages of ``NODES_PAGE_SIZE`` (``limit`` and ``continue``), over one connection made per
refresh from the lightkube client's config (lightkube cannot ask for metadata only). A failed read keeps the last good fleet (or
Nodes' labels), logged (``CachedReading``'s ``KeepLastGood``); with none yet, the fleet
carries the error, and the webhook falls back to product mode (without the Nodes, it
judges a pod on every published GPU) with a warning. RBAC: ``resourceslices`` and
``nodes`` list. Uses lightkube (the ``cluster`` extra); imported only by ``gatekeeper
webhook --published-devices``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

import httpx2
from lightkube import ApiError, Client
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.resources.resource_v1 import ResourceSlice

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.slices import DRIVER_NAME
from gatekeeper.gpus.cached import CachedReading, KeepLastGood
from gatekeeper.k8s.fleet import Fleet, fleet_from_slices
from gatekeeper.k8s.revalidating import Revalidating

__all__ = [
    "METADATA_ONLY",
    "NODES_PAGE_SIZE",
    "PublishedDevices",
    "node_labels",
    "read_node_labels",
]

METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""The ``Accept`` that lists objects as their metadata alone (client-go's metadata client)."""
NODES_PAGE_SIZE = 500
"""Nodes per page of the labels' list."""
_FAILURES = (ApiError, httpx2.HTTPError, OSError)
NodeLabels = tuple[Mapping[str, Mapping[str, str]] | None, str | None]


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
        nodes_page_size: int = NODES_PAGE_SIZE,
        background: bool = False,
    ) -> None:
        self._client = client
        self._driver = driver
        self._page_size = nodes_page_size
        slices = functools.partial(_why, resource="resourceslices")
        self._fleet = CachedReading(
            self._read,
            refresh_seconds,
            on_failure=KeepLastGood(_FAILURES, slices, lambda why: Fleet(error=why)),
            clock=clock,
            name="webhook: the published devices",
        )
        nodes = functools.partial(_why, resource="nodes")
        self._nodes: CachedReading[NodeLabels] = CachedReading(
            self._read_nodes,
            0.0,  # read with each fleet; the last good labels kept when a read fails
            on_failure=KeepLastGood(_FAILURES, nodes, lambda why: (None, why)),
            clock=clock,
            name="webhook: the Nodes' labels",
        )
        self._served = (
            Revalidating(self._fleet, refresh_seconds, clock=clock, name="webhook: the fleet")
            if background
            else None
        )

    def __call__(self) -> Fleet:
        return self._served() if self._served is not None else self._fleet()

    def _read(self) -> Fleet:
        listed = self._client.list(ResourceSlice, fields={"spec.driver": self._driver})
        slices = [s.to_dict() for s in listed]
        nodes, nodes_error = self._nodes()
        return fleet_from_slices(
            slices, quantity_bytes, self._driver, nodes=nodes, nodes_error=nodes_error
        )

    def _read_nodes(self) -> NodeLabels:
        return read_node_labels(self._client, self._page_size), None


def read_node_labels(client: Client, page_size: int = NODES_PAGE_SIZE) -> dict[str, dict[str, str]]:
    """``node_labels`` over one connection made from ``client``'s config for this read (a
    refresh's: lightkube cannot ask for metadata only)."""
    params = ConnectionParams(timeout=httpx2.Timeout(10.0), trust_env=False)
    with HttpClient(client.config, params) as http:
        return node_labels(http, page_size)


def node_labels(http: httpx2.Client, page_size: int = NODES_PAGE_SIZE) -> dict[str, dict[str, str]]:
    """Each Node's labels by name, listed through ``http`` (an apiserver's base URL and
    credentials) as metadata only, ``page_size`` Nodes a page. Raises ``ApiError`` on the
    apiserver's refusal (an expired ``continue`` too: 410), ``httpx2.HTTPError`` when it
    cannot be reached."""
    labels: dict[str, dict[str, str]] = {}
    params = {"limit": str(page_size)}
    while True:
        answer = http.get("/api/v1/nodes", params=params, headers={"Accept": METADATA_ONLY})
        if answer.is_error:
            _raise_for(answer)
        page = answer.json()
        for item in page.get("items") or ():
            metadata = item["metadata"]
            labels[metadata["name"]] = dict(metadata.get("labels") or {})
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            return labels
        params = {"limit": str(page_size), "continue": cont}


def _raise_for(answer: httpx2.Response) -> None:
    """The apiserver's Status as an ``ApiError``; an answer without one (a proxy's) as
    ``httpx2.HTTPStatusError``."""
    try:
        status = answer.json()
    except ValueError:
        answer.raise_for_status()
    if isinstance(status, dict) and status.get("kind") == "Status":
        raise ApiError(request=answer.request, response=answer)
    answer.raise_for_status()


def _why(e: Exception, resource: str) -> str:
    if isinstance(e, ApiError):
        return f"the apiserver refused to list {resource} ({e.status.code}: {e.status.message})"
    return f"the apiserver cannot be reached ({type(e).__name__}: {e})"
