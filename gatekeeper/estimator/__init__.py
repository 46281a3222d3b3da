"""The estimate (pure): ``ModelSpec`` + ``ServeOptions`` + ``GpuTarget`` -> ``Estimate``.

Per-GPU bytes of a vLLM worker as vLLM itself accounts them, release by release
(``accounting``): weights (``weights``; by module group and format in
``weight_groups``), the KV cache and its layout (``kv_cache``),
the activation peak, non-torch memory and CUDA graphs (``overhead``), put together by
``vllm_method.estimate`` (the options resolved once in ``plan``) into the result types
of ``types``. ``simple_method`` keeps the seed's rule of thumb for comparison;
``options`` holds the serving options; ``calibration`` is the pure half of the
sidecar's learned corrections (factors and ``scale_estimate``); ``components`` is the
one table of the five memory components and each name they go by (the metrics' label,
the estimate's field and JSON key, the start-up log's key).

May import: ``gatekeeper.models`` (``spec`` and what it needs), ``gatekeeper.errors``,
``gatekeeper.units``, the standard library. No I/O: no files, sockets, threads, clocks
or drivers (an import-linter contract keeps it so).
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face

if TYPE_CHECKING:
    from gatekeeper.estimator.accounting import (
        ACCOUNTINGS,
        DEFAULT_VLLM_VERSION,
        Accounting,
        accounting_for,
        parse_vllm_version,
    )
    from gatekeeper.estimator.calibration import CalibrationTable, Factor, scale_estimate
    from gatekeeper.estimator.kv_cache import KvGroup, KvLayout, KvOptions, kv_layout
    from gatekeeper.estimator.options import KV_DTYPES, ServeOptions
    from gatekeeper.estimator.simple_method import SimpleEstimate, simple_estimate
    from gatekeeper.estimator.types import Estimate, GpuTarget, StageEstimate
    from gatekeeper.estimator.vllm_method import estimate
    from gatekeeper.estimator.weight_groups import WeightGroups
    from gatekeeper.estimator.weights import WeightPlan, parameter_count, weight_plan

__all__ = [
    "ACCOUNTINGS",
    "DEFAULT_VLLM_VERSION",
    "KV_DTYPES",
    "Accounting",
    "CalibrationTable",
    "Estimate",
    "Factor",
    "GpuTarget",
    "KvGroup",
    "KvLayout",
    "KvOptions",
    "ServeOptions",
    "SimpleEstimate",
    "StageEstimate",
    "WeightGroups",
    "WeightPlan",
    "accounting_for",
    "estimate",
    "kv_layout",
    "parameter_count",
    "parse_vllm_version",
    "scale_estimate",
    "simple_estimate",
    "weight_plan",
]

__getattr__, __dir__ = face(globals())
