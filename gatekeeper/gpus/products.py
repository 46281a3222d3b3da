"""GPU products and the total memory vLLM sees on each (``data/gpus.json``).

Each product also carries its CUDA compute capability (what vLLM's quantization
methods check: ``get_min_capability``). The memory figure is what ``cudaMemGetInfo`` reports as total, which is what vLLM
multiplies by ``--gpu-memory-utilization``: an H100 80GB shows 79.19 GiB, not 80.
Products NVML does not read (AMD Instinct; GB10, whose unified memory NVML does not
report) are in the table for declared nodes and GPU names only (``GpuProduct.nvml``).
Lookup is forgiving: ``H100-80GB``, ``h100``, ``NVIDIA H100 80GB HBM3`` and the GPU
Feature Discovery label ``NVIDIA-H100-80GB-HBM3`` all name the same product.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gatekeeper.errors import UnknownGpuError
from gatekeeper.units import GIB

__all__ = ["GpuProduct", "best_capability", "gpu_products", "lookup_gpu"]


@dataclass(frozen=True, slots=True)
class GpuProduct:
    """A GPU product: its canonical name, the total bytes vLLM sees and its CUDA compute
    capability (NVIDIA's figure, ``(9, 0)`` for an H100; None where the table has none)."""

    name: str
    total_bytes: int
    source: str
    aliases: tuple[str, ...] = ()
    gfd_products: tuple[str, ...] = ()
    compute_capability: tuple[int, int] | None = None
    nvml: bool = True
    """False for a product gatekeeper only declares: NVML does not read it (AMD Instinct) or
    reports no memory for it (GB10's unified memory); plan with ``--node`` or a GPU name."""
    unified_memory: bool = False
    """The GPU shares its memory with the CPU (GB10): what is free depends on the host too."""


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _capability(text: str | None) -> tuple[int, int] | None:
    """``"8.9"`` as ``(8, 9)``."""
    if text is None:
        return None
    major, minor = text.split(".")
    return int(major), int(minor)


@cache
def gpu_products() -> tuple[GpuProduct, ...]:
    """Every product in the table, in file order."""
    raw = json.loads(resources.files("gatekeeper").joinpath("data/gpus.json").read_text())
    return tuple(
        GpuProduct(
            name=p["name"],
            total_bytes=round(p["total_gib"] * GIB),
            source=p["source"],
            aliases=tuple(p.get("aliases", ())),
            gfd_products=tuple(p.get("gfd_products", ())),
            compute_capability=_capability(p.get("compute_capability")),
            nvml=bool(p.get("nvml", True)),
            unified_memory=p.get("memory") == "unified",
        )
        for p in raw["products"]
    )


@cache
def _index() -> dict[str, GpuProduct]:
    index: dict[str, GpuProduct] = {}
    for product in gpu_products():
        for name in (product.name, *product.aliases, *product.gfd_products):
            index.setdefault(_key(name), product)
    return index


def lookup_gpu(name: str) -> GpuProduct:
    """Find a product by name, alias, NVML name or GFD label.

    Raises ``UnknownGpuError`` listing the known names when nothing matches.
    """
    product = _index().get(_key(name))
    if product is None:
        known = ", ".join(p.name for p in gpu_products())
        raise UnknownGpuError(
            f"gpu: {name!r} is not in the GPU table; use one of {known}, "
            "or give the memory directly with --gpu-memory (e.g. 79.19GiB)",
            field="gpu",
            value=name,
        )
    return product


def best_capability(names: Iterable[str]) -> tuple[int, int] | None:
    """The highest compute capability among GPUs named as ``lookup_gpu`` takes them (NVML
    names too); None when there are none or any is not in the table (unknown: assume
    nothing is out of reach)."""
    found = [_index().get(_key(name)) for name in names]
    known = [p.compute_capability for p in found if p is not None and p.compute_capability]
    return max(known) if found and len(known) == len(found) else None
