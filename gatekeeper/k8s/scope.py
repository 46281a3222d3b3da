"""Which namespaces the mutating webhook may create claim templates in: those its
configuration's namespace selector selects (issue 38 item 2; pure).

The apiserver sends the webhook a review only for an object in a namespace the
configuration's ``namespaceSelector`` selects (a configuration's webhook named in
gatekeeper's domain, ``*.vllm-gatekeeper.io``: the shipped one is
``claims.vllm-gatekeeper.io``; when several configurations name one, the namespaces any of
them selects, as the apiserver calls it for each). A review that reaches the webhook any other
way (posted to it directly, or by a second configuration under another webhook name) is
not the apiserver's to trust, so the webhook checks the same selector itself before it
writes anything (``api_scope.ApiNamespaceScope`` reads the configurations and the
namespace's labels). ``selects`` is Kubernetes' ``LabelSelector`` as the apiserver matches
it (``k8s.io/apimachinery/pkg/apis/meta/v1.LabelSelectorAsSelector``): every
``matchLabels`` pair, and every ``matchExpressions`` requirement (``In``, ``NotIn``,
``Exists``, ``DoesNotExist``); an empty or absent selector selects every namespace; an
operator it does not know selects none.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["hook_selectors", "selects"]


def _requirement(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values") or []
    if not isinstance(key, str):
        return False
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether the label ``selector`` selects an object with ``labels``."""
    if not selector:
        return True
    pairs = selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in pairs.items()):
        return False
    return all(_requirement(e, labels) for e in selector.get("matchExpressions") or [])


def hook_selectors(
    configurations: Iterable[Mapping[str, Any]], hook: str
) -> list[tuple[str, Mapping[str, Any] | None]]:
    """The namespace selector of each webhook whose name matches ``hook`` (a name, or a
    shell-style pattern: ``*.vllm-gatekeeper.io``, every webhook in gatekeeper's domain)
    in ``configurations`` (MutatingWebhookConfigurations as dicts), with its
    configuration's name."""
    out = []
    for config in configurations:
        name = str((config.get("metadata") or {}).get("name", ""))
        for webhook in config.get("webhooks") or []:
            if fnmatch.fnmatchcase(str(webhook.get("name", "")), hook):
                out.append((name, webhook.get("namespaceSelector")))
    return out
