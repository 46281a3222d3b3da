"""The mutating webhook's one edge to the apiserver: create and read ResourceClaimTemplates.

A mutating webhook answers with a patch of the object under review and cannot add a
second object to its answer, so the template its patch names is created here, through the
API, before the answer goes back (``sideEffects: NoneOnDryRun``: never on a dry run). The
name is a hash of the template's spec, so a second create of the same spec finds it there
(409 AlreadyExists) and is done. Uses lightkube (the ``cluster`` extra); imported only by
``gatekeeper webhook --mutate``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx2
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.resources.resource_v1 import ResourceClaimTemplate

from gatekeeper.cluster.agent import quantity_bytes
from gatekeeper.errors import GatekeeperError

__all__ = ["ApiTemplateStore"]


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
