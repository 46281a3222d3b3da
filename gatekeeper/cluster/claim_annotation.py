"""The record the mutating webhook leaves on a pod template, written and read (pure).

``CLAIM_ANNOTATION`` (``vllm-gatekeeper.io/claim``) holds JSON: per vLLM container name,
what the webhook wrote for it (``entry``):

=======================  ===============================================================
``mode``                 the claims mode (``gatekeeper``, ``nvidia-dra``, ``hami``)
``template``             the ResourceClaimTemplate's name (none in ``hami`` mode)
``ranks``                devices the container claims, one per rank
``memoryBytes``          each rank's request (``RankSizing.request_bytes``)
``kvCacheMemoryBytes``   the ``--kv-cache-memory-bytes`` written
``gpuMemoryUtilization`` the ``--gpu-memory-utilization`` written
``components``           per component name (``gatekeeper.estimator.components``), the
                         bytes of the rank the claim was sized from; they add up to
                         ``memoryBytes`` less the CUDA context and the 1 MiB rounding.
                         Absent from records written before it was recorded.
=======================  ===============================================================

A pod made from the template carries the annotation, so the node agent reads a pod's
predicted components here (``claim_components``). The webhook reads the record back to
leave a template it already mutated alone (``gatekeeper.k8s.claim_record.intact``), and
the validating webhook the ranks (``gatekeeper.k8s.workloads``).

Example: ``{"vllm": {"mode": "gatekeeper", "template": "vllm-gpus-0123456789abcdef",
"ranks": 1, "memoryBytes": 22993174528, "kvCacheMemoryBytes": 3759013888,
"gpuMemoryUtilization": 0.1172, "components": {"weights": 15231233024, ...}}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.cluster.claims import ClaimsMode, RankSizing
from gatekeeper.cluster.reserves import claim_users
from gatekeeper.estimator.components import MEMORY_COMPONENTS, ComponentName, by_field

__all__ = [
    "ANNOTATION_PREFIX",
    "CLAIM_ANNOTATION",
    "RecordEntry",
    "claim_components",
    "entry",
    "read_record",
]

ANNOTATION_PREFIX = "vllm-gatekeeper.io/"
"""gatekeeper's annotations and labels. Not ``gatekeeper.io/``: OPA Gatekeeper, the most
installed admission controller, owns the ``gatekeeper`` names in a cluster
(``gatekeeper-system``, ``*.gatekeeper.sh``), and an operator reading
``gatekeeper.io/skip`` would take it for OPA's."""
CLAIM_ANNOTATION = f"{ANNOTATION_PREFIX}claim"
"""Written by the mutating webhook on a pod template it sized: the record above."""


@dataclass(frozen=True, slots=True)
class RecordEntry:
    """One container's entry, read back; None where the entry has no such key."""

    mode: str | None
    template: str | None
    ranks: int | None
    memory_bytes: int | None
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float | None
    components: Mapping[ComponentName, int] = field(default_factory=dict)
    """Empty in a record written before the components were recorded."""


def entry(template: str | None, sizing: RankSizing, mode: ClaimsMode) -> dict[str, Any]:
    """One container's entry as JSON (``template`` None: HAMi's resources stand for it)."""
    where = {"template": template} if template is not None else {}
    predicted = by_field(sizing.predicted.to_json()) if sizing.predicted else {}
    return {
        "mode": mode,
        **where,
        "ranks": sizing.ranks,
        "memoryBytes": sizing.request_bytes,
        "kvCacheMemoryBytes": sizing.kv_cache_memory_bytes,
        "gpuMemoryUtilization": sizing.gpu_memory_utilization,
        **({"components": predicted} if predicted else {}),
    }


def read_record(annotations: Mapping[str, str]) -> dict[str, RecordEntry]:
    """The record in ``annotations`` by container name; empty when there is none or it is
    not a JSON object. An entry with a key of the wrong type is left out (it reads as not
    written by gatekeeper); components that do not read as bytes are left out."""
    try:
        record = json.loads(annotations.get(CLAIM_ANNOTATION, "null"))
    except ValueError:
        return {}
    if not isinstance(record, dict):
        return {}
    read = {name: _entry(value) for name, value in record.items()}
    return {name: e for name, e in read.items() if e is not None}


class _Unread(ValueError):
    """A key of an entry holds a value of the wrong type."""


def _entry(value: object) -> RecordEntry | None:
    if not isinstance(value, dict):
        return None
    components = value.get("components")
    try:
        return RecordEntry(
            mode=_str(value, "mode"),
            template=_str(value, "template"),
            ranks=_int(value, "ranks"),
            memory_bytes=_int(value, "memoryBytes"),
            kv_cache_memory_bytes=_int(value, "kvCacheMemoryBytes"),
            gpu_memory_utilization=_fraction(value, "gpuMemoryUtilization"),
            components=_components(components) if isinstance(components, dict) else {},
        )
    except _Unread:
        return None


def _str(value: Mapping[str, Any], key: str) -> str | None:
    found = value.get(key)
    if found is None or isinstance(found, str):
        return found
    raise _Unread(key)


def _int(value: Mapping[str, Any], key: str) -> int | None:
    found = value.get(key)
    if found is None or (isinstance(found, int) and not isinstance(found, bool)):
        return found
    raise _Unread(key)


def _fraction(value: Mapping[str, Any], key: str) -> float | None:
    found = value.get(key)
    if found is None or isinstance(found, float):
        return found
    if isinstance(found, int) and not isinstance(found, bool):
        return float(found)
    raise _Unread(key)


def _components(raw: Mapping[str, Any]) -> dict[ComponentName, int]:
    """The recorded components keyed by name, as ``by_field`` reads fields."""
    as_fields = {c.field: raw[c.name] for c in MEMORY_COMPONENTS if c.name in raw}
    return {name: v for name, v in by_field(as_fields).items() if v >= 0}


def claim_components(pod: Mapping[str, Any], claim: str) -> dict[ComponentName, int]:
    """The components recorded for the one vLLM container of ``pod`` (an API dict) that
    uses the ResourceClaim named ``claim``; empty when the pod has no record, when no
    container with recorded components uses the claim, or when several do (the webhook
    gives each container a claim of its own)."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    record = read_record(annotations) if isinstance(annotations, Mapping) else {}
    if not record:
        return {}
    users, _ = claim_users(pod, claim)
    found = [record[u.container].components for u in users if u.container in record]
    recorded = [c for c in found if c]
    return dict(recorded[0]) if len(recorded) == 1 else {}
