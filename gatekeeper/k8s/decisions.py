"""What the webhooks say of each decision they make on a vLLM workload: one line in the log
(``gatekeeper.decisions``), and the estimate as the response's ``auditAnnotations``
(issue 39 item 2; ``docs/kubernetes.md``).

``Sizing`` is how one container was sized: the bytes its most loaded rank needs, its ranks,
and the KV cache's sequences of ``max_model_len`` tokens. The validating webhook's
``fit.judge`` attaches it to its findings; the mutating webhook takes it from the claim
it sizes (``RankSizing``). ``Judged`` is one vLLM container as a webhook judged it.

``decision_fields`` are the line's fields: ``webhook`` (validating, mutating), ``verdict``
(the outcome), ``kind``, ``namespace``, ``name`` (the workload), per container
``container``, ``model``, ``gpu``, ``bytes_per_rank``, ``ranks``, ``max_model_len``,
``sequences`` (several containers: lists, in order), and ``reason`` (the denial, else the
warnings). ``audit_annotations`` are the response's annotations (the apiserver records them
in its audit log under ``<webhook name>/<key>``): ``verdict``, ``model``,
``estimate-bytes-per-rank``, ``ranks``, ``sized-for`` ("8 sequences of 8192 tokens"),
``gpu``; for several containers each value is ``<container>=<value>`` joined by ``, ``.
Keys are qualified names of at most 63 bytes, values strings, as the apiserver takes them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gatekeeper.cluster.decision_log import decisions
from gatekeeper.placement.sizing import sized_for

if TYPE_CHECKING:
    from gatekeeper.k8s.review import AdmissionRequest

__all__ = [
    "Judged",
    "Sizing",
    "audit_annotations",
    "decision_fields",
    "log_decision",
    "said",
    "workload",
]


_MAX_REASON_CHARS = 4096
"""A reason longer than this (a pod of many containers) is cut, saying so."""


@dataclass(frozen=True, slots=True)
class Sizing:
    """How one vLLM container was sized."""

    rank_bytes: int
    """The most loaded rank's bytes: what the GPU must hold (validating), what a rank's
    claim asks (mutating)."""
    ranks: int
    """GPUs the engine takes in the pod (TP x PP x DP, or the pod's share of a group)."""
    max_model_len: int
    sequences: int
    """Sequences of ``max_model_len`` the KV cache in ``rank_bytes`` holds."""
    gpu: str
    """The GPU it was sized on (a product, or a size)."""

    @property
    def sized_for(self) -> str:
        """``8 sequences of 8192 tokens``: placement's wording (``placement.sizing``)."""
        return sized_for(self.sequences, self.max_model_len).removeprefix("sized for ")


@dataclass(frozen=True, slots=True)
class Judged:
    """One vLLM container as a webhook judged it; ``sizing`` None when it could not be
    sized (an unknown model, no GPU, unreadable flags)."""

    container: str
    model: str | None
    sizing: Sizing | None = None


def workload(
    kind: str, namespace: str | None, obj: Mapping[str, Any] | None, name: str | None
) -> tuple[str, str, str]:
    """(kind, namespace, name) of a reviewed object: the request's namespace, else the
    object's, else ``default``; the object's name, else its ``generateName`` and ``*``,
    else the request's ``name``."""
    metadata = (obj or {}).get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    found = metadata.get("name") or (
        f"{metadata['generateName']}*" if metadata.get("generateName") else None
    )
    where = namespace or metadata.get("namespace") or "default"
    return kind, str(where), str(found or name or "(unnamed)")


def _per(judged: Sequence[Judged], value: Any) -> Any:
    """One container's value, or the list of them (several)."""
    values = [value(j) for j in judged]
    return values[0] if len(values) == 1 else values


def decision_fields(
    webhook: str,
    verdict: str,
    workload: tuple[str, str, str],
    judged: Sequence[Judged],
    reason: str,
) -> dict[str, Any]:
    """The decision line's fields; ``workload``: (kind, namespace, name)."""
    kind, namespace, name = workload
    sized = [j.sizing for j in judged]
    fields: dict[str, Any] = {
        "event": "webhook_decision",
        "webhook": webhook,
        "verdict": verdict,
        "kind": kind,
        "namespace": namespace,
        "name": name,
        "container": _per(judged, lambda j: j.container),
        "model": _per(judged, lambda j: j.model),
    }
    if any(s is not None for s in sized):
        fields |= {
            "gpu": _per(judged, lambda j: j.sizing.gpu if j.sizing else None),
            "bytes_per_rank": _per(judged, lambda j: j.sizing.rank_bytes if j.sizing else None),
            "ranks": _per(judged, lambda j: j.sizing.ranks if j.sizing else None),
            "max_model_len": _per(judged, lambda j: j.sizing.max_model_len if j.sizing else None),
            "sequences": _per(judged, lambda j: j.sizing.sequences if j.sizing else None),
        }
    if len(reason) > _MAX_REASON_CHARS:
        reason = reason[: _MAX_REASON_CHARS - 20] + f"... ({len(reason)} chars)"
    fields["reason"] = reason or None
    return fields


def log_decision(fields: Mapping[str, Any]) -> None:
    """The decision line: INFO, WARNING when it denies or warns."""
    level = logging.WARNING if fields.get("verdict") in ("denied", "warned") else logging.INFO
    decisions.log(level, "%s webhook: %s", fields.get("webhook"), fields.get("verdict"),
                  extra={"fields": dict(fields)})  # fmt: skip


def audit_annotations(verdict: str, judged: Sequence[Judged]) -> dict[str, str]:
    """The response's ``auditAnnotations`` for a review that judged ``judged`` (none when
    it judged no vLLM container)."""
    if not judged:
        return {}
    several = len(judged) > 1

    def value(get: Any) -> str | None:
        pairs = [(j.container, get(j)) for j in judged]
        pairs = [(c, v) for c, v in pairs if v is not None]
        if not pairs:
            return None
        return ", ".join(f"{c}={v}" for c, v in pairs) if several else str(pairs[0][1])

    out = {
        "verdict": verdict,
        "model": value(lambda j: j.model),
        "estimate-bytes-per-rank": value(lambda j: j.sizing.rank_bytes if j.sizing else None),
        "ranks": value(lambda j: j.sizing.ranks if j.sizing else None),
        "sized-for": value(lambda j: j.sizing.sized_for if j.sizing else None),
        "gpu": value(lambda j: j.sizing.gpu if j.sizing else None),
    }
    return {k: v for k, v in out.items() if v is not None}


def said(
    webhook: str,
    verdict: str,
    request: AdmissionRequest,
    judged: Sequence[Judged],
    reason: str,
    *,
    always: bool = False,
) -> dict[str, str]:
    """What a webhook says of one decision: its line (when it judged a vLLM container, or
    ``always``: it denied or warned) and the response's audit annotations, returned."""
    if judged or always:
        where = workload(request.kind.kind, request.namespace, request.object, request.name)
        log_decision(decision_fields(webhook, verdict, where, judged, reason))
    return audit_annotations(verdict, judged)
