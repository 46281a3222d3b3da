"""The five memory components of a vLLM worker, named once.

vLLM's accounting splits a rank's memory into weights, the KV cache, the activation
peak of the profiling run, non-torch memory (CUDA context, NCCL, allocator) and CUDA
graphs (``reference/vllm-memory.md``). Every part of gatekeeper that names them reads
this table: the estimate's and the placement's fields, the metrics' ``component`` label,
calibration, the admin API's ``predicted`` and ``actual`` figures and the CLI.

Per component (``MemoryComponent``):

========== ======================= ================= ========= ================
name       field                   log_key           corrected label
========== ======================= ================= ========= ================
weights    weights_bytes           weights           yes       weights
kv_cache   kv_cache_bytes          kv_cache          no        KV cache
activation activation_peak_bytes   activation_peak   yes       activation peak
non_torch  non_torch_bytes         non_torch         yes       non-torch
cuda_graph cuda_graph_bytes        cuda_graph        yes       CUDA graphs
========== ======================= ================= ========= ================

- ``name``: the Prometheus ``component`` label's value and the calibration table's key
  (``calibration.json``); dashboards and alert rules select on it, so it never changes.
- ``field``: the estimate's attribute (``StageEstimate``, ``placement.Prediction``) and
  the JSON key of a deployment's figures, predicted and actual alike.
- ``log_key``: the key of what the worker's vLLM start-up log reported
  (``gatekeeper.vllm.log.MemoryFigures.components()``); also the bare key the admin
  API's ``actual`` figures carried before they took ``field``'s names (DEPRECATED, kept
  one release).
- ``corrected``: calibration corrects it. Not the KV cache: vLLM gives it what the
  budget leaves after the others, so correcting the others corrects it.
- ``label``: how it is shown to people.

Worked example: a decision's ``placement.predicted`` ``{"activation_peak_bytes": 2147483648}``
reads as ``{"activation": 2147483648}`` through ``by_field``; a start-up log's
``{"activation_peak": 2684354560}`` as ``{"activation": 2684354560}`` through
``by_log_key``; their error is (2684354560 - 2147483648) / 2147483648 = +25%.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "COMPONENTS",
    "CORRECTED",
    "MEMORY_COMPONENTS",
    "ComponentName",
    "MemoryComponent",
    "by_field",
    "by_log_key",
    "deprecated_actual_keys",
]

ComponentName = Literal["weights", "kv_cache", "activation", "non_torch", "cuda_graph"]


@dataclass(frozen=True, slots=True)
class MemoryComponent:
    """One memory component and each name it goes by."""

    name: ComponentName
    """The metrics' ``component`` label and the calibration key."""
    field: str
    """The estimate's attribute and the JSON key of predicted and actual figures."""
    log_key: str
    """The key of the start-up log's figures (and the deprecated bare JSON key)."""
    corrected: bool
    """Whether calibration corrects it."""
    label: str
    """How it is shown to people."""


MEMORY_COMPONENTS: tuple[MemoryComponent, ...] = (
    MemoryComponent("weights", "weights_bytes", "weights", True, "weights"),
    MemoryComponent("kv_cache", "kv_cache_bytes", "kv_cache", False, "KV cache"),
    MemoryComponent(
        "activation", "activation_peak_bytes", "activation_peak", True, "activation peak"
    ),
    MemoryComponent("non_torch", "non_torch_bytes", "non_torch", True, "non-torch"),
    MemoryComponent("cuda_graph", "cuda_graph_bytes", "cuda_graph", True, "CUDA graphs"),
)
"""The components in vLLM's accounting order."""

COMPONENTS: tuple[ComponentName, ...] = tuple(c.name for c in MEMORY_COMPONENTS)
"""The components' names (the ``component`` label's values)."""
CORRECTED: tuple[ComponentName, ...] = tuple(c.name for c in MEMORY_COMPONENTS if c.corrected)
"""The components calibration corrects."""


def by_field(figures: Mapping[str, object]) -> dict[ComponentName, int]:
    """The integer figures of ``figures`` keyed by ``field`` (``weights_bytes`` …), by
    component name; other keys and non-integer values are left out."""
    out: dict[ComponentName, int] = {}
    for c in MEMORY_COMPONENTS:
        value = figures.get(c.field)
        if isinstance(value, int) and not isinstance(value, bool):
            out[c.name] = value
    return out


def by_log_key(figures: Mapping[str, int]) -> dict[ComponentName, int]:
    """A start-up log's figures (``activation_peak`` …) by component name."""
    return {c.name: figures[c.log_key] for c in MEMORY_COMPONENTS if c.log_key in figures}


def deprecated_actual_keys() -> dict[str, str]:
    """The admin API's old bare keys of actual figures -> the keys that replace them
    (``activation_peak`` -> ``activation_peak_bytes``)."""
    return {c.log_key: c.field for c in MEMORY_COMPONENTS}
