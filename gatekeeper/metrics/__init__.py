"""gatekeeper's Prometheus metrics: the collectors read at scrape time and the sidecar's
event metrics.

Names follow Prometheus' conventions: the ``gatekeeper_`` prefix, base units (bytes,
seconds), ``_total`` on counters, ``_ratio`` on ratios, and ``gatekeeper_build_info``.

- ``GpuCollector(inventory, promised, margin, node=)`` reads the GPUs **at scrape
  time**, as ``prometheus_client``'s ``ProcessCollector`` reads ``/proc``: per GPU
  (DCGM exporter's labels ``gpu``, ``UUID``, ``modelName``, ``device``, ``Hostname``,
  and kube-state-metrics' ``node``) total, used, free, promised-by-gatekeeper (pending
  admissions; ``…_reserved_bytes`` is its deprecated name) and headroom bytes, and
  ``gatekeeper_gpu_healthy``. It always yields its own health series first
  (``gatekeeper_gpu_collect_success``, ``…_duration_seconds``, ``…_errors_total``): a
  failed snapshot, or an exception from the inventory or the reservations, never
  breaks the scrape. Headroom is ``free - promised - margin`` (what placement could
  still promise; it can be negative), for placeable GPUs only; an unhealthy GPU has
  only ``gatekeeper_gpu_healthy 0``.
- ``WorkerCollector`` and ``WorkerView`` (``workers``): predicted versus actual memory
  per worker, and what a starting worker has yet to take of its promise.
- ``CalibrationCollector(factors)``: ``gatekeeper_calibration_factor_ratio``.
- ``SidecarMetrics(registry)`` (``events``):
  instrumentation objects for events: admissions by outcome and reason, reservations
  outstanding, launch durations, proxied requests and their latency (it is the
  proxy's ``ProxyMetrics``), and the prediction error histogram observed once per
  worker when it becomes ready.

- ``register_collectors(registry, sources)`` (``wiring``): all of the above on one
  registry, reading a ``MetricSources`` (the ledger's promises, the deployments, the
  calibration factors, …); the sidecar's ``build_app`` and the tests' fixture node both
  call it, and ``docs/metrics.md`` has a row for every family it registers.

- ``metrics_endpoint(registry)`` (``exposition``): ``GET /metrics`` for the sidecar and
  the webhook, with ``prometheus_client``'s own content negotiation (OpenMetrics, gzip).

**Cardinality** is bounded by construction: the GPU labels by the node's GPUs
(``Hostname``/``node`` are one value per sidecar); ``reason``/``outcome``/``component``/``state`` are closed sets; ``model`` on the
proxy's series is a configured model or ``other`` (a client can send any name);
``code`` is an HTTP status; ``family`` is a configured model's ``model_type``.

May import: ``gatekeeper.placement`` (decisions and the policy's margin),
``gatekeeper.gpus``, ``gatekeeper.units``, ``prometheus_client``, and ``starlette`` and
``anyio`` for the endpoint.
"""

from gatekeeper.metrics.events import SidecarMetrics, decision_reason, status_reason
from gatekeeper.metrics.exposition import metrics_endpoint
from gatekeeper.metrics.gpus import CalibrationCollector, GpuCollector, policy_margin
from gatekeeper.metrics.wiring import MetricSources, SidecarCollectors, register_collectors
from gatekeeper.metrics.workers import (
    COMPONENTS,
    WORKER_STATES,
    Component,
    WorkerCollector,
    WorkerView,
    actual_components,
    predicted_components,
)

__all__ = [
    "COMPONENTS",
    "WORKER_STATES",
    "CalibrationCollector",
    "Component",
    "GpuCollector",
    "MetricSources",
    "SidecarCollectors",
    "SidecarMetrics",
    "WorkerCollector",
    "WorkerView",
    "actual_components",
    "decision_reason",
    "metrics_endpoint",
    "policy_margin",
    "predicted_components",
    "register_collectors",
    "status_reason",
]
