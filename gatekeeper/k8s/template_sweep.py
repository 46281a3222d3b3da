"""Template cleanup: gatekeeper's ResourceClaimTemplates that no workload names are deleted.

The mutating webhook creates a template before the object that names it exists (a
mutating webhook answers before the object is stored, and a new object has no uid to own
it by), so no owner reference can tie the two, and Kubernetes' garbage collector cannot
remove a template when its last workload goes. ``TemplateSweep`` does, in the webhook
process that owns the template store (``gatekeeper webhook --mutate``), every
``interval_seconds`` (setting ``webhook_template_sweep_seconds``; 0: never):

1. a template of gatekeeper's (label ``MANAGED``, as the store's watch holds them) is a
   candidate when it was neither created, nor stamped used (``USED_ANNOTATION``, which
   every replica writes when it names a template whose stamp is older than
   ``stamp_seconds``), nor used by this process within ``grace_seconds`` (setting
   ``webhook_template_grace_seconds``, default 1 h: the object a review named it for may
   not be stored yet, or a rollout may bring an old revision back);
2. in each namespace holding a candidate, every object that can name a template is read:
   Pods, ReplicaSets, Deployments, StatefulSets, DaemonSets, Jobs, CronJobs,
   ControllerRevisions (a StatefulSet's or DaemonSet's earlier revisions) and
   LeaderWorkerSets (where the API exists); a ``resourceClaimTemplateName`` anywhere in
   one of them keeps the template. A namespace where one of these reads fails keeps all
   its templates (logged);
3. the others are deleted with the resourceVersion seen as a precondition (a template
   stamped or changed since is kept), while the store holds its lock: no review names a
   template being deleted, and the next review that needs it creates it again.

RBAC: ``list`` on those kinds, ``delete`` and ``patch`` (the stamp) on
``resourceclaimtemplates``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx2
from lightkube import ApiError, Client
from lightkube.config.client_adapter import Client as HttpClient
from lightkube.config.client_adapter import ConnectionParams
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import (
    ControllerRevision,
    DaemonSet,
    Deployment,
    ReplicaSet,
    StatefulSet,
)
from lightkube.resources.batch_v1 import CronJob, Job
from lightkube.resources.core_v1 import Pod

from gatekeeper.k8s.template_stamps import used_at
from gatekeeper.k8s.template_store import ApiTemplateStore, template_key

__all__ = ["NAMING_KINDS", "TemplateSweep", "named_templates"]

log = logging.getLogger("gatekeeper.k8s.template_sweep")

_LEADER_WORKER_SET = create_namespaced_resource(
    "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets"
)
NAMING_KINDS: tuple[Any, ...] = (
    Pod, ReplicaSet, Deployment, StatefulSet, DaemonSet, Job, CronJob, ControllerRevision,
    _LEADER_WORKER_SET,
)  # fmt: skip
"""Every kind whose objects may name a ResourceClaimTemplate (in a pod spec or template,
or a revision of one)."""
_FAILURES = (ApiError, httpx2.HTTPError, OSError)


def named_templates(obj: object) -> Iterator[str]:
    """Every ``resourceClaimTemplateName`` anywhere in ``obj`` (an object as a dict)."""
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if key == "resourceClaimTemplateName" and isinstance(value, str):
                yield value
            else:
                yield from named_templates(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from named_templates(item)


class TemplateSweep:
    """Deletes the templates of ``store`` (started: its watch holds them) that no object
    names, once unused for ``grace_seconds``; ``start`` sweeps every ``interval_seconds``
    in a daemon thread. ``clock``: seconds since the epoch (the stamps' clock)."""

    def __init__(
        self,
        client: Client,
        store: ApiTemplateStore,
        *,
        grace_seconds: float = 3600.0,
        interval_seconds: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._store = store
        self._grace = grace_seconds
        self._interval = interval_seconds
        self._clock = clock
        self._stop = threading.Event()
        self.deleted = 0
        """Templates deleted since the start."""

    def start(self) -> TemplateSweep:
        threading.Thread(target=self._run, name="template-sweep", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sweep()
            except _FAILURES as e:  # the next pass tries again
                log.warning("template sweep: the apiserver failed (%s); trying again later", e)

    def sweep(self) -> list[tuple[str, str]]:
        """One pass: the (namespace, name) of each template deleted."""
        watch = self._store.watch
        if watch is None or not watch.synced:
            return []
        candidates: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for template in watch():
            if self._idle(template, self._store.last_used(template_key(template))):
                candidates[template_key(template)[0]].append(template)
        deleted: list[tuple[str, str]] = []
        if not candidates:
            return deleted
        params = ConnectionParams(timeout=httpx2.Timeout(10.0), trust_env=False)
        with HttpClient(self._client.config, params) as http:  # one connection a pass
            for namespace, templates in sorted(candidates.items()):
                named = self._named(namespace)
                if named is None:
                    continue
                deleted += [
                    template_key(t)
                    for t in templates
                    if template_key(t)[1] not in named and self._delete(t, http)
                ]
        self.deleted += len(deleted)
        return deleted

    def _idle(self, template: Mapping[str, Any], mine: float | None) -> bool:
        """Unused (created, stamped, or named by this process: ``mine``) for
        ``grace_seconds``."""
        return self._clock() - max(used_at(template), mine or 0.0) >= self._grace

    def _named(self, namespace: str) -> set[str] | None:
        """The template names the namespace's objects give; None when one kind cannot be
        read (the namespace's templates are all kept)."""
        named: set[str] = set()
        for kind in NAMING_KINDS:
            try:
                for obj in self._client.list(kind, namespace=namespace):
                    named.update(named_templates(obj.to_dict()))
            except ApiError as e:
                if e.status.code == 404 and kind is _LEADER_WORKER_SET:
                    continue  # no LeaderWorkerSet API in this cluster
                log.warning(
                    "template sweep: cannot list %s in %s (%s); its templates are kept",
                    kind.__name__, namespace, e.status.message,
                )  # fmt: skip
                return None
            except httpx2.HTTPStatusError as e:
                if e.response.status_code == 404 and kind is _LEADER_WORKER_SET:
                    continue  # no such API group: a plain 404, not a Status
                log.warning(
                    "template sweep: cannot list %s in %s (%s)", kind.__name__, namespace, e
                )
                return None
            except (httpx2.HTTPError, OSError) as e:
                log.warning(
                    "template sweep: cannot list %s in %s (%s)", kind.__name__, namespace, e
                )
                return None
        return named

    def _delete(self, template: Mapping[str, Any], http: httpx2.Client) -> bool:
        """Deletes ``template`` unless it was used meanwhile or changed since it was read;
        True when it is gone."""
        key = template_key(template)
        version = str((template.get("metadata") or {}).get("resourceVersion") or "")

        def delete(mine: float | None) -> bool:
            if not self._idle(template, mine):
                return False
            return self._delete_at(key, version, http)

        return self._store.deleting(key, delete)

    def _delete_at(self, key: tuple[str, str], version: str, http: httpx2.Client) -> bool:
        """A DELETE with the resourceVersion as a precondition (lightkube's ``delete``
        takes none)."""
        namespace, name = key
        url = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{name}"
        body = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if version:
            body["preconditions"] = {"resourceVersion": version}  # type: ignore[assignment]
        answer = http.request("DELETE", url, json=body)
        if answer.status_code in (200, 202):
            log.info("template sweep: deleted ResourceClaimTemplate %s/%s (no workload names it)",
                     namespace, name)  # fmt: skip
            return True
        if answer.status_code not in (404, 409):  # gone already, or changed: kept
            log.warning("template sweep: deleting %s/%s: %s %s", namespace, name,
                        answer.status_code, answer.text[:300])  # fmt: skip
        return False
