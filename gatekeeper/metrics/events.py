"""The sidecar's event metrics: ordinary instrumentation objects on an injected registry.

``SidecarMetrics(registry)`` holds admissions by outcome and reason, reservations
outstanding (read at scrape time), the launch duration histogram, proxied requests by
model and status code with their latency (it is the proxy's ``ProxyMetrics``), the
prediction error histogram observed once per worker when it becomes ready, and
``gatekeeper_build_info``.

**Cardinality.** ``outcome``/``reason``/``component`` are closed sets (all of their
series exist from the start, at 0). ``model`` is a configured model or ``other``: a
client can send any name, so names outside ``known_models`` (or beyond the first
``max_models`` seen when that is not given) are counted as ``other``. ``code`` is an
HTTP status code.

**Cost per request.** ``observe`` is on the proxy's path, once per request (never per
streamed chunk): the labelled children are kept per ``(label, code)`` instead of asked of
``labels()`` each time, and a model found in ``known_models`` is remembered for
``KNOWN_MODELS_SECONDS`` instead of building the set per request; a name not found asks
again each time, so a model deployed a moment ago is counted under its name at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Literal

from prometheus_client import Counter, Gauge, Histogram, Info
from prometheus_client.registry import CollectorRegistry

from gatekeeper._version import __version__
from gatekeeper.metrics.sleep import SleepMetrics
from gatekeeper.metrics.workers import COMPONENTS, WorkerView
from gatekeeper.placement.types import Decision

__all__ = [
    "ADMISSION_REASONS",
    "ERROR_BUCKETS",
    "KNOWN_MODELS_SECONDS",
    "LATENCY_BUCKETS",
    "LAUNCH_BUCKETS",
    "OTHER_MODEL",
    "AdmissionReason",
    "SidecarMetrics",
    "decision_reason",
    "status_reason",
]

logger = logging.getLogger(__name__)

AdmissionReason = Literal[
    "fits", "does_not_fit", "no_gpu", "not_allowed", "bad_request", "conflict", "error"
]
ADMISSION_REASONS: Mapping[AdmissionReason, str] = {
    "fits": "admitted",
    "does_not_fit": "rejected",
    "no_gpu": "rejected",
    "not_allowed": "rejected",
    "bad_request": "rejected",
    "conflict": "rejected",
    "error": "error",
}
"""Every ``reason`` label and its ``outcome``: ``fits`` (admitted); ``does_not_fit``
(no GPU group has room); ``no_gpu`` (no healthy, unfenced, allowed GPU at all);
``not_allowed`` (the model is not in the allowed set); ``bad_request`` (invalid model
or options); ``conflict`` (already deployed); ``error`` (anything else)."""

_UNUSABLE = ("unhealthy", "fenced", "not allowed")

OTHER_MODEL = "other"
"""The ``model`` label of proxied requests for a model that is not configured."""
KNOWN_MODELS_SECONDS = 1.0
"""How long a model found in ``known_models`` keeps its own label without asking again."""

LAUNCH_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ERROR_BUCKETS = (-0.5, -0.25, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


def decision_reason(decision: Decision) -> AdmissionReason:
    """The ``reason`` label of a placement decision."""
    if decision.admitted:
        return "fits"
    if all(line.status.startswith(_UNUSABLE) for line in decision.gpus):
        return "no_gpu"
    return "does_not_fit"


_STATUS_REASONS: Mapping[int, AdmissionReason] = {
    400: "bad_request",
    403: "not_allowed",
    404: "not_allowed",
    409: "conflict",
    422: "bad_request",
    507: "does_not_fit",
}


def status_reason(status: int) -> AdmissionReason:
    """The ``reason`` label of a deployment request refused with an HTTP status."""
    return _STATUS_REASONS.get(status, "error")


class SidecarMetrics:
    """The sidecar's event metrics on an injected registry; also the proxy's
    ``ProxyMetrics`` (``observe``).

    ``known_models`` gives the configured model names: a proxied request for any other
    name is counted under ``model="other"``. Without it, the first ``max_models``
    names seen are kept and later ones become ``other``. ``outstanding`` counts the
    ledger's outstanding reservations at scrape time.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        known_models: Callable[[], Collection[str]] | None = None,
        outstanding: Callable[[], int] | None = None,
        max_models: int = 64,
        version: str = __version__,
    ) -> None:
        self._known = known_models
        self._max_models = max_models
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._known_names: set[str] = set()
        self._known_until = 0.0
        self._children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        r = registry
        self.admissions = Counter(
            "gatekeeper_admissions", "Admission decisions by outcome and reason.",
            ["outcome", "reason"], registry=r,
        )  # fmt: skip
        for reason, outcome in ADMISSION_REASONS.items():
            self.admissions.labels(outcome, reason)
        self.reservations = Gauge(
            "gatekeeper_reservations_outstanding",
            "Reservations (one per worker and GPU) promised to workers still starting.",
            registry=r,
        )
        self.reservations.set_function(_safe(outstanding or (lambda: 0)))
        self.launch = Histogram(
            "gatekeeper_worker_launch_duration_seconds",
            "Seconds from a worker's launch to its readiness.",
            ["model"], buckets=LAUNCH_BUCKETS, registry=r,
        )  # fmt: skip
        self.unhealthy = Counter(
            "gatekeeper_worker_unhealthy",
            "Ready workers that stopped answering /health (liveness) and were taken out.",
            ["model"], registry=r,
        )  # fmt: skip
        self.requests, self.latency = _proxy_metrics(r)
        self.prediction_error = Histogram(
            "gatekeeper_prediction_error_ratio",
            "(actual - predicted) / predicted per component, once per worker when ready.",
            ["component"], buckets=ERROR_BUCKETS, registry=r,
        )  # fmt: skip
        for component in COMPONENTS:
            self.prediction_error.labels(component)
        self.sleep = SleepMetrics(r)
        """Workers put to sleep and woken (``idle_action = "sleep"``)."""
        Info("gatekeeper_build", "gatekeeper's version.", registry=r).info({"version": version})

    def admission(self, reason: AdmissionReason) -> None:
        """Count one admission decision (``decision_reason``/``status_reason``)."""
        if reason not in ADMISSION_REASONS:
            reason = "error"
        self.admissions.labels(ADMISSION_REASONS[reason], reason).inc()

    def decision(self, decision: Decision) -> None:
        self.admission(decision_reason(decision))

    def observe(self, model: str, status: int, seconds: float) -> None:
        """``ProxyMetrics.observe``: one proxied request."""
        label = self._model_label(model)
        children = self._children.get((label, status))
        if children is None:
            children = (self.requests.labels(label, str(status)), self.latency.labels(label))
            self._children[label, status] = children
        children[0].inc()
        children[1].observe(seconds)

    def worker_ready(self, view: WorkerView, launch_seconds: float | None = None) -> None:
        """Call once when a worker becomes ready: launch time and prediction error (and
        its model's unhealthy count shows 0 from then on)."""
        self.unhealthy.labels(self._model_label(view.model))
        if launch_seconds is not None:
            self.launch.labels(view.model).observe(launch_seconds)
        for component in COMPONENTS:
            predicted = view.predicted.get(component)
            actual = view.actual.get(component)
            if predicted and actual is not None:
                self.prediction_error.labels(component).observe((actual - predicted) / predicted)

    def worker_unhealthy(self, model: str) -> None:
        """Count a ready worker that failed its liveness probes (``health_failures``)."""
        self.unhealthy.labels(self._model_label(model)).inc()

    def _model_label(self, model: str) -> str:
        if self._known is not None:
            now = time.monotonic()
            if now >= self._known_until:
                self._known_names, self._known_until = set(), now + KNOWN_MODELS_SECONDS
            if model in self._known_names:
                return model
            try:
                known = model in self._known()
            except Exception:
                logger.exception("proxy metrics: reading the configured models failed")
                return OTHER_MODEL
            if known:
                self._known_names.add(model)
            return model if known else OTHER_MODEL
        with self._lock:
            if model in self._seen:
                return model
            if len(self._seen) < self._max_models:
                self._seen.add(model)
                return model
        return OTHER_MODEL


def _proxy_metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    requests = Counter(
        "gatekeeper_proxy_requests",
        "Requests the proxy answered, by model and HTTP status code.",
        ["model", "code"],
        registry=registry,
    )
    latency = Histogram(
        "gatekeeper_proxy_request_duration_seconds",
        "Seconds from a request's arrival to the end of its response.",
        ["model"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    return requests, latency


def _safe(read: Callable[[], int]) -> Callable[[], float]:
    def value() -> float:
        try:
            return float(read())
        except Exception:
            logger.exception("metrics: a gauge callback failed")
            return float("nan")

    return value
