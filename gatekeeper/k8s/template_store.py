"""The mutating webhook's one edge to the apiserver: create and read ResourceClaimTemplates,
and read which namespaces it may create them in.

A mutating webhook answers with a patch of the object under review and cannot add a
second object to its answer, so the template its patch names is created here, through the
API, before the answer goes back (``sideEffects: NoneOnDryRun``: never on a dry run). The
name is a hash of the template's spec, so a second create of the same spec finds it there
(409 AlreadyExists) and is done. ``ApiNamespaceScope`` reads the MutatingWebhookConfigurations
and a namespace's labels, so that templates are created only where the configuration's
namespace selector lets the apiserver send reviews (``gatekeeper.k8s.scope``). Uses
lightkube (the ``cluster`` extra); imported only by ``gatekeeper webhook --mutate``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.resource_v1 import ResourceClaimTemplate

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.errors import GatekeeperError
from gatekeeper.k8s.scope import hook_selectors, selects

__all__ = ["ApiNamespaceScope", "ApiTemplateStore"]

T = TypeVar("T")


class ApiTemplateStore:
    """``TemplateStore`` on a lightkube ``Client``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def ensure(self, template: Mapping[str, Any]) -> None:
        metadata = template["metadata"]
        where = f"ResourceClaimTemplate {metadata['namespace']}/{metadata['name']}"
        try:
            self._client.create(from_dict(dict(template)))
        except ApiError as e:
            if e.status.code == 409:  # the same spec, created before: same name, same object
                return
            raise GatekeeperError(
                f"{where}: the apiserver refused it ({e.status.code}: {e.status.message}); the "
                "workload is denied rather than admitted with a claim nobody can satisfy. Give "
                "the webhook's ServiceAccount create on resourceclaimtemplates, then apply again",
                field="resourceclaimtemplates",
                value=metadata["name"],
            ) from e
        except (httpx2.HTTPError, OSError) as e:  # lightkube talks through httpx2
            raise GatekeeperError(
                f"{where}: the apiserver cannot be reached ({type(e).__name__}: {e}); the "
                "workload is denied rather than admitted with a claim nobody can satisfy; "
                "apply it again",
                field="resourceclaimtemplates",
                value=metadata["name"],
            ) from e

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
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
        out: dict[str, Any] = found.to_dict()
        return out

    def to_bytes(self, quantity: str) -> int:
        return quantity_bytes(quantity)


class ApiNamespaceScope:
    """``NamespaceScope`` on a lightkube ``Client``: the namespace selector of every webhook
    whose name matches ``hook`` (a name or a pattern: ``scope.hook_selectors``) in the
    MutatingWebhookConfigurations, and the namespace's labels, each
    read again after ``refresh_seconds``. A namespace none selects is read again at once
    (at most once a second: the configuration, or the namespace's labels, may have just
    changed) before it is called excluded."""

    def __init__(
        self,
        client: Client,
        hook: str,
        refresh_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self.hook = hook
        self._refresh = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._selectors: tuple[float, list[tuple[str, Mapping[str, Any] | None]]] | None = None
        self._labels: dict[str, tuple[float, dict[str, str] | None]] = {}
        self._reread = -1.0

    def excluded(self, namespace: str) -> str | None:
        """Why templates are not created in ``namespace`` (None: they may be);
        ``GatekeeperError`` when the configurations or the namespace cannot be read."""
        why = self._why(namespace, fresh=False)
        if why is not None:
            with self._lock:
                now = self._clock()
                again, self._reread = now - self._reread >= 1.0, now
            if again:
                why = self._why(namespace, fresh=True)
        return why

    def _why(self, namespace: str, fresh: bool) -> str | None:
        selectors = self._hook_selectors(fresh)
        if not selectors:
            return (
                f"no MutatingWebhookConfiguration has a webhook named {self.hook}, so the "
                "apiserver sends this webhook no review; nothing is created (set "
                "GATEKEEPER_WEBHOOK_MUTATING_NAME to the name the configuration gives it)"
            )
        labels = self._namespace_labels(namespace, fresh)
        if labels is None:
            return f"namespace {namespace} does not exist; nothing is created"
        if any(selects(selector, labels) for _, selector in selectors):
            return None
        names = ", ".join(sorted({name for name, _ in selectors}))
        return (
            f"namespace {namespace} is not selected by the namespaceSelector of webhook "
            f"{self.hook} (MutatingWebhookConfiguration {names}), so the apiserver sends no "
            "review of it here; nothing is created"
        )

    def _hook_selectors(self, fresh: bool) -> list[tuple[str, Mapping[str, Any] | None]]:
        now = self._clock()
        cached = self._selectors
        if cached is not None and not fresh and now - cached[0] < self._refresh:
            return cached[1]
        listed = self._read(
            "mutatingwebhookconfigurations", "list",
            lambda: [c.to_dict() for c in self._client.list(MutatingWebhookConfiguration)],
        )  # fmt: skip
        found = hook_selectors(listed, self.hook)
        self._selectors = (now, found)
        return found

    def _namespace_labels(self, namespace: str, fresh: bool) -> dict[str, str] | None:
        now = self._clock()
        cached = self._labels.get(namespace)
        if cached is not None and not fresh and now - cached[0] < self._refresh:
            return cached[1]

        def read() -> dict[str, str] | None:
            try:
                found = self._client.get(Namespace, namespace).to_dict()
            except ApiError as e:
                if e.status.code == 404:
                    return None
                raise
            given = (found.get("metadata") or {}).get("labels") or {}
            return {str(k): str(v) for k, v in given.items()}

        labels = self._read("namespaces", "get", read)
        with self._lock:
            if len(self._labels) >= 4096:
                self._labels.clear()
            self._labels[namespace] = (now, labels)
        return labels

    def _read(self, resource: str, verb: str, read: Callable[[], T]) -> T:
        try:
            return read()
        except ApiError as e:
            raise GatekeeperError(
                f"the webhook cannot tell which namespaces its configuration selects: the "
                f"apiserver refused to {verb} {resource} ({e.status.code}: {e.status.message}); "
                f"give the webhook's ServiceAccount {verb} on {resource}. The workload is "
                "denied rather than given a claim template in a namespace it may not write to",
                field=resource,
                value=verb,
            ) from e
        except (httpx2.HTTPError, OSError) as e:
            raise GatekeeperError(
                f"the webhook cannot tell which namespaces its configuration selects: the "
                f"apiserver cannot be reached ({type(e).__name__}: {e}); apply it again",
                field=resource,
                value=verb,
            ) from e
