"""Which namespaces the mutating webhook may create claim templates in, read through the
apiserver: the namespace selector of its MutatingWebhookConfigurations and a namespace's
labels (``gatekeeper.k8s.scope`` matches them), so that templates are created only where
the configuration lets the apiserver send reviews. Uses lightkube (the ``cluster``
extra); imported only by ``gatekeeper webhook --mutate``. RBAC:
``mutatingwebhookconfigurations`` list, ``namespaces`` get.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, Client
from lightkube.resources.admissionregistration_v1 import MutatingWebhookConfiguration
from lightkube.resources.core_v1 import Namespace

from gatekeeper.errors import GatekeeperError
from gatekeeper.k8s.revalidating import Revalidating
from gatekeeper.k8s.scope import hook_selectors, selects

__all__ = ["ApiNamespaceScope"]

T = TypeVar("T")


class ApiNamespaceScope:
    """``NamespaceScope`` on a lightkube ``Client``: the namespace selector of every webhook
    whose name matches ``hook`` (a name or a pattern: ``scope.hook_selectors``) in the
    MutatingWebhookConfigurations, and the namespace's labels, each read once and then
    refreshed in the background when older than ``refresh_seconds`` (``Revalidating``: no
    review waits on a refresh; the reviews arriving before the first read wait for that
    one read). A namespace none selects is read again at once (at most once a second:
    the configuration, or the namespace's labels, may have just changed) before it is
    called excluded. ``observe(phase, seconds)``: each check's time, as ``scope``."""

    def __init__(
        self,
        client: Client,
        hook: str,
        refresh_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self._client = client
        self._observe = observe
        self.hook = hook
        self._refresh = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._selectors = Revalidating(
            self._read_selectors, refresh_seconds, clock=clock, name="webhook: the configurations"
        )
        self._labels: dict[str, Revalidating[dict[str, str] | None]] = {}
        self._reread = -1.0

    def excluded(self, namespace: str) -> str | None:
        """Why templates are not created in ``namespace`` (None: they may be);
        ``GatekeeperError`` when the configurations or the namespace cannot be read."""
        started = time.monotonic()
        try:
            return self._excluded(namespace)
        finally:
            if self._observe is not None:
                self._observe("scope", time.monotonic() - started)

    def _excluded(self, namespace: str) -> str | None:
        why = self._why(namespace, fresh=False)
        if why is not None:
            with self._lock:
                now = self._clock()
                again = now - self._reread >= 1.0
                if again:  # else one re-read less than a second ago answered it
                    self._reread = now
            if again:
                why = self._why(namespace, fresh=True)
        return why

    def _why(self, namespace: str, fresh: bool) -> str | None:
        selectors = self._selectors.fresh() if fresh else self._selectors()
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

    def _read_selectors(self) -> list[tuple[str, Mapping[str, Any] | None]]:
        listed = self._read(
            "mutatingwebhookconfigurations", "list",
            lambda: [c.to_dict() for c in self._client.list(MutatingWebhookConfiguration)],
        )  # fmt: skip
        return hook_selectors(listed, self.hook)

    def _namespace_labels(self, namespace: str, fresh: bool) -> dict[str, str] | None:
        with self._lock:
            reading = self._labels.get(namespace)
            if reading is None:
                if len(self._labels) >= 4096:
                    self._labels.clear()
                reading = self._labels[namespace] = Revalidating(
                    lambda: self._read_labels(namespace), self._refresh, clock=self._clock,
                    name=f"webhook: namespace {namespace}",
                )  # fmt: skip
        return reading.fresh() if fresh else reading()

    def _read_labels(self, namespace: str) -> dict[str, str] | None:
        def read() -> dict[str, str] | None:
            try:
                found = self._client.get(Namespace, namespace).to_dict()
            except ApiError as e:
                if e.status.code == 404:
                    return None
                raise
            given = (found.get("metadata") or {}).get("labels") or {}
            return {str(k): str(v) for k, v in given.items()}

        return self._read("namespaces", "get", read)

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
