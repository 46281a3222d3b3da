"""Which published GPUs a pod may land on, by its node constraints (pure).

In cluster mode the validating webhook judges a workload against the devices the node
agents publish (``gatekeeper.k8s.fleet``). A pod template that narrows its nodes is
judged only on the devices of the nodes it may land on, read as kube-scheduler's
``NodeAffinity`` filter reads them (``k8s.io/component-helpers/scheduling/corev1/
nodeaffinity``): ``spec.nodeName`` when set; every ``nodeSelector`` label equal; and, for
the required node affinity, any one of its ``nodeSelectorTerms`` (ORed; an empty term or
an empty list matches no node), each the AND of its ``matchExpressions`` on the node's
labels (``In``, ``NotIn`` and ``DoesNotExist`` also match a missing label only as the API
says: ``NotIn`` and ``DoesNotExist`` do, ``In``, ``Exists``, ``Gt`` and ``Lt`` do not) and
its ``matchFields`` on ``metadata.name``. Taints and tolerations are not read: a GPU
node's taint is tolerated by the GPU pods it is meant for.

e.g. nodes ``a`` (``nvidia.com/gpu.product=NVIDIA-L4``) and ``b`` (``NVIDIA-H100-80GB-HBM3``),
a pod with ``nodeSelector: {nvidia.com/gpu.product: NVIDIA-L4}``: judged on ``a``'s L4s;
``b`` is left out with ``nodeSelector nvidia.com/gpu.product=NVIDIA-L4: the node's is
'NVIDIA-H100-80GB-HBM3'``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.k8s.fleet import Fleet, Shape, shapes, unpublished_text

__all__ = ["NodeConstraint", "Scope", "node_constraint", "pod_scope", "refusal"]


@dataclass(frozen=True, slots=True)
class NodeConstraint:
    """A pod's hard node constraints."""

    node_name: str | None
    selector: Mapping[str, str]
    terms: tuple[Mapping[str, Any], ...] | None
    """The required node affinity's terms; None when it has none."""


@dataclass(frozen=True, slots=True)
class Scope:
    """The published shapes a pod is judged on, what to say of the nodes in a denial,
    and a warning when its constraints could not be applied or left no node."""

    shapes: tuple[Shape, ...]
    text: str = ""
    note: str | None = None


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def node_constraint(spec: Mapping[str, Any]) -> NodeConstraint | None:
    """The pod spec's node constraints; None when it has none."""
    name = spec.get("nodeName")
    selector = {str(k): str(v) for k, v in _map(spec.get("nodeSelector")).items()}
    affinity = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (
        None
        if required is None
        else tuple(map(_map, _seq(_map(required).get("nodeSelectorTerms"))))
    )
    if not name and not selector and terms is None:
        return None
    return NodeConstraint(name if isinstance(name, str) and name else None, selector, terms)


def _expression(expression: Mapping[str, Any], value: str | None, what: str) -> str | None:
    """Why ``value`` (the node's label or name; None: absent) fails the expression."""
    op, values = expression.get("operator"), [str(v) for v in _seq(expression.get("values"))]
    key = f"{what} {expression.get('key')} {op}"
    have = "the node has none" if value is None else f"the node's is {value!r}"
    if op in ("Gt", "Lt"):
        try:
            bound, number = int(values[0]), int(value or "")
        except (IndexError, ValueError):
            return f"{key} {' '.join(values[:1]) or '(no value)'}: {have}, not an integer"
        holds = number > bound if op == "Gt" else number < bound
        return None if holds else f"{key} {values[0]}: {have}"
    holds = {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }.get(str(op), False)
    return None if holds else f"{key} {values}: {have}" if values else f"{key}: {have}"


def _term(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> str | None:
    """Why the node fails one node selector term (None: it matches)."""
    expressions = [_map(e) for e in _seq(term.get("matchExpressions"))]
    fields = [_map(e) for e in _seq(term.get("matchFields"))]
    if not expressions and not fields:
        return "an empty term matches no node"
    for e in expressions:
        why = _expression(e, labels.get(str(e.get("key"))), "label")
        if why:
            return why
    for e in fields:
        value = name if e.get("key") == "metadata.name" else None
        why = _expression(e, value, "field")
        if why:
            return why
    return None


def refusal(constraint: NodeConstraint, name: str, labels: Mapping[str, str]) -> str | None:
    """Why the pod cannot land on node ``name`` with ``labels``; None when it may."""
    if constraint.node_name is not None and name != constraint.node_name:
        return f"spec.nodeName is {constraint.node_name}"
    for key, want in constraint.selector.items():
        have = labels.get(key)
        if have != want:
            has = "the node has none" if have is None else f"the node's is {have!r}"
            return f"nodeSelector {key}={want}: {has}"
    if constraint.terms is None:
        return None
    reasons = [_term(t, name, labels) for t in constraint.terms]
    if not reasons:
        return "required node affinity with no nodeSelectorTerms matches no node"
    if all(reasons):
        return "required node affinity: " + "; or ".join(r for r in reasons if r)
    return None


def pod_scope(who: str, fleet: Fleet | None, spec: Mapping[str, Any]) -> Scope:
    """The shapes of ``fleet`` on the nodes the pod may land on: none without a fleet
    (product mode), none with a warning when nothing is published."""
    if fleet is None:
        return Scope(())
    if not fleet.shapes:
        return Scope((), note=unpublished_text(who, fleet))
    constraint = node_constraint(spec)
    if constraint is None:
        return Scope(fleet.shapes)
    if fleet.nodes is None:
        return Scope(
            fleet.shapes,
            note=f"{who}: judged on every published GPU: its node selector or affinity could "
            f"not be matched to the nodes ({fleet.nodes_error}); give the webhook's "
            "ServiceAccount list on nodes",
        )
    left_out: dict[str, str] = {}
    for node in sorted({d.node for d in fleet.devices}):
        labels = fleet.nodes.get(node)
        why = "no Node object has its name" if labels is None else refusal(constraint, node, labels)
        if why:
            left_out[node] = why
    kept = [d for d in fleet.devices if d.node not in left_out]
    out = _listed([f"{node} ({why})" for node, why in left_out.items()])
    if not kept:
        return Scope(
            (),
            note=f"{who}: judged by its node selector, annotation or the default GPU: no node "
            f"that publishes GPUs is one it may land on (left out: {out})",
        )
    considered = _listed(sorted({d.node for d in kept}))
    text = f"; judged on the nodes it may land on: {considered}; left out: {out}" if out else ""
    return Scope(shapes(kept), text)


def _listed(items: Sequence[str], most: int = 8) -> str:
    """The items joined, the first ``most`` of them and how many more."""
    more = f"; and {len(items) - most} more" if len(items) > most else ""
    return "; ".join(items[:most]) + more
