"""A storm of workloads applied at once, and what the cluster made of it (issue 29).

``storm`` creates every manifest from a thread pool (as fast as the apiserver takes them),
with a watch on the namespace's pods and claims that notes when each workload's pod is
first seen, its claim first seen (the resource-claim controller made it from the pod's
template), and the pod first seen bound (``spec.nodeName``); the clock is this
process's, in milliseconds (Kubernetes' timestamps have whole seconds). ``phases`` turns
those into where a workload's time went: the create call (admission, the webhook's time
in it), to its pod (the deployment and replica-set controllers, and the pod's own
admission), to its claim (the resource-claim controller), to bound (the scheduler). It then waits until each workload is settled: refused at
admission, bound, or pending with the scheduler's reason (its ``PodScheduled=False``
condition). ``audit`` reads back, per published device, the ``consumedCapacity`` of the
claims allocated on it and the bytes their templates request (gatekeeper's prediction),
against the device's capacity in its ResourceSlice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate, ResourceSlice

from bench.cluster_fleet import Fleet, Workload
from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.claim_annotation import read_record
from gatekeeper.k8s.workloads import pod_templates

Outcome = str
"""placed, pending (with the scheduler's reason), pending_without_reason, denied (with the
admission's reason), denied_without_reason, error."""


@dataclass
class Arrival:
    """One workload's create call: when it began, and what the apiserver answered."""

    workload: Workload
    started: float
    answered: float = 0.0
    """When the create call returned (admission done, the object stored or refused)."""
    denied: str | None = None
    need_bytes: int | None = None
    """Per rank, as gatekeeper's webhook recorded it on the created object."""


@dataclass
class StormResult:
    arrivals: list[Arrival]
    outcomes: dict[str, Outcome]
    reasons: dict[str, str]
    bind_ms: dict[str, float]
    """Per placed workload: its create call's start to its pod first seen bound."""
    seconds: float
    """From the first create to every workload settled."""
    phases_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per placed workload: ``admit`` (the create call), ``pod`` (its return to the pod
    first seen), ``claim`` (pod to claim first seen), ``bind`` (claim to pod bound)."""
    webhook_phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The webhook's own timing of its phases, when one ran (``bench.cluster``)."""
    pod_ms: dict[str, float] = field(default_factory=dict)
    """Per workload whose pod was seen, placed or not: its create call's start to its pod
    first seen (for a Deployment, the deployment and replica-set controllers' time)."""


@dataclass
class DeviceBooks:
    """What one device holds: its capacity and what the claims on it consume."""

    capacity: int
    consumed: int = 0
    predicted: int = 0
    claims: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)
    """The pods of those claims, in the same order."""
    unreported: int = 0
    """Allocations without ``consumedCapacity`` (counted as the whole capacity)."""

    @property
    def over_committed(self) -> bool:
        return self.consumed > self.capacity or self.predicted > self.capacity


def _need(created: Any) -> int | None:
    """The bytes per rank gatekeeper's webhook recorded on the created object's pod
    template (read as the webhooks read it), else None."""
    body = created.to_dict()
    for template in pod_templates(str(body.get("kind", "")), body):
        record = read_record(template.annotations)
        if record:
            return next(iter(record.values())).memory_bytes
    return None


def _create(client: Client, workload: Workload, manifest: dict[str, Any]) -> Arrival:
    arrival = Arrival(workload, time.monotonic())
    try:
        arrival.need_bytes = _need(client.create(from_dict(manifest)))
    except ApiError as e:
        arrival.denied = str(e.status.message or "")
    arrival.answered = time.monotonic()
    return arrival


class BindWatch:
    """Watches a namespace's pods and claims, and notes when each app's pod is first seen,
    its claim first seen, and the pod first bound."""

    def __init__(self, client: Client, claims: Client, namespace: str) -> None:
        self.bound_at: dict[str, float] = {}
        self.pod_at: dict[str, float] = {}
        self.claim_at: dict[str, float] = {}
        """By the claim's owner (a pod's name)."""
        self.pod_app: dict[str, str] = {}
        self._clients = (client, claims)
        self._namespace = namespace
        listing = client.list(Pod, namespace=namespace)
        for pod in listing:
            self._note(pod)
        version = listing.resourceVersion
        self._threads = [
            threading.Thread(target=self._run, args=(version,), daemon=True),
            threading.Thread(target=self._run_claims, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, version: str | None) -> None:
        try:
            for _, pod in self._clients[0].watch(
                Pod, namespace=self._namespace, resource_version=version
            ):
                self._note(pod)
        except Exception:  # the client closed under it: the watch is over
            return

    def _run_claims(self) -> None:
        try:
            for _, claim in self._clients[1].watch(ResourceClaim, namespace=self._namespace):
                for owner in (claim.metadata.ownerReferences or []) if claim.metadata else []:
                    self.claim_at.setdefault(owner.name, time.monotonic())
        except Exception:  # the client closed under it: the watch is over
            return

    def _note(self, pod: Pod) -> None:
        app = (pod.metadata.labels or {}).get("app") if pod.metadata else None
        if not app or pod.metadata is None:
            return
        now = time.monotonic()
        self.pod_app.setdefault(str(pod.metadata.name), app)
        self.pod_at.setdefault(app, now)
        if pod.spec is not None and pod.spec.nodeName:
            self.bound_at.setdefault(app, now)

    def claimed_at(self, app: str) -> float | None:
        """When the claim of ``app``'s pod was first seen."""
        seen = [t for pod, t in self.claim_at.items() if self.pod_app.get(pod) == app]
        return min(seen) if seen else None

    def close(self) -> None:
        for client in self._clients:
            client.close()


def phases(arrival: Arrival, watch: BindWatch) -> dict[str, float]:
    """Where a placed workload's time went, in milliseconds (``StormResult.phases_ms``);
    a phase whose end the watches missed is left out."""
    name = arrival.workload.name
    marks = [
        ("admit", arrival.answered),
        ("pod", watch.pod_at.get(name)),
        ("claim", watch.claimed_at(name)),
        ("bind", watch.bound_at.get(name)),
    ]
    out, last = {}, arrival.started
    for label, at in marks:
        if at is None:
            continue
        out[label] = max(at - last, 0.0) * 1000
        last = max(at, last)
    return out


def _scheduled_reason(pod: dict[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def _outcomes(
    client: Client, namespace: str, arrivals: Sequence[Arrival]
) -> tuple[dict[str, Outcome], dict[str, str]]:
    pods: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in client.list(Pod, namespace=namespace):
        found = pod.to_dict()
        pods[(found["metadata"].get("labels") or {}).get("app", "")].append(found)
    outcomes, reasons = {}, {}
    for a in arrivals:
        name = a.workload.name
        if a.denied is not None:
            outcomes[name] = "denied" if a.denied else "denied_without_reason"
            reasons[name] = a.denied
            continue
        mine = pods.get(name, [])
        unbound = [p for p in mine if not p["spec"].get("nodeName")]
        if mine and not unbound:
            outcomes[name] = "placed"
            continue
        why = [_scheduled_reason(p) for p in unbound]
        pending = bool(mine) and all(why)
        outcomes[name] = "pending" if pending else "pending_without_reason"
        reasons[name] = why[0] if why else "no pod yet"
    return outcomes, reasons


def _settle(
    client: Client, namespace: str, arrivals: Sequence[Arrival], timeout: float
) -> tuple[dict[str, Outcome], dict[str, str]]:
    """Polls until no workload is pending without a reason and two reads a second apart
    agree, or ``timeout`` passes (the last read is returned either way)."""
    deadline = time.monotonic() + timeout
    last: dict[str, Outcome] = {}
    while True:
        outcomes, reasons = _outcomes(client, namespace, arrivals)
        settled = "pending_without_reason" not in outcomes.values()
        if (settled and outcomes == last) or time.monotonic() > deadline:
            return outcomes, reasons
        last = outcomes
        time.sleep(1.0 if settled else 0.5)


def storm(
    new_client: Callable[[], Client],
    namespace: str,
    manifests: Sequence[tuple[Workload, dict[str, Any]]],
    *,
    threads: int = 16,
    timeout: float = 120.0,
) -> StormResult:
    """Creates every manifest at once from ``threads`` threads (a client each), then
    waits for each workload to settle."""
    watch = BindWatch(new_client(), new_client(), namespace)
    local = threading.local()
    clients: list[Client] = []

    def create(item: tuple[Workload, dict[str, Any]]) -> Arrival:
        if not hasattr(local, "client"):
            local.client = new_client()
            clients.append(local.client)
        return _create(local.client, *item)

    start = time.monotonic()
    try:
        with ThreadPoolExecutor(threads) as pool:
            arrivals = list(pool.map(create, manifests))
        with new_client() as client:
            outcomes, reasons = _settle(client, namespace, arrivals, timeout)
    finally:
        watch.close()
        for made in clients:
            made.close()
    seconds = time.monotonic() - start
    placed = [
        a
        for a in arrivals
        if outcomes[a.workload.name] == "placed" and a.workload.name in watch.bound_at
    ]
    bind_ms = {
        a.workload.name: (watch.bound_at[a.workload.name] - a.started) * 1000 for a in placed
    }
    phases_ms = {a.workload.name: phases(a, watch) for a in placed}
    pod_ms = {
        a.workload.name: (at - a.started) * 1000
        for a in arrivals
        if (at := watch.pod_at.get(a.workload.name)) is not None
    }
    return StormResult(arrivals, outcomes, reasons, bind_ms, seconds, phases_ms, pod_ms=pod_ms)


def _capacities(client: Client, f: Fleet) -> dict[tuple[str, str], DeviceBooks]:
    nodes = {name for name, _ in f.nodes}
    books = {}
    for found in client.list(ResourceSlice):
        slice_ = found.to_dict()
        if slice_["spec"].get("nodeName") not in nodes:
            continue
        pool = slice_["spec"]["pool"]["name"]
        for device in slice_["spec"]["devices"]:
            capacity = quantity_bytes(str(device["capacity"]["memory"]["value"]))
            books[(pool, device["name"])] = DeviceBooks(capacity)
    return books


def _requested(client: Client, namespace: str) -> dict[str, dict[str, int | None]]:
    """Per template, per request: its ``capacity.requests.memory`` bytes (None: none)."""
    found: dict[str, dict[str, int | None]] = {}
    for template in client.list(ResourceClaimTemplate, namespace=namespace):
        body = template.to_dict()
        per_request: dict[str, int | None] = {}
        for request in body["spec"]["spec"]["devices"]["requests"]:
            memory = ((request.get("exactly") or {}).get("capacity") or {}).get("requests", {})
            per_request[request["name"]] = (
                quantity_bytes(str(memory["memory"])) if "memory" in memory else None
            )
        found[body["metadata"]["name"]] = per_request
    return found


def _pod_templates(client: Client, namespace: str) -> dict[str, str]:
    """Pod name -> the name of its claim's template."""
    templates = {}
    for pod in client.list(Pod, namespace=namespace):
        body = pod.to_dict()
        for claim in body["spec"].get("resourceClaims") or []:
            if claim.get("resourceClaimTemplateName"):
                templates[body["metadata"]["name"]] = claim["resourceClaimTemplateName"]
    return templates


def audit(client: Client, f: Fleet) -> dict[tuple[str, str], DeviceBooks]:
    """Per device of the fleet: capacity, consumed capacity and predicted bytes of the
    claims allocated on it."""
    books = _capacities(client, f)
    requested = _requested(client, f.namespace)
    templates = _pod_templates(client, f.namespace)
    for found in client.list(ResourceClaim, namespace=f.namespace):
        claim = found.to_dict()
        owners: list[dict[str, str]] = claim["metadata"].get("ownerReferences") or [{}]
        owner = owners[0].get("name", "")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        per_request = requested.get(templates.get(owner, ""), {})
        for result in allocation["devices"]["results"]:
            device = books[(result["pool"], result["device"])]
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            device.consumed += quantity_bytes(str(consumed)) if consumed else device.capacity
            device.unreported += 0 if consumed else 1
            device.predicted += per_request.get(result["request"]) or 0
            device.claims.append(claim["metadata"]["name"])
            device.owners.append(owner)
    return books


def summary(result: StormResult, books: dict[tuple[str, str], DeviceBooks]) -> dict[str, Any]:
    """The storm's counts and the books' verdict, as plain values."""
    counts = Counter(result.outcomes.values())
    return {
        "workloads": len(result.arrivals),
        "placed": counts["placed"],
        "pending_with_reason": counts["pending"],
        "pending_without_reason": counts["pending_without_reason"],
        "denied_with_reason": counts["denied"],
        "denied_without_reason": counts["denied_without_reason"],
        "gpus": len(books),
        "gpus_used": sum(1 for b in books.values() if b.claims),
        "over_commits": sum(1 for b in books.values() if b.over_committed),
        "seconds": round(result.seconds, 1),
    }
