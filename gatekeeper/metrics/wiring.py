"""The sidecar's metrics wired once: ``register_collectors(registry, sources)`` puts
every collector and instrumentation object of the sidecar's ``/metrics`` on one
registry.

``sources`` (``MetricSources``) holds what they read at scrape time as plain callables,
so that the sidecar (``gatekeeper.sidecar.app.build_app``), the tests' fixture node and
``bench/metrics_scrape.py`` build the same families the same way: the GPU collector and
the worker collector share one NVML reading per scrape (``CachedInventory``), the
calibration collector reads the learned factors, and ``SidecarMetrics`` counts events.
A new family added here (or to one of the collectors) reaches all three, and
``tests/metrics/test_metrics_doc.py`` asks for its row in ``docs/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.registry import CollectorRegistry

from gatekeeper._version import __version__
from gatekeeper.gpus.cached import CachedInventory
from gatekeeper.gpus.host_memory import HostMemory
from gatekeeper.gpus.host_usage import tree_host_bytes
from gatekeeper.gpus.inventory import GpuInventory
from gatekeeper.gpus.proctree import read_parent_map
from gatekeeper.metrics.events import SidecarMetrics
from gatekeeper.metrics.gpus import CalibrationCollector, GpuCollector, policy_margin
from gatekeeper.metrics.host import HostCollector, HostWorkerView
from gatekeeper.metrics.release_info import register_release_info
from gatekeeper.metrics.workers import WorkerCollector, WorkerView
from gatekeeper.placement.policy import PlacementPolicy

__all__ = ["MetricSources", "SidecarCollectors", "register_collectors"]


def _no_factors() -> Mapping[tuple[str, str], tuple[float, int]]:
    return {}


def _nothing_reserved() -> int:
    return 0


def _no_host_workers() -> Iterable[HostWorkerView]:
    return ()


@dataclass(frozen=True, slots=True)
class MetricSources:
    """What the sidecar's metrics read, each at scrape time unless said otherwise."""

    inventory: GpuInventory
    """The GPUs (NVML, declared or static); read once per scrape for all collectors."""
    promised: Callable[[], Mapping[str, int]]
    """Bytes promised per GPU UUID to workers still starting (the ledger's view)."""
    workers: Callable[[], Iterable[WorkerView]]
    """Every deployment the sidecar knows, as the worker collector sees it."""
    outstanding: Callable[[], int]
    """The ledger's outstanding reservations (``gatekeeper_reservations_outstanding``)."""
    known_models: Callable[[], Collection[str]]
    """The configured and deployed model names (any other proxied name is ``other``)."""
    calibration: Callable[[], Mapping[tuple[str, str], tuple[float, int]]] = _no_factors
    """(family, component) -> (applied factor, samples)."""
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    """Placement's rules; its safety margin is taken off the headroom."""
    node: str | None = None
    """The node name of the ``Hostname`` and ``node`` labels (the host name if None)."""
    parent_map: Callable[[], Mapping[int, int]] = read_parent_map
    """Every pid's parent (``/proc``), to sum a worker's process tree."""
    version: str = __version__
    """``gatekeeper_build_info``'s ``version``."""
    host_memory: Callable[[], HostMemory] | None = None
    """The node's host memory (``ProcHostMemory.read``); None: no host series."""
    host_reserved: Callable[[], int] = _nothing_reserved
    """Host bytes admission counts against the available memory (margin, promises)."""
    host_workers: Callable[[], Iterable[HostWorkerView]] = _no_host_workers
    """The live deployments' predicted host bytes and pids."""
    host_tree_bytes: Callable[[Iterable[int]], int] = tree_host_bytes
    """A process tree's host bytes (PSS from ``/proc``)."""


@dataclass(frozen=True, slots=True)
class SidecarCollectors:
    """What ``register_collectors`` registered."""

    registry: CollectorRegistry
    metrics: SidecarMetrics
    gpus: GpuCollector
    workers: WorkerCollector
    calibration: CalibrationCollector
    host: HostCollector | None = None


def register_collectors(registry: CollectorRegistry, sources: MetricSources) -> SidecarCollectors:
    """Every family of the sidecar's ``/metrics`` on ``registry``, reading ``sources``."""
    scrape = CachedInventory(sources.inventory)
    margin = policy_margin(sources.policy)
    gpus = GpuCollector(scrape, sources.promised, margin, node=sources.node, registry=registry)
    workers = WorkerCollector(
        sources.workers,
        scrape,
        parent_map=sources.parent_map,
        node=sources.node,
        registry=registry,
    )
    calibration = CalibrationCollector(sources.calibration, registry=registry)
    metrics = SidecarMetrics(
        registry,
        known_models=sources.known_models,
        outstanding=sources.outstanding,
        version=sources.version,
    )
    register_release_info(registry, sources.policy.default_vllm_version)
    host = None
    if sources.host_memory is not None:
        host = HostCollector(
            sources.host_memory,
            sources.host_reserved,
            sources.host_workers,
            parent_map=sources.parent_map,
            tree_bytes=sources.host_tree_bytes,
            node=sources.node,
            registry=registry,
        )
    return SidecarCollectors(registry, metrics, gpus, workers, calibration, host)
