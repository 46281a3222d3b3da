"""Whether any GPU the cluster publishes could hold a vLLM container (pure).

In cluster mode (``gatekeeper webhook --published-devices``) the validating webhook judges
a workload against the devices gatekeeper's node agents publish as ResourceSlices
(``gatekeeper.cluster.slices``) instead of a GPU product named by a node selector. The
slices come in as API dicts (``gatekeeper.k8s.published`` reads them); this module turns
them into device shapes and judges with ``fit.judge``, the same reasons and suggestions as
product mode:

- ``devices_from_slices``: each device of the newest generation of each pool, with its
  node, product, total bytes (the ``memoryTotal`` attribute: what vLLM sees; else the GPU
  table's figure for the product; else the capacity), claimable bytes (``capacity.memory``)
  and compute capability;
- ``shapes``: the distinct (product, total, capacity, capability), largest capacity
  first, each with how many devices at least as large the best node has (``per_node``);
- ``judge_published``: a container whose pod needs ``ranks`` GPUs on one node is judged
  on each shape some node has ``ranks`` of, largest first. The first shape it fits gives
  the answer (with its warnings) if a rank's claim also fits its claimable bytes
  (``claim_shortfall``); when none does, the largest shape's denial, with its
  suggestions capped at what one node publishes, and the list of what is published. A
  pod needing more GPUs than any node publishes is denied saying so.

e.g. two nodes publishing two L4s each (22.05 GiB visible, 21.11 GiB claimable): one shape,
``per_node`` 2; Llama-3.1-70B fp16 at TP 1 is denied on it (140 GiB of weights) with
``Nothing nearby fits``; Qwen2.5-7B at TP 1 is allowed.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.claims import size_ranks
from gatekeeper.cluster.slices import DRIVER_NAME
from gatekeeper.errors import GatekeeperError, UnknownGpuError
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.k8s.fit import Case, Finding, GpuChoice, judge
from gatekeeper.units import format_gib

__all__ = [
    "Fleet",
    "PublishedDevice",
    "Shape",
    "choice",
    "claim_shortfall",
    "devices_from_slices",
    "fleet_from_slices",
    "judge_published",
    "ranks_on_one_node",
    "shapes",
    "unpublished_text",
]


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One device of a ResourceSlice."""

    node: str
    name: str
    product: str | None
    total_bytes: int
    """What vLLM sees as the GPU's total (the ``memoryTotal`` attribute, or a fallback)."""
    capacity_bytes: int
    """``capacity.memory``: what claims may book on it."""
    compute_capability: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class Shape:
    """Devices alike in product, size and capability, and where they are."""

    product: str | None
    total_bytes: int
    capacity_bytes: int
    compute_capability: tuple[int, int] | None
    devices: int
    nodes: int
    per_node: int
    """The most devices at least this large on one node: the largest TP group it takes."""

    @property
    def label(self) -> str:
        what = self.product or f"a {format_gib(self.total_bytes)} GPU"
        return (
            f"{self.devices} x {what} ({format_gib(self.capacity_bytes)} claimable) on "
            f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        )


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the cluster publishes, as last read: shapes, or why there are none."""

    shapes: tuple[Shape, ...] = ()
    error: str | None = None
    """Why the slices could not be read (None: read, maybe empty)."""
    devices: tuple[PublishedDevice, ...] = ()
    """The devices the shapes are made of (``node_scope`` narrows them to a pod's nodes)."""
    nodes: Mapping[str, Mapping[str, str]] | None = None
    """Each Node's labels by its name; None when the Nodes were not read."""
    nodes_error: str | None = None
    """Why the Nodes could not be read."""


def _attribute(attributes: Mapping[str, Any], name: str, kind: str) -> Any:
    value = attributes.get(name)
    return value.get(kind) if isinstance(value, Mapping) else None


def _capability(attributes: Mapping[str, Any]) -> tuple[int, int] | None:
    version = _attribute(attributes, "cudaComputeCapability", "version")
    parts = str(version).split(".") if version else []
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return int(parts[0]), int(parts[1])


def _total(attributes: Mapping[str, Any], product: str | None, capacity: int) -> int:
    """``memoryTotal``; else the GPU table's total for the product; else the capacity."""
    total = _attribute(attributes, "memoryTotal", "int")
    if isinstance(total, int) and total > 0:
        return total
    if product:
        try:
            return lookup_gpu(product).total_bytes
        except UnknownGpuError:
            pass
    return capacity


def _newest(slices: Iterable[Mapping[str, Any]], driver: str) -> list[Mapping[str, Any]]:
    """The slices of ``driver`` at their pool's newest generation (older ones are stale)."""
    ours = [s for s in slices if (s.get("spec") or {}).get("driver") == driver]
    newest: dict[str, int] = {}
    for s in ours:
        pool = s["spec"].get("pool") or {}
        name, generation = str(pool.get("name", "")), int(pool.get("generation", 0))
        newest[name] = max(newest.get(name, generation), generation)
    return [
        s
        for s in ours
        if int((s["spec"].get("pool") or {}).get("generation", 0))
        == newest[str((s["spec"].get("pool") or {}).get("name", ""))]
    ]


def devices_from_slices(
    slices: Iterable[Mapping[str, Any]],
    to_bytes: Callable[[str], int],
    driver: str = DRIVER_NAME,
) -> list[PublishedDevice]:
    """Each device of ``driver``'s slices (API dicts) that has a ``memory`` capacity;
    ``to_bytes`` parses a quantity string."""
    found: list[PublishedDevice] = []
    for s in _newest(slices, driver):
        spec = s["spec"]
        for device in spec.get("devices") or []:
            memory = ((device.get("capacity") or {}).get("memory") or {}).get("value")
            if memory is None:
                continue
            attributes = device.get("attributes") or {}
            node = _attribute(attributes, "node", "string") or spec.get("nodeName") or "?"
            product = _attribute(attributes, "productName", "string")
            capacity = to_bytes(str(memory))
            found.append(
                PublishedDevice(
                    node=str(node),
                    name=str(device.get("name", "")),
                    product=product,
                    total_bytes=_total(attributes, product, capacity),
                    capacity_bytes=capacity,
                    compute_capability=_capability(attributes),
                )
            )
    return found


def shapes(devices: Sequence[PublishedDevice]) -> tuple[Shape, ...]:
    """The distinct device shapes, largest capacity (then total) first."""
    keyed = Counter(
        (d.product, d.total_bytes, d.capacity_bytes, d.compute_capability) for d in devices
    )
    out = []
    for product, total, capacity, capability in keyed:
        alike = [
            d
            for d in devices
            if (d.product, d.total_bytes, d.capacity_bytes, d.compute_capability)
            == (product, total, capacity, capability)
        ]
        large = Counter(d.node for d in devices if d.capacity_bytes >= capacity)
        nodes = {d.node for d in alike}
        per_node = max(large[node] for node in nodes)
        out.append(Shape(product, total, capacity, capability, len(alike), len(nodes), per_node))
    return tuple(sorted(out, key=lambda s: (-s.capacity_bytes, -s.total_bytes, s.product or "")))


def fleet_from_slices(
    slices: Iterable[Mapping[str, Any]],
    to_bytes: Callable[[str], int],
    driver: str = DRIVER_NAME,
    *,
    nodes: Mapping[str, Mapping[str, str]] | None = None,
    nodes_error: str | None = None,
) -> Fleet:
    """The fleet of the slices; ``nodes``: each Node's labels (None: not read, and why)."""
    devices = tuple(devices_from_slices(slices, to_bytes, driver))
    return Fleet(shapes(devices), devices=devices, nodes=nodes, nodes_error=nodes_error)


def claim_shortfall(case: Case, shape: Shape) -> str | None:
    """Why a rank's claim (placement's per-rank need with the margin, rounded up to the
    request step, as the mutating webhook writes it: ``cluster.claims.size_ranks``) does
    not fit the shape's claimable bytes; None when it does."""
    label = shape.product or f"{format_gib(shape.total_bytes)} GPU"
    try:
        sizing = size_ranks(
            case.spec, case.command.options, shape.total_bytes, label, case.policy,
            draft=case.draft,
        )  # fmt: skip
    except GatekeeperError as e:
        return f"no published {label} holds a rank's claim: {e}"
    if sizing.request_bytes <= shape.capacity_bytes:
        return None
    return (
        f"a rank claims {sizing.request_bytes} bytes ({format_gib(sizing.request_bytes)}) but "
        f"a published {label} has {shape.capacity_bytes} bytes "
        f"({format_gib(shape.capacity_bytes)}) claimable; lower --max-model-len or quantize"
    )


def ranks_on_one_node(case: Case) -> int:
    """The GPUs one pod needs on its node: TP x PP x DP, or TP in a multi-node group."""
    o = case.command.options
    if case.multi_node:
        return o.tensor_parallel_size
    return o.tensor_parallel_size * o.pipeline_parallel_size * o.data_parallel_size


def choice(shape: Shape) -> GpuChoice:
    """The shape as the GPU a ``Case`` is judged on."""
    origin = f"published by the cluster: {shape.label}"
    return GpuChoice(shape.total_bytes, shape.product, origin, shape.compute_capability)


def judge_published(who: str, case: Case, fleet: Sequence[Shape], nodes: str = "") -> list[Finding]:
    """The findings for one container against the published shapes (``case.gpu`` is
    replaced by each shape's); ``fleet`` must not be empty. ``nodes`` (``node_scope``)
    says which nodes the shapes are on when the pod's constraints left some out."""
    ranks = ranks_on_one_node(case)
    published = "; ".join(s.label for s in fleet) + nodes
    usable = [s for s in fleet if s.per_node >= ranks]
    if not usable:
        return [_too_few(who, ranks, max(s.per_node for s in fleet), published)]
    first: list[Finding] | None = None
    unclaimable: list[str] = []
    for shape in usable:
        cap = min(case.max_node_gpus, shape.per_node)
        found = judge(who, dataclasses.replace(case, gpu=choice(shape), max_node_gpus=cap))
        if any(f.outcome == "deny" for f in found):
            first = first if first is not None else found
            continue
        short = claim_shortfall(case, shape)
        if short is None:
            return found
        unclaimable.append(short)
    if first is None:  # vLLM would start on some shape, but no device has a rank's claim
        return [Finding("deny", f"{who}: {'; '.join(unclaimable)}{nodes}")]
    what = (
        f"no device on a node with {ranks} of them holds it"
        if len(usable) < len(fleet)
        else "no device on the nodes it may land on holds it"
        if nodes
        else "no device the cluster publishes holds it"
    )
    return [
        *first,
        Finding(
            "deny",
            f"{who}: {what} (published: {published}); add nodes with larger GPUs or change the flags",
        ),
    ]


def _too_few(who: str, ranks: int, most: int, published: str) -> Finding:
    return Finding(
        "deny",
        f"{who}: needs {ranks} GPUs on one node but no node publishes more than "
        f"{most} (published: {published}); lower --tensor-parallel-size (and "
        f"--pipeline-parallel-size, --data-parallel-size) to use at most {most} GPUs, "
        "or add nodes with more GPUs",
    )


def unpublished_text(who: str, fleet: Fleet) -> str:
    """The warning when the fleet has no shapes: why, what to do, what is judged instead."""
    why = fleet.error or f"no node publishes a GPU under driver {DRIVER_NAME} yet"
    fix = (
        "; give the webhook's ServiceAccount list on resourceslices"
        if fleet.error and "refused" in fleet.error
        else "; start the node agents (gatekeeper agent)"
    )
    return (
        f"{who}: cannot judge it by the cluster's GPUs: {why}{fix}. Judged by its node "
        "selector, annotation or the default GPU instead"
    )
