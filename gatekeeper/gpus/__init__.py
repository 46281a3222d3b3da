"""The GPU inventory seam and its sources: what a node's GPUs hold, read in one call.

``GpuInventory`` has one method, ``snapshot() -> InventorySnapshot`` (``inventory``).
Sources: ``NvmlInventory`` reads the NVIDIA driver through ``pynvml`` (``nvml``, which
imports it when first used; only ``stand_in`` also touches it, to check what it loaded); ``StaticInventory`` serves a fixed
snapshot (``static``: a recorded one, or a declared node parsed by ``declared`` from
``2xH100-80GB`` with the GPU table of ``products``); ``CachedInventory`` shares one
reading between the readers of one moment (``cached``). ``source`` is the one reading
of the ``gpus`` setting (``nvml`` or a declared node). ``visible_devices`` reads
``CUDA_VISIBLE_DEVICES``; ``proctree`` and ``attribution`` add up a worker's memory over
its process tree. ``stand_in`` builds the stand-in NVML driver (C, via gcc) that tests,
benchmarks and demos drive the real ``pynvml`` with.

May import: ``gatekeeper.errors``, ``gatekeeper.units``, the standard library and
``pynvml``. Nothing of the other wings.
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face

if TYPE_CHECKING:
    from gatekeeper.gpus.attribution import WorkerUsage, tree_usage, worker_usage
    from gatekeeper.gpus.cached import CachedInventory
    from gatekeeper.gpus.declared import DeclaredNodeError, load_node_file, parse_declared_node
    from gatekeeper.gpus.inventory import (
        SNAPSHOT_SCHEMA,
        GpuInfo,
        GpuInventory,
        GpuProcess,
        InventorySnapshot,
        SnapshotFormatError,
        failed_snapshot,
    )
    from gatekeeper.gpus.nvml import NvmlInventory
    from gatekeeper.gpus.proctree import process_tree, read_parent_map
    from gatekeeper.gpus.products import GpuProduct, best_capability, gpu_products, lookup_gpu
    from gatekeeper.gpus.source import GpuSource, parse_gpu_source
    from gatekeeper.gpus.static import StaticInventory
    from gatekeeper.gpus.visible_devices import (
        VisibleDevicesError,
        parse_visible_devices,
        worker_cuda_env,
    )

__all__ = [
    "SNAPSHOT_SCHEMA",
    "CachedInventory",
    "DeclaredNodeError",
    "GpuInfo",
    "GpuInventory",
    "GpuProcess",
    "GpuProduct",
    "GpuSource",
    "InventorySnapshot",
    "NvmlInventory",
    "SnapshotFormatError",
    "StaticInventory",
    "VisibleDevicesError",
    "WorkerUsage",
    "best_capability",
    "failed_snapshot",
    "gpu_products",
    "load_node_file",
    "lookup_gpu",
    "parse_declared_node",
    "parse_gpu_source",
    "parse_visible_devices",
    "process_tree",
    "read_parent_map",
    "tree_usage",
    "worker_cuda_env",
    "worker_usage",
]

__getattr__, __dir__ = face(globals())
