"""The node agent's report of the pods whose GPU claims kube-scheduler cannot allocate: an
``Unallocatable`` Warning Event on each, with the bytes (issue 39 item 2;
``unallocatable`` says what and how).

Each pass of every agent lists the Pending pods (one list, ``status.phase=Pending``),
keeps those the scheduler said "cannot allocate all claims" of, and, when there are any,
reads the driver's ResourceSlices (one list) and the claims (the agent's ``ClaimsWatch``).
The Event's name is a hash of the change (``unallocatable.event_name``), so the agents
write one Event per pod per change between them: the first create wins, the others are
told it exists (409) and take it as written. Each agent remembers what it wrote or found
written, so it lists the slices again only for a new pod or a new change. A failed list
or create is logged and tried again at the next pass; it never fails the pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx2
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceSlice

from gatekeeper.cluster.decision_log import decisions
from gatekeeper.cluster.kube_time import rfc3339
from gatekeeper.cluster.unallocatable import (
    ClaimAsk,
    WaitingPod,
    claim_asks,
    event_name,
    free_devices,
    pod_event,
    unallocatable_text,
    waiting_pods,
)

__all__ = ["REASON", "AllocationReporter"]

log = logging.getLogger("gatekeeper.cluster.allocation_events")
REASON = "Unallocatable"
"""The Event's reason."""
ERRORS = (ApiError, httpx2.HTTPError, OSError)


class AllocationReporter:
    """Writes the ``Unallocatable`` Events through ``client`` for ``driver``'s claims."""

    def __init__(
        self,
        client: Client,
        driver: str,
        node: str,
        list_claims: Callable[[], Iterable[Mapping[str, Any]]],
        to_bytes: Callable[[str], int],
    ) -> None:
        self._client = client
        self._driver = driver
        self._node = node
        self._list_claims = list_claims
        self._to_bytes = to_bytes
        self.reported: dict[str, str] = {}
        """Each waiting pod's uid and the name of the Event that says its last change."""
        self.written = 0
        """Events this agent created (the others' creates it found done are not counted)."""

    def report(self) -> list[str]:
        """One pass: the names of the Events written or found written for new changes."""
        try:
            listed = self._client.list(Pod, namespace="*", fields={"status.phase": "Pending"})
            waiting = waiting_pods(p.to_dict() for p in listed)
        except ERRORS as e:
            log.warning("Pending pods not listed: %s", e)
            return []
        self.reported = {u: n for u, n in self.reported.items() if u in {p.uid for p in waiting}}
        if not waiting:
            return []
        try:
            claims = {
                (c["metadata"].get("namespace", ""), c["metadata"]["name"]): c
                for c in self._list_claims()
            }
        except ERRORS as e:
            log.warning("claims not listed: %s", e)
            return []
        done: list[str] = []
        free: dict[str, Any] | None = None
        for pod in waiting:
            asks = self._asks(pod, claims)
            name = event_name(pod, asks) if asks else None
            if name is None or self.reported.get(pod.uid) == name:
                continue
            if free is None:
                free = self._free(claims.values())
                if free is None:
                    return done
            if self._write(pod, asks, free, name):
                self.reported[pod.uid] = name
                done.append(name)
        return done

    def _asks(self, pod: WaitingPod, claims: Mapping[tuple[str, str], Any]) -> list[ClaimAsk]:
        found = (claims.get((pod.namespace, name)) for name in pod.claims)
        asks = (claim_asks(c, self._driver, self._to_bytes) for c in found if c is not None)
        return [a for a in asks if a is not None]

    def _free(self, claims: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
        try:
            listed = self._client.list(ResourceSlice, fields={"spec.driver": self._driver})
            slices = [s.to_dict() for s in listed]
        except ERRORS as e:
            log.warning("ResourceSlices not listed: %s", e)
            return None
        return dict(free_devices(slices, claims, self._driver, self._to_bytes))

    def _write(
        self, pod: WaitingPod, asks: list[ClaimAsk], free: Mapping[str, Any], name: str
    ) -> bool:
        """Creates the Event; True when it exists now (created here or by another agent)."""
        message = unallocatable_text(asks, free, pod.node)
        now = rfc3339(time.time())
        who = (pod.namespace, pod.name, pod.uid)
        try:
            self._client.create(from_dict(pod_event(who, message, REASON, self._node, now, name)))
        except ApiError as e:
            if e.status.code == 409:
                return True
            log.warning("event for pod %s/%s not recorded: %s", pod.namespace, pod.name, e)
            return False
        except ERRORS as e:
            log.warning("event for pod %s/%s not recorded: %s", pod.namespace, pod.name, e)
            return False
        self.written += 1
        fields = {
            "event": "claim_unallocatable",
            "namespace": pod.namespace,
            "pod": pod.name,
            "claims": [a.claim for a in asks],
            "devices": [a.devices for a in asks],
            "bytes_per_device": [a.memory_bytes for a in asks],
            "reason": message,
        }
        decisions.warning("claim unallocatable", extra={"fields": fields})
        return True
