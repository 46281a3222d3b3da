"""A vLLM workload that asks for GPU memory itself, checked against what a rank needs.

The mutating webhook leaves such a pod template alone (``gatekeeper.k8s.mutate``) unless
what it asks is smaller than a rank's need: then it is denied, or warned about, as the
``undersized`` setting says. Two ways to ask, by claims mode:

- a DRA claim of its own (``spec.resourceClaims`` or a container's ``resources.claims``):
  each template is read through the store and each request's ``capacity.requests.memory``
  compared (``claims.requested_memory``; a request that names no memory takes whole
  devices and is not compared);
- in ``hami`` mode, HAMi's ``nvidia.com/gpumem`` (MiB per GPU) on the container's limits
  or requests (``nvidia.com/gpumem-percentage`` is a share of a GPU nobody knows yet, so it
  is left alone uncompared).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gatekeeper.cluster.claims import HAMI_GPUMEM, RankSizing, requested_memory
from gatekeeper.errors import GatekeeperError
from gatekeeper.units import format_gib

__all__ = [
    "GPUMEM_PERCENTAGE",
    "OwnRequests",
    "TemplateReader",
    "asks_itself",
    "check_own",
    "template_reader",
]

GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
"""HAMi's GPU memory as a percentage of each GPU (``charts/hami/values.yaml``)."""
_MIB = 2**20


class TemplateReader(Protocol):
    """What reading a hand-written claim needs of the template store."""

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def to_bytes(self, quantity: str) -> int: ...


@dataclass(slots=True)
class OwnRequests:
    """What checking a workload's own requests comes to."""

    denials: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _resources(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return []
    return [v for k in ("limits", "requests") if isinstance(v := resources.get(k), Mapping)]


def _gpumem(container: Mapping[str, Any]) -> object | None:
    """The container's own ``nvidia.com/gpumem`` (limits first), else None."""
    return next((r[HAMI_GPUMEM] for r in _resources(container) if HAMI_GPUMEM in r), None)


def asks_itself(spec: Mapping[str, Any], containers: list[Mapping[str, Any]], hami: bool) -> bool:
    """Whether the pod ``spec`` has claims of its own or, when ``hami``, one of
    ``containers`` names HAMi's GPU memory itself."""
    if spec.get("resourceClaims"):
        return True
    if any((c.get("resources") or {}).get("claims") for c in containers):
        return True
    named = (HAMI_GPUMEM, GPUMEM_PERCENTAGE)
    return hami and any(k in r for c in containers for r in _resources(c) for k in named)


def check_own(
    who: str,
    spec: Mapping[str, Any],
    container: Mapping[str, Any],
    sizing: RankSizing,
    read: Callable[[str], tuple[str, list[int | None] | None] | None],
    undersized: Literal["warn", "deny"],
) -> OwnRequests:
    """The findings on one container's own requests. ``read(name)``: the template's
    requested bytes per request, None when it is not there, or a reason it was not read
    (``(reason, None)``)."""
    out = OwnRequests()
    asked: list[tuple[str, int]] = []
    gpumem = _gpumem(container)
    if gpumem is not None:
        mib = _mib(gpumem)
        if mib is None:
            out.warnings.append(f"{who}: {HAMI_GPUMEM} {gpumem!r} is not a whole MiB, not checked")
        else:
            asked.append((f"{HAMI_GPUMEM}: {gpumem}", mib * _MIB))
    for entry in spec.get("resourceClaims") or []:
        name = entry.get("resourceClaimTemplateName") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            continue
        found = read(name)
        if found is None:
            out.warnings.append(f"{who}: claim template {name} not found, so not checked")
        elif found[1] is None:
            out.warnings.append(f"{who}: claim template {name} not checked: {found[0]}")
        else:
            asked += [(f"claim template {name}", s) for s in found[1] if s is not None]
    small = [(what, s) for what, s in asked if s < sizing.rank_bytes]
    if small:
        what, smallest = min(small, key=lambda a: a[1])
        text = _undersized_text(who, what, smallest, sizing, undersized)
        (out.denials if undersized == "deny" else out.warnings).append(text)
    return out


def template_reader(
    store: TemplateReader, namespace: str
) -> Callable[[str], tuple[str, list[int | None] | None] | None]:
    """``check_own``'s ``read`` on ``store`` in ``namespace``."""

    def read(name: str) -> tuple[str, list[int | None] | None] | None:
        try:
            found = store.read(namespace, name)
            if found is None:
                return None
            return "", requested_memory(found.get("spec") or {}, store.to_bytes)
        except (GatekeeperError, ValueError, TypeError, AttributeError) as e:
            return str(e), None

    return read


def _mib(value: object) -> int | None:
    """HAMi's integer MiB (it rejects anything but a plain integer), else None."""
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def _undersized_text(
    who: str, what: str, smallest: int, sizing: RankSizing, outcome: Literal["warn", "deny"]
) -> str:
    verb = "denied (undersized claims: deny)" if outcome == "deny" else "admitted"
    fix = (
        f"raise it to {-(-sizing.request_bytes // _MIB)}"
        if what.startswith(HAMI_GPUMEM)
        else f"raise capacity.requests.memory to {sizing.request_bytes}"
    )
    return (
        f"{who}: {what} requests {smallest} bytes ({format_gib(smallest)}) "
        f"of GPU memory for a rank that needs {sizing.rank_bytes} bytes "
        f"({format_gib(sizing.rank_bytes)}), so it is {verb}; {fix} or remove it so that "
        "gatekeeper writes it"
    )
