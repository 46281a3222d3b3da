"""What marks gatekeeper's ResourceClaimTemplates, and when one was last used: read by the
webhook's template store (``gatekeeper.k8s.template_store``) and its sweep
(``gatekeeper.k8s.template_sweep``).

A template gatekeeper makes carries the label ``MANAGED``; a webhook that names an
existing one in a review writes ``USED_ANNOTATION`` (RFC 3339) when the last stamp is
older than its ``stamp_seconds``, so that every replica's sweep sees the use. ``contains``
compares a template as the apiserver stores it (defaults filled in) with the one asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gatekeeper.cluster.kube_time import epoch

__all__ = ["MANAGED", "USED_ANNOTATION", "contains", "used_at"]

MANAGED = {"app.kubernetes.io/managed-by": "gatekeeper"}
"""The label of the templates gatekeeper makes (``cluster.claims.claim_template``)."""
USED_ANNOTATION = "vllm-gatekeeper.io/used-at"
"""When a webhook last named the template in a review (RFC 3339)."""


def contains(stored: object, wanted: object, to_bytes: Callable[[str], int]) -> bool:
    """Whether ``stored`` (an object as the apiserver gives it back, defaults filled in)
    holds every field of ``wanted`` with the same value; quantities compared as bytes."""
    if isinstance(wanted, Mapping):
        return isinstance(stored, Mapping) and all(
            k in stored and contains(stored[k], v, to_bytes) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(wanted)
            and all(contains(a, b, to_bytes) for a, b in zip(stored, wanted, strict=True))
        )
    if stored == wanted:
        return True
    if isinstance(stored, str) and isinstance(wanted, str):
        try:
            return to_bytes(stored) == to_bytes(wanted)
        except ValueError:
            return False
    return False


def used_at(template: Mapping[str, Any]) -> float:
    """When ``template`` was last stamped used (``USED_ANNOTATION``), else created, as
    seconds since the epoch; 0 when neither can be read."""
    metadata = template.get("metadata") or {}
    stamps = [(metadata.get("annotations") or {}).get(USED_ANNOTATION),
              metadata.get("creationTimestamp")]  # fmt: skip
    seen = [epoch(s) for s in stamps if s]
    return max(seen, default=0.0)
