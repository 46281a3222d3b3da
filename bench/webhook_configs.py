"""The shipped webhook configurations, as the cluster tests and ``bench.cluster`` point
them at a webhook on loopback: one rewrite for every module that registers them with the
real apiserver.

``shipped_configuration`` reads a configuration from ``deploy/kubernetes`` (its rules as
shipped) and gives it a name of the test's, its ``clientConfig`` as a URL (the base URL
and the shipped service path) with the webhook's CA, a namespace selector narrowed to
the test's namespace (so that no other module's objects reach it), the failure policy
under test and, if given, a timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["DEPLOY", "MUTATING", "VALIDATING", "shipped_configuration"]

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
VALIDATING = DEPLOY / "validatingwebhookconfiguration.yaml"
MUTATING = DEPLOY / "components" / "cluster" / "mutatingwebhookconfiguration.yaml"


def shipped_configuration(
    path: Path,
    url: str,
    ca_bundle: str,
    namespace: str,
    policy: str,
    timeout_seconds: int | None = None,
) -> dict[str, Any]:
    """The configuration at ``path``, named ``<namespace>-<its name>``, calling ``url`` +
    its service's path for ``namespace`` only, with ``policy`` (and ``timeout_seconds``)."""
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    config["metadata"] = {"name": f"{namespace}-{config['metadata']['name']}"}
    (hook,) = config["webhooks"]
    service_path = hook["clientConfig"]["service"]["path"]
    hook["clientConfig"] = {"url": url + service_path, "caBundle": ca_bundle}
    hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    hook["failurePolicy"] = policy
    if timeout_seconds is not None:
        hook["timeoutSeconds"] = timeout_seconds
    return config
