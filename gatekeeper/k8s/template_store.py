"""The mutating webhook's store of ResourceClaimTemplates: create and read them, with
as few apiserver round trips on a review's path as can be.

A mutating webhook answers with a patch of the object under review and cannot add a
second object to its answer, so the template its patch names is created here, through the
API, before the answer goes back (``sideEffects: NoneOnDryRun``: never on a dry run). The
name is a hash of the template's spec, so a second create of the same spec finds it there
(409 AlreadyExists), reads it and checks that it holds that spec. Started, the store
lists and watches gatekeeper's templates (label ``MANAGED``; ``ClaimsWatch``, an
informer): a template the watch holds is ensured or read with no API call, and
concurrent reviews that need the same new template wait for one create. The namespaces
it may create them in: ``gatekeeper.k8s.api_scope``; deleting those no workload names:
``gatekeeper.k8s.template_sweep``. Uses lightkube (the ``cluster`` extra); imported only
by ``gatekeeper webhook --mutate``. RBAC: ``resourceclaimtemplates`` get, list, watch,
create and patch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx2
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaimTemplate
from lightkube.types import PatchType

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.cluster.claims_watch import ClaimsWatch
from gatekeeper.cluster.kube_time import rfc3339
from gatekeeper.errors import GatekeeperError
from gatekeeper.k8s.template_stamps import MANAGED, USED_ANNOTATION, contains, used_at

__all__ = ["MADE_SECONDS", "ApiTemplateStore", "template_key"]

API_VERSION = "resource.k8s.io/v1"
MADE_SECONDS = 5.0
"""How long a template this store created is taken as there before the watch shows it."""
_UNREACHABLE = (httpx2.HTTPError, OSError)


class _Flight:
    """One create in flight: the reviews that need the same template wait for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: GatekeeperError | None = None


def template_key(template: Mapping[str, Any]) -> tuple[str, str]:
    """A ResourceClaimTemplate's namespace and name."""
    metadata = template["metadata"]
    return str(metadata.get("namespace") or ""), str(metadata["name"])


class ApiTemplateStore:
    """``TemplateStore`` on a lightkube ``Client``. Once ``start`` is called, gatekeeper's
    templates (label ``MANAGED``) are listed and watched (``ClaimsWatch``, an informer),
    and an ``ensure`` or ``read`` of one the watch holds makes no API call; a create is
    made once per template at a time (reviews that need the same one wait for it), an
    existing one (409) is read and must hold the spec; a template used after
    ``stamp_seconds`` since its last stamp gets ``USED_ANNOTATION`` written (one patch),
    so that ``TemplateSweep`` in any replica sees the use. Without ``start`` every call
    reaches the apiserver. ``observe(phase, seconds)``: each ensure's time."""

    def __init__(
        self,
        client: Client,
        *,
        stamp_seconds: float = 900.0,
        observe: Callable[[str, float], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._stamp_seconds = stamp_seconds
        self._observe = observe
        self._clock = clock
        self._lock = threading.Lock()
        self._flights: dict[tuple[str, str], _Flight] = {}
        self._made: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._used: dict[tuple[str, str], float] = {}
        self._stamped: dict[tuple[str, str], float] = {}
        self._gone: dict[tuple[str, str], float] = {}
        self.watch: ClaimsWatch | None = None
        self.api_calls = 0
        """Creates, reads and stamps sent to the apiserver (for tests and the bench)."""

    def start(self) -> ApiTemplateStore:
        """Lists and watches gatekeeper's templates from now on (a daemon thread)."""
        self.watch = ClaimsWatch(
            self._client, resource=ResourceClaimTemplate, labels=MANAGED, key=template_key,
            name="claim templates",
        ).start()  # fmt: skip
        return self

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def last_used(self, key: tuple[str, str]) -> float | None:
        """When this store last ensured or read ``key`` (its clock), None if never."""
        with self._lock:
            return self._used.get(key)

    def forget(self, key: tuple[str, str]) -> None:
        """Drops ``key`` from what this store made (it was deleted)."""
        with self._lock:
            self._made.pop(key, None)

    def deleting(self, key: tuple[str, str], delete: Callable[[float | None], bool]) -> bool:
        """Runs ``delete`` (``TemplateSweep``'s, given ``last_used(key)``) under the lock
        reviews look templates up with, so that none names ``key`` while it is deleted;
        once deleted, reviews take it as absent (and create it again) even before the
        watch shows the deletion."""
        with self._lock:
            gone = delete(self._used.get(key))
            if gone:
                self._made.pop(key, None)
                self._gone[key] = time.monotonic()
            return gone

    def ensure(self, template: Mapping[str, Any]) -> None:
        started = time.monotonic()
        try:
            self._ensure(template)
        finally:
            if self._observe is not None:
                self._observe("templates", time.monotonic() - started)

    def _ensure(self, template: Mapping[str, Any]) -> None:
        key = template_key(template)
        with self._lock:
            self._note_use(key)
            known = self._known(key)
            flight = self._flights.get(key) if known is None else None
            leader = known is None and flight is None
            if leader:
                flight = self._flights[key] = _Flight()
        if known is not None:
            self._check(template, known)
            self._stamp_if_stale(key, known)
            return
        assert flight is not None
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return
        try:
            found = self._create(template)
            self._check(template, found)
            with self._lock:
                self._made[key] = (time.monotonic(), found)
                self._gone.pop(key, None)
        except GatekeeperError as e:
            flight.error = e
            raise
        finally:
            with self._lock:
                self._flights.pop(key, None)
            flight.done.set()

    def _note_use(self, key: tuple[str, str]) -> None:
        if len(self._used) >= 65536:
            self._used.clear()
        self._used[key] = self._clock()

    def _known(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The template as the watch holds it, or as this store made it moments ago
        (before the watch shows it); None: ask the apiserver. Called under the lock."""
        found = self.watch.get(key) if self.watch is not None else None
        gone = self._gone.get(key)
        if gone is not None and (found is None or time.monotonic() - gone >= MADE_SECONDS):
            del self._gone[key]  # the watch has shown the deletion (or long since should)
        elif gone is not None:
            found = None  # deleted here; the watch does not show it yet
        if found is not None:
            return found
        made = self._made.get(key)
        if made is not None and time.monotonic() - made[0] < MADE_SECONDS:
            return made[1]
        self._made.pop(key, None)
        return None

    def _create(self, template: Mapping[str, Any]) -> dict[str, Any]:
        """The template created, or the one already there (409)."""
        namespace, name = template_key(template)
        self.api_calls += 1
        try:
            created: Any = self._client.create(from_dict(dict(template)))
            out: dict[str, Any] = created.to_dict()
            return out
        except ApiError as e:
            if e.status.code != 409:  # else: the same name made before, read below
                raise _refused(namespace, name, "create", e) from e
        except _UNREACHABLE as e:  # lightkube talks through httpx2
            raise _unreachable(namespace, name, e) from e
        found = self.read(namespace, name)
        if found is None:  # deleted between the two calls: the next review creates it
            raise GatekeeperError(
                f"ResourceClaimTemplate {namespace}/{name} was deleted as it was created; "
                "apply the workload again",
                field="resourceclaimtemplates",
                value=name,
            )
        return dict(found)

    def _check(self, template: Mapping[str, Any], found: Mapping[str, Any]) -> None:
        """The stored template holds what ``template`` asks (its name is the hash of its
        spec, so another spec under it was written by someone else)."""
        if contains(found.get("spec"), template.get("spec"), self.to_bytes):
            return
        namespace, name = template_key(template)
        raise GatekeeperError(
            f"ResourceClaimTemplate {namespace}/{name} exists with another spec than the one "
            "its name stands for (gatekeeper names a template by the hash of its spec); the "
            "workload is denied rather than given a claim of other devices. Delete that "
            "template, then apply again",
            field="resourceclaimtemplates",
            value=name,
        )

    def _stamp_if_stale(self, key: tuple[str, str], found: Mapping[str, Any]) -> None:
        """Writes ``USED_ANNOTATION`` when the template's stamp (or creation) is older
        than ``stamp_seconds``: every replica's sweep then sees this use."""
        now = self._clock()
        last = max(used_at(found), self._stamped.get(key, 0.0))
        if self.watch is None or now - last < self._stamp_seconds:
            return
        self._stamped[key] = now
        namespace, name = key
        stamp = {"metadata": {"annotations": {USED_ANNOTATION: rfc3339(self._clock())}}}
        self.api_calls += 1
        try:
            self._client.patch(
                ResourceClaimTemplate, name, stamp, namespace=namespace,
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        except ApiError as e:
            if e.status.code != 404:
                raise _refused(namespace, name, "patch", e) from e
            self.forget(key)  # deleted under it: made again now
            self._ensure_created(key, found)
        except _UNREACHABLE as e:
            raise _unreachable(namespace, name, e) from e

    def _ensure_created(self, key: tuple[str, str], found: Mapping[str, Any]) -> None:
        namespace, name = key
        labels = dict((found.get("metadata") or {}).get("labels") or MANAGED)
        metadata = {"name": name, "namespace": namespace, "labels": labels}
        again = {"apiVersion": API_VERSION, "kind": "ResourceClaimTemplate", "metadata": metadata,
                 "spec": found.get("spec") or {}}  # fmt: skip
        made = self._create(again)
        with self._lock:
            self._made[key] = (time.monotonic(), made)
            self._gone.pop(key, None)

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        with self._lock:
            self._note_use((namespace, name))
            known = self._known((namespace, name))
        if known is not None:
            return known
        self.api_calls += 1
        try:
            found = self._client.get(ResourceClaimTemplate, name, namespace=namespace)
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise GatekeeperError(
                f"ResourceClaimTemplate {namespace}/{name}: cannot read it ({e.status.code}: "
                f"{e.status.message}); give the webhook's ServiceAccount get on "
                "resourceclaimtemplates",
                field="resourceclaimtemplates",
                value=name,
            ) from e
        except _UNREACHABLE as e:
            raise _unreachable(namespace, name, e) from e
        out: dict[str, Any] = found.to_dict()
        return out

    def to_bytes(self, quantity: str) -> int:
        return quantity_bytes(quantity)


def _refused(namespace: str, name: str, verb: str, e: ApiError) -> GatekeeperError:
    return GatekeeperError(
        f"ResourceClaimTemplate {namespace}/{name}: the apiserver refused to {verb} it "
        f"({e.status.code}: {e.status.message}); the workload is denied rather than admitted "
        f"with a claim nobody can satisfy. Give the webhook's ServiceAccount {verb} on "
        "resourceclaimtemplates, then apply again",
        field="resourceclaimtemplates",
        value=name,
    )


def _unreachable(namespace: str, name: str, e: Exception) -> GatekeeperError:
    return GatekeeperError(
        f"ResourceClaimTemplate {namespace}/{name}: the apiserver cannot be reached "
        f"({type(e).__name__}: {e}); the workload is denied rather than admitted with a "
        "claim nobody can satisfy; apply it again",
        field="resourceclaimtemplates",
        value=name,
    )
