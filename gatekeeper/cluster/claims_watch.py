"""The cluster's ResourceClaims, kept by one watch per agent (an informer).

``ClaimsWatch`` lists the claims once, keeps the list's ``resourceVersion`` and watches
from it (``Client.watch(ResourceClaim, namespace=ALL_NS, resource_version=...)``) in a
thread of its own, applying ADDED and MODIFIED (replace by uid) and DELETED (drop by
uid) to a dict. A stream the apiserver closes cleanly is resumed by lightkube from the
last event's version; a 410 Gone (the version expired) re-lists at once; a broken stream
or a failed list re-lists after a backoff (``BACKOFF_SECONDS`` doubling to
``BACKOFF_MAX_SECONDS``). Reads (calling the watch) return the current set at once and
never wait on the apiserver once the first list has succeeded; before that a read lists
directly and raises as a list does, so each caller keeps its failure behaviour (the
publishing pass fails and retries; a scrape skips the per-pod series). The set is as
stale as the watch's latency (a change was in the set about 3 ms after its API call began,
at most 5.3 ms, on loopback; docs/cluster.md), and, after a broken stream, the backoff and
a list.

``stop`` ends the thread at its next event or reconnect; it is a daemon thread, so it
never holds the process. The same informer keeps other objects given ``resource``,
``labels`` and ``key`` (the mutating webhook's ResourceClaimTemplates, by namespace and
name: ``gatekeeper.k8s.template_store``); ``get`` reads one object by its key.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import httpx2
from lightkube import ALL_NS, ApiError, Client
from lightkube.resources.resource_v1 import ResourceClaim

__all__ = ["BACKOFF_MAX_SECONDS", "BACKOFF_SECONDS", "ClaimsWatch"]

log = logging.getLogger("gatekeeper.cluster.claims_watch")

BACKOFF_SECONDS = 0.5
"""The first wait before re-listing after a broken stream or a failed list."""
BACKOFF_MAX_SECONDS = 30.0
"""The longest wait between re-lists while the apiserver cannot be reached."""
ERRORS = (ApiError, httpx2.HTTPError, OSError)


def _uid(claim: Mapping[str, Any]) -> str:
    uid: str = claim["metadata"]["uid"]
    return uid


class ClaimsWatch:
    """The cluster's ResourceClaims (API dicts) through ``client``, kept current by a
    watch once ``start`` is called; call the watch to read them. ``resource``, ``labels``
    (a label selector) and ``key`` (an object's key in the set, default its uid) make it
    keep other objects; ``name`` is what its log lines call it."""

    def __init__(
        self,
        client: Client,
        server_timeout_seconds: int | None = None,
        *,
        resource: Any = ResourceClaim,
        labels: Mapping[str, str] | None = None,
        key: Callable[[Mapping[str, Any]], Hashable] = _uid,
        name: str = "claims",
    ) -> None:
        self._client = client
        self._server_timeout = server_timeout_seconds
        self._resource, self._key, self._name = resource, key, name
        self._labels: dict[str, Any] | None = dict(labels) if labels else None
        self._lock = threading.Lock()
        self._claims: dict[Hashable, dict[str, Any]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-watch", daemon=True)
        self.lists = 0
        """How many times the watch has listed the claims (once, plus once per re-list)."""

    @property
    def synced(self) -> bool:
        """True once a list has succeeded: reads no longer reach the apiserver."""
        with self._lock:
            return self._claims is not None

    def start(self) -> ClaimsWatch:
        self._thread.start()
        return self

    def stop(self, timeout_seconds: float = 0.0) -> None:
        """Ends the watch at its next event or reconnect (waiting up to
        ``timeout_seconds`` for it)."""
        self._stop.set()
        if timeout_seconds > 0 and self._thread.is_alive():
            self._thread.join(timeout_seconds)

    def __call__(self) -> list[dict[str, Any]]:
        """The claims now: the watch's set once synced, else a direct list (raising as
        a list does)."""
        with self._lock:
            if self._claims is not None:
                return list(self._claims.values())
        listed = self._client.list(self._resource, namespace=ALL_NS, labels=self._labels)
        return [c.to_dict() for c in listed]

    def get(self, key: Hashable) -> dict[str, Any] | None:
        """The object of ``key`` in the watch's set; None when absent or not synced."""
        with self._lock:
            return None if self._claims is None else self._claims.get(key)

    def _run(self) -> None:
        delay = BACKOFF_SECONDS
        while not self._stop.is_set():
            try:
                version = self._relist()
                delay = BACKOFF_SECONDS
                self._follow(version)
            except ERRORS as e:
                if self._stop.is_set():
                    return
                self._failed(e, delay)
                if isinstance(e, ApiError) and e.status.code == 410:
                    continue
            self._stop.wait(delay)
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    def _failed(self, e: Exception, delay: float) -> None:
        if isinstance(e, ApiError) and e.status.code == 410:
            log.info("the %s' watch expired (410 Gone), re-listing: %s", self._name, e)
        elif isinstance(e, ApiError):
            log.warning("the %s' watch failed, re-listing in %.1f s: %s", self._name, delay, e)
        else:
            log.warning("the %s' watch broke, re-listing in %.1f s: %s", self._name, delay, e)

    def _relist(self) -> str:
        listed = self._client.list(self._resource, namespace=ALL_NS, labels=self._labels)
        claims = {}
        for claim in listed:
            found = claim.to_dict()
            claims[self._key(found)] = found
        with self._lock:
            self._claims = claims
            self.lists += 1
        return listed.resourceVersion

    def _follow(self, version: str) -> None:
        events = self._client.watch(
            self._resource,
            namespace=ALL_NS,
            labels=self._labels,
            resource_version=version,
            server_timeout=self._server_timeout,
        )
        for kind, claim in events:
            if self._stop.is_set():
                return
            self._apply(kind, claim.to_dict())

    def _apply(self, kind: str, claim: dict[str, Any]) -> None:
        with self._lock:
            if self._claims is None:
                return
            if kind == "DELETED":
                self._claims.pop(self._key(claim), None)
            elif kind in ("ADDED", "MODIFIED"):
                self._claims[self._key(claim)] = claim
