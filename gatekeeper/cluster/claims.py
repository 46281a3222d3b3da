"""An estimate as a DRA claim request, and a hand-written claim's request back as bytes.

Pure. ``size_ranks`` sizes one vLLM container the way the sidecar's placement sizes a
worker that shares its GPUs (``gatekeeper.placement.gpu_search.search`` on a declared node
of idle GPUs, ``share_gpus`` on): per rank, the bytes placement would put in its ledger
(CUDA context + weights + non-torch + activation peak + CUDA graphs + the KV cache for the
chosen length), the ``--kv-cache-memory-bytes`` that KV cache is, and a
``--gpu-memory-utilization`` that passes vLLM's start-up check on any GPU the claim may
land on (``free >= ceil(u x total)``, free measured after the worker's CUDA context and
NCCL): with a byte budget the fraction does nothing else, so it is the in-budget bytes
over the largest GPU in gatekeeper's table, rounded down to 4 decimals (at least 0.0001),
and ``ceil(u x total)`` stays within the in-budget bytes, which the claim holds free, on
every GPU.

``claim_template_spec`` turns that into a ResourceClaimTemplate's ``spec``: one request
per rank (``rank0`` …) of ``count: 1`` device of the class, ``capacity.requests.memory``
rounded up to the slices' 1 MiB step, a CEL selector when the quantization needs a compute
capability (vLLM's ``get_min_capability``), and, for several ranks, constraints that keep
them on one node (``matchAttribute`` on the published ``node`` attribute) and on distinct
GPUs (``distinctAttribute`` on ``uuid``; without it the scheduler may put two ranks of a
consumable-capacity claim on one GPU). ``template_name`` derives the name from a hash of
that spec, so applying the same workload again names the same template.

The claims mode (``ClaimsMode``, setting ``webhook_claims_mode``; ``docs/cluster.md``,
"Coexistence and fallback") says whose devices the claim names: gatekeeper's own
(``GATEKEEPER_DRIVER``, published by ``gatekeeper agent``), NVIDIA's DRA driver's
(``NVIDIA_DRIVER``, run with ``--consumable-shares=memory``), or, on a cluster without
DRA, no claim at all: ``hami_resources`` is the same sizing as HAMi's extended resources.

Worked example: Qwen2.5-7B-Instruct, --max-model-len 8192, TP 1, no GPU named, vLLM 0.34
and ``PlacementPolicy()``'s defaults (sized on the largest in the table: B300, GB300 and
MI355X, 288 GB each): a KV cache of 8 sequences of 8192 tokens, 3.50 GiB
(``--kv-cache-memory-bytes 3761766400``); the rank's need 22.00 GiB (23618058444 bytes);
``--gpu-memory-utilization 0.08``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from gatekeeper.cluster.slices import DRIVER_NAME, REQUEST_STEP_BYTES
from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.inventory import GpuInfo, InventorySnapshot
from gatekeeper.gpus.products import gpu_products
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.gpu_search import SearchResult, search
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.sizing import need_text, sequences_held
from gatekeeper.placement.types import Placement, PlacementRequest, Prediction
from gatekeeper.units import format_gib, round_up
from gatekeeper.vllm.launch import floor_fraction

__all__ = [
    "CLAIMS_MODES",
    "CLAIM_NAME",
    "GATEKEEPER_DRIVER",
    "GPU_RESOURCE",
    "HAMI_GPU",
    "HAMI_GPUMEM",
    "MIN_CAPABILITY",
    "MIN_FRACTION",
    "NVIDIA_DRIVER",
    "ClaimDriver",
    "ClaimError",
    "ClaimsMode",
    "RankSizing",
    "capability_selector",
    "claim_driver",
    "claim_template",
    "claim_template_spec",
    "container_gpus",
    "hami_resources",
    "min_capability",
    "ours",
    "requested_memory",
    "size_ranks",
    "template_name",
]

MIN_CAPABILITY: Mapping[str, tuple[int, int]] = {
    "fp8": (7, 5),
    "ptpc_fp8": (7, 5),
    "fbgemm_fp8": (8, 0),
    "modelopt": (8, 0),
    "modelopt_fp4": (7, 5),
    "modelopt_mxfp8": (8, 0),
    "mxfp4": (8, 0),
    "experts_int8": (8, 0),
    "awq": (7, 5),
    "awq_marlin": (7, 5),
    "gptq": (6, 0),
    "gptq_marlin": (6, 0),
    "compressed-tensors": (7, 0),
    "moe_wna16": (7, 0),
    "torchao": (7, 5),
    "quark": (7, 0),
    "fp_quant": (10, 0),
}
"""The least compute capability vLLM 0.32 runs each quantization method on: the method's
``get_min_capability`` (``model_executor/layers/quantization/*.py``), which
``config/vllm.py``'s ``_get_quantization_config`` checks at start-up."""

MIN_FRACTION = 0.0001
"""The least ``--gpu-memory-utilization`` written (vLLM takes a fraction in (0, 1])."""

ClaimsMode = Literal["gatekeeper", "nvidia-dra", "hami"]
"""Whose GPUs the mutating webhook's requests name: gatekeeper's DRA driver, NVIDIA's DRA
driver, or HAMi's extended resources (a cluster without DRA)."""
CLAIMS_MODES: tuple[ClaimsMode, ...] = get_args(ClaimsMode)


@dataclass(frozen=True, slots=True)
class ClaimDriver:
    """The DRA driver a claim's requests name: its DeviceClass, the domain of its device
    attributes, and the attribute naming a device's node (None: it publishes none)."""

    device_class: str
    domain: str
    node_attribute: str | None


GATEKEEPER_DRIVER = ClaimDriver(DRIVER_NAME, DRIVER_NAME, "node")
"""gatekeeper's own driver: ``gatekeeper agent`` publishes the GPUs (``slices.py``)."""

NVIDIA_DRIVER = ClaimDriver("gpu.nvidia.com", "gpu.nvidia.com", None)
"""NVIDIA's DRA driver, as read in kubernetes-sigs/dra-driver-nvidia-gpu at commit
95932046683719c43b6a0dd9613c2e5aad5d6703: its DeviceClass ``gpu.nvidia.com`` selects
``device.driver == 'gpu.nvidia.com'`` and ``type == 'gpu'``
(``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml``); a full GPU's
attributes are ``type``, ``uuid``, ``productName``, ``brand``, ``architecture`` (strings)
and ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` (versions, e.g.
``9.0.0``) (``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``Attributes``), its capacity
``memory`` the GPU's total bytes (``partitions.go``, ``fullGpuCapacity``); with
``--consumable-shares=memory`` (feature gate ``ConsumableShares``) each GPU gets
``allowMultipleAllocations: true`` and a ``memory`` requestPolicy of default = the total
(rounded down to 1 MiB), min 1 MiB, step 1 MiB (``consumable_shares.go``,
``applyConsumableShares``). It publishes no node attribute: its slices are node-local
(``nodeName``), so one claim's devices are on one node without a constraint."""

CLAIM_NAME = "vllm-gpus"
"""The pod claim gatekeeper adds (``vllm-gpus-1`` … for further vLLM containers)."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The device plugin's whole GPUs per container (NVIDIA's device plugin; HAMi's too)."""


def ours(entry: object) -> bool:
    """A pod claim gatekeeper wrote (``vllm-gpus``, ``vllm-gpus-1`` …)."""
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return isinstance(name, str) and (name == CLAIM_NAME or name.startswith(f"{CLAIM_NAME}-"))


def container_gpus(container: Mapping[str, Any]) -> int | None:
    """``resources.limits["nvidia.com/gpu"]`` of a container, else its requests; None when
    neither names it or the value is not a whole number."""
    resources = container.get("resources")
    for section in ("limits", "requests"):
        values = resources.get(section) if isinstance(resources, Mapping) else None
        value = values.get(GPU_RESOURCE) if isinstance(values, Mapping) else None
        if value is None:
            continue
        try:
            return int(str(value).strip())
        except ValueError:
            return None
    return None


HAMI_GPU = GPU_RESOURCE
"""HAMi's count of physical GPUs per container (Project-HAMi/HAMi at commit
4707fb02c91c545bc7343ce26dba4c32919f9a3e, ``charts/hami/values.yaml`` ``resourceName``)."""
HAMI_GPUMEM = "nvidia.com/gpumem"
"""HAMi's GPU memory per GPU in MiB (``values.yaml`` ``resourceMem``;
``pkg/device/nvidia/device.go``, ``GenerateResourceRequests``: per device requested; the
device plugin registers each GPU's memory as ``total / 1024 / 1024``,
``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``)."""
_MIB = 2**20


def claim_driver(mode: ClaimsMode) -> ClaimDriver | None:
    """The driver whose devices ``mode``'s claims name; None for ``hami`` (no claim)."""
    return {"gatekeeper": GATEKEEPER_DRIVER, "nvidia-dra": NVIDIA_DRIVER}.get(mode)


class ClaimError(GatekeeperError):
    """A vLLM container cannot be sized as a claim."""


@dataclass(frozen=True, slots=True)
class RankSizing:
    """What one vLLM container's ranks claim, and the flags that hold the worker to it."""

    ranks: int
    """Devices the pod claims: one per rank it runs."""
    rank_bytes: int
    """The most loaded rank's need, as placement promises it."""
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float
    min_capability: tuple[int, int] | None
    """The compute capability the quantization needs; None when any GPU runs it."""
    max_model_len: int = 0
    """The max_model_len the rank was sized with (0: not sized here)."""
    predicted: Prediction | None = None
    """Per component, the rank placement sized (its worst stage, with the KV cache above);
    they add up to ``rank_bytes`` less the CUDA context. None: not sized here."""
    sequences: int = 0
    """Sequences of max_model_len the KV cache holds (``placement.sizing.sequences_held``:
    "sized for N sequences of M tokens", as ``check`` and ``plan`` say it)."""

    @property
    def request_bytes(self) -> int:
        """``rank_bytes`` rounded up to the slices' request step (what is consumed)."""
        return round_up(self.rank_bytes, REQUEST_STEP_BYTES)


def min_capability(spec: ModelSpec, options: ServeOptions) -> tuple[int, int] | None:
    """The compute capability the weights' quantization needs (the flag's, else the
    checkpoint's method); None when unquantized or not in ``MIN_CAPABILITY``."""
    method = options.quantization or (spec.quantization.method if spec.quantization else None)
    return MIN_CAPABILITY.get(method) if method else None


def _largest_total() -> int:
    return max(p.total_bytes for p in gpu_products())


def _node(gpus: int, total_bytes: int, name: str) -> InventorySnapshot:
    """A declared node of ``gpus`` idle GPUs of ``total_bytes`` each."""
    return InventorySnapshot(
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"CLAIM-{i}",
                name=name,
                pci_bus_id="",
                total_bytes=total_bytes,
                free_bytes=total_bytes,
                used_bytes=0,
                driver_reserved_bytes=None,
            )
            for i in range(gpus)
        ),
        ok=True,
        source="declared",
    )


def size_ranks(
    spec: ModelSpec,
    options: ServeOptions,
    gpu_total_bytes: int,
    gpu_name: str,
    policy: PlacementPolicy,
    *,
    draft: ModelSpec | None = None,
    ranks: int | None = None,
) -> RankSizing:
    """The claim of ``spec`` served with ``options`` on GPUs of ``gpu_total_bytes``:
    placement's per-rank need with a shared GPU's byte budget. ``ranks``: devices per
    pod (default: TP x PP x DP, the whole engine in one pod). Raises ``ClaimError`` when
    no GPU of that size holds a rank (placement's reasons in the message)."""
    shared = PlacementPolicy(
        margin_bytes=policy.margin_bytes,
        margin_fraction=policy.margin_fraction,
        share_gpus=True,
        shared_kv_sequences=policy.shared_kv_sequences,
        default_vllm_version=policy.default_vllm_version,
    )
    world = options.tensor_parallel_size * options.pipeline_parallel_size
    world *= options.data_parallel_size
    request = PlacementRequest(spec, options, auto_parallel=False, draft=draft)
    found = search(request, _node(world, gpu_total_bytes, gpu_name), policy=shared)
    if found.placement is None:
        raise ClaimError(_unplaced(spec, gpu_name, found), field="model", value=spec.name)
    placement = found.placement
    return RankSizing(
        ranks=ranks or world,
        rank_bytes=max(placement.promise_bytes),
        kv_cache_memory_bytes=placement.kv_cache_bytes,
        gpu_memory_utilization=max(
            MIN_FRACTION, floor_fraction(_in_budget(placement), _largest_total())
        ),
        min_capability=min_capability(spec, options),
        max_model_len=placement.estimate.max_model_len,
        predicted=placement.prediction,
        sequences=sequences_held(placement.estimate, placement.kv_cache_bytes),
    )


def _in_budget(placement: Placement) -> int:
    """The most loaded rank's bytes inside vLLM's budget with the placement's KV cache."""
    e = placement.estimate
    return max(e.rank_bytes(s, placement.kv_cache_bytes)[1] for s in e.stages)


def _unplaced(spec: ModelSpec, gpu_name: str, found: SearchResult) -> str:
    """Why no rank fits, in placement's words (``placement.sizing.need_text``: the KV
    cache the rank was sized with, "sized for N sequences of M tokens"), and what one GPU
    holds once the margin is kept."""
    parts = [
        need_text(spec.name, tp, pp, need.estimate, need.max_bytes, need.kv_bytes)
        for (tp, pp), by_total in found.tried
        for need in by_total.values()
    ]
    parts += [n.short for _, by_total in found.tried for n in by_total.values() if n.short]
    gpu = found.lines[0] if found.lines else None
    room = f" ({format_gib(gpu.usable_bytes)} usable once the margin is kept)" if gpu else ""
    return (
        f"{'; '.join(parts) or spec.name}; it does not fit on one {gpu_name}{room}; lower "
        "--max-model-len, raise "
        "--tensor-parallel-size or quantize"
    )


def capability_selector(capability: tuple[int, int], domain: str = DRIVER_NAME) -> dict[str, Any]:
    """A CEL selector admitting devices whose ``cudaComputeCapability`` (a version, in
    ``domain``: gatekeeper's and NVIDIA's drivers both publish it so) is at least
    ``capability`` (a device that publishes none is not chosen)."""
    least = f"{capability[0]}.{capability[1]}.0"
    attribute = f'device.attributes["{domain}"]'
    expression = (
        f'"cudaComputeCapability" in {attribute} && '
        f'{attribute}.cudaComputeCapability.compareTo(semver("{least}")) >= 0'
    )
    return {"cel": {"expression": expression}}


def claim_template_spec(
    sizing: RankSizing, driver: ClaimDriver = GATEKEEPER_DRIVER
) -> dict[str, Any]:
    """The ResourceClaimTemplate's ``spec`` against ``driver``'s devices: one request per
    rank, the selectors and the constraints."""
    exactly: dict[str, Any] = {
        "deviceClassName": driver.device_class,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"memory": str(sizing.request_bytes)}},
    }
    if sizing.min_capability is not None:
        exactly["selectors"] = [capability_selector(sizing.min_capability, driver.domain)]
    names = [f"rank{i}" for i in range(sizing.ranks)]
    devices: dict[str, Any] = {"requests": [{"name": n, "exactly": exactly} for n in names]}
    if sizing.ranks > 1:
        same_node = [
            {"requests": names, "matchAttribute": f"{driver.domain}/{driver.node_attribute}"}
        ]
        devices["constraints"] = [
            *(same_node if driver.node_attribute else []),
            {"requests": names, "distinctAttribute": f"{driver.domain}/uuid"},
        ]
    return {"spec": {"devices": devices}}


def hami_resources(sizing: RankSizing) -> dict[str, str]:
    """HAMi's extended resources for the sizing: ``nvidia.com/gpu`` the ranks and
    ``nvidia.com/gpumem`` each rank's request in MiB (HAMi's unit, per GPU)."""
    return {HAMI_GPU: str(sizing.ranks), HAMI_GPUMEM: str(-(-sizing.request_bytes // _MIB))}


def template_name(spec: Mapping[str, Any], prefix: str = CLAIM_NAME) -> str:
    """``<prefix>-<16 hex digits of the spec's SHA-256>``: the same spec, the same name."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    return f"{prefix}-{digest[:16]}"


def claim_template(namespace: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate object for ``spec`` in ``namespace``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(spec),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gatekeeper"},
        },
        "spec": dict(spec),
    }


def requested_memory(
    template_spec: Mapping[str, Any], to_bytes: Callable[[str], int]
) -> list[int | None]:
    """Each request's ``capacity.requests.memory`` in a ResourceClaimTemplate's ``spec``
    (``exactly`` requests, and each ``firstAvailable`` alternative's least), in bytes;
    None for a request that names no memory (it takes whole devices). ``to_bytes`` parses
    a Kubernetes quantity and raises ``ValueError`` on a bad one."""
    devices = template_spec.get("spec", {}).get("devices", {})
    out: list[int | None] = []
    for request in devices.get("requests") or []:
        choices = [request["exactly"]] if request.get("exactly") else []
        choices += list(request.get("firstAvailable") or [])
        sizes = [_memory(c, to_bytes) for c in choices]
        known = [s for s in sizes if s is not None]
        out.append(min(known) if known and len(known) == len(sizes) else None)
    return out


def _memory(choice: Mapping[str, Any], to_bytes: Callable[[str], int]) -> int | None:
    value = (choice.get("capacity") or {}).get("requests", {}).get("memory")
    if value is None:
        return None
    return math.ceil(to_bytes(str(value)))
