"""The validating admission webhook: an ``AdmissionReview`` in, a ``WebhookDecision``, an
``AdmissionReview`` response out.

``POST /k8s/validate`` takes ``admission.k8s.io/v1`` reviews of Pods, Deployments,
StatefulSets, ReplicaSets, Jobs, CronJobs and LeaderWorkerSets. For every container that
runs vLLM (``gatekeeper.vllm.command``) it checks the GPUs requested against
``--tensor-parallel-size`` and, with the estimator, whether the model fits the GPU the pod
will land on (``gatekeeper.k8s.fit``), a speculative draft model resolved as the model
is and counted with it. The GPU comes from, in order: the annotation
``vllm-gatekeeper.io/gpu-memory`` (a size or a product), the ``nvidia.com/gpu.product`` node
selector or required node affinity (through the GPU table; the smallest when several),
the configured default; in cluster mode (``published``), the devices the cluster
publishes instead (``gatekeeper.k8s.fleet``). Outcomes:

- denied (``allowed: false``, ``status.code`` 403, ``status.message`` says what the model
  needs per GPU, what the GPU has and what would fit);
- allowed with ``warnings`` when it fits with less than the safety margin or when
  gatekeeper cannot tell (an unknown model or speculative draft model, by the same
  rule ``webhook_unknown_model``; an unknown GPU, unreadable values, flags the release's
  table lacks, an image whose tag names no vLLM release);
- allowed, saying so, when the template is annotated ``vllm-gatekeeper.io/skip: "true"``
  (the earlier ``gatekeeper.io/`` names are read for one release, with a warning);
- allowed silently when nothing runs vLLM, for deletes, sub-resources, objects being
  deleted and updates that leave the pod templates unchanged.

A body that is not an ``admission.k8s.io/v1`` AdmissionReview gets HTTP 400 with a
Kubernetes ``Status`` whose message says what is wrong; never a 500.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gatekeeper.cluster.claims import ClaimsMode
from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.options import ServeOptions, draft_reference
from gatekeeper.k8s.decisions import Judged, said
from gatekeeper.k8s.fit import (
    Case,
    Finding,
    GpuChoice,
    gpu_count_finding,
    gpu_from_value,
    judge,
    reading_findings,
    unknown_model_finding,
)
from gatekeeper.k8s.fleet import Fleet, choice, judge_published
from gatekeeper.k8s.limits import Budget, ReviewLimits, screen
from gatekeeper.k8s.node_scope import pod_scope
from gatekeeper.k8s.review import (
    MAX_BODY_BYTES,
    AdmissionRequest,
    AdmissionReview,
    Oversized,
    parse_review,
    review_body,
    review_response,
    too_large,
)
from gatekeeper.k8s.workloads import (
    GPU_MEMORY_ANNOTATION,
    LEGACY_ANNOTATIONS,
    SKIP_ANNOTATION,
    ContainerRequest,
    LineCache,
    PodTemplate,
    gpu_product_constraint,
    pod_templates,
    unread_text,
    unread_vllm_containers,
    vllm_containers,
)
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.nearby import MAX_NODE_GPUS
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.vllm.command import MODEL_ENV_VARS, VllmCommand
from gatekeeper.vllm.flags import model_location

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_MESSAGES",
    "AdmissionWebhook",
    "WebhookConfig",
    "WebhookDecision",
    "WebhookMetrics",
    "joined",
]

logger = logging.getLogger(__name__)

Outcome = Literal["allowed", "warned", "denied", "skipped", "ignored", "malformed"]
OUTCOMES: tuple[Outcome, ...] = ("allowed", "warned", "denied", "skipped", "ignored", "malformed")


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Plain values from the settings."""

    fit: PlacementPolicy = field(default_factory=PlacementPolicy)
    """The safety margin and default vLLM release (placement's own rules)."""
    default_gpu: GpuChoice | None = None
    """Assumed when a workload names no GPU; None: such workloads are warned about."""
    unknown_model: Literal["warn", "deny"] = "warn"
    max_node_gpus: int = MAX_NODE_GPUS
    """The most GPUs a suggestion puts on one node (``webhook_max_gpus_per_node``)."""
    claims: ClaimsMode | None = None
    """The mutating webhook's claims mode when it runs (its texts speak of claims)."""
    limits: ReviewLimits = field(default_factory=ReviewLimits)
    """What one review may hold and take (``gatekeeper.k8s.limits``)."""


@dataclass(frozen=True, slots=True)
class WebhookDecision:
    allowed: bool
    outcome: Outcome
    message: str = ""
    warnings: tuple[str, ...] = ()
    judged: tuple[Judged, ...] = ()
    """The vLLM containers judged, with their sizing (``decisions``: the log line, the
    audit annotations)."""


class WebhookMetrics:
    """``gatekeeper_webhook_reviews_total{outcome}`` and the review duration histogram."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reviews = Counter(
            "gatekeeper_webhook_reviews",
            "Admission reviews by outcome: allowed, warned, denied, skipped, ignored, malformed.",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.reviews.labels(outcome)
        self.duration = Histogram(
            "gatekeeper_webhook_review_duration_seconds",
            "Seconds to answer one admission review.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )


class AdmissionWebhook:
    """Reviews in, decisions out. ``resolve`` turns a model reference into a ``ModelSpec``
    (``resolve_model`` with the settings' hub options) and may raise ``GatekeeperError``."""

    def __init__(
        self,
        config: WebhookConfig,
        resolve: Callable[..., ModelSpec],
        *,
        metrics: WebhookMetrics | None = None,
        published: Callable[[], Fleet] | None = None,
    ) -> None:
        """``published`` (cluster mode, ``gatekeeper.k8s.published``) gives the devices the
        cluster publishes; with it, workloads are judged against those (``fleet``)."""
        self.config = config
        self._resolve = resolve
        self._published = published
        self._specs: dict[tuple[str, str], ModelSpec] = {}
        self.metrics = metrics

    # -- HTTP ------------------------------------------------------------------------

    async def endpoint(self, request: Request) -> Response:
        """``POST /k8s/validate``: the review is decided in a worker thread (a hub lookup
        may block)."""
        start = time.perf_counter()
        budget = Budget(self.config.limits.budget_seconds)
        body = await review_body(request, self.config.limits.review_bytes)
        if isinstance(body, Oversized):
            answer = too_large(body)
            self._count("denied" if answer.status_code == 200 else "malformed", start)
            return answer
        status, payload, outcome = await anyio.to_thread.run_sync(self.answer, body, budget)
        self._count(outcome, start)
        return JSONResponse(payload, status_code=status)

    def _count(self, outcome: Outcome, start: float) -> None:
        if self.metrics is not None:
            self.metrics.reviews.labels(outcome).inc()
            self.metrics.duration.observe(time.perf_counter() - start)

    def answer(
        self, body: bytes, budget: Budget | None = None
    ) -> tuple[int, dict[str, Any], Outcome]:
        """HTTP status, JSON body and outcome for a request body; ``budget``: the review's
        time, from its arrival (else from now)."""
        review = parse_review(body)
        if not isinstance(review, AdmissionReview):
            return review[0], review[1], "malformed"
        try:
            decision = self.decide(review.request, budget)
        except Exception as e:  # a bug: admit, say so, and keep the cluster working
            logger.exception("webhook: internal error on review %s", review.request.uid)
            decision = WebhookDecision(
                True,
                "warned",
                warnings=(f"gatekeeper: internal error ({type(e).__name__}); allowed unchecked",),
            )
        reason = decision.message or "\n".join(decision.warnings)
        speaks = decision.outcome in ("denied", "warned", "skipped")
        audit = said("validating", decision.outcome, review.request, decision.judged, reason,
                     always=speaks)  # fmt: skip
        answer = review_response(
            review, decision.allowed, decision.message, decision.warnings, audit=audit
        )
        return 200, answer, decision.outcome

    # -- decision --------------------------------------------------------------------

    def decide(self, request: AdmissionRequest, budget: Budget | None = None) -> WebhookDecision:
        """Allow, warn or deny one admission request (within ``budget``)."""
        kind, obj = request.kind.kind, request.object
        if request.operation not in ("CREATE", "UPDATE") or request.sub_resource or obj is None:
            return WebhookDecision(True, "ignored")
        templates = pod_templates(kind, obj)
        where = f"{kind} {request.namespace or _namespace(obj)}/{_name(obj, request)}"
        limits = self.config.limits
        over = screen(kind, obj, templates, where, limits)
        if over:
            return WebhookDecision(False, "denied", joined(over))
        metadata = obj.get("metadata")
        if not templates or (isinstance(metadata, dict) and metadata.get("deletionTimestamp")):
            return WebhookDecision(True, "ignored")
        old = request.old_object
        if (
            request.operation == "UPDATE"
            and old is not None
            and pod_templates(kind, old) == templates
        ):
            return WebhookDecision(True, "ignored")
        budget, lines = budget or Budget(limits.budget_seconds), LineCache()
        notes = [_legacy_text(where, old) for t in templates for old in t.legacy]
        findings: list[Finding] = []
        judged: list[Judged] = []
        skipped = [t for t in templates if _skipped(t)]
        if skipped == templates:
            return _combine([], [where], notes)
        for template in templates:
            part = f" ({template.path.rsplit('.', 1)[-1]})" if kind == "LeaderWorkerSet" else ""
            if template in skipped:
                findings.append(Finding("warn", _skip_text(f"{where}{part}")))
                continue
            read = vllm_containers(template, self.config.fit.default_vllm_version, lines)
            for done, container in enumerate(read):
                if budget.spent():
                    return WebhookDecision(False, "denied", budget.text(where, done))
                who = f"container {container.name!r} of {where}{part}"
                found = self._container(who, template, container, kind == "LeaderWorkerSet")
                findings += found
                sizing = next((f.sizing for f in found if f.sizing is not None), None)
                judged.append(Judged(container.name + part, container.command.model, sizing))
            findings += [
                Finding("warn", unread_text(f"container {name!r} of {where}{part}", words))
                for _, name, words in unread_vllm_containers(template, read)
            ]
        return dataclasses.replace(_combine(findings, [], notes), judged=tuple(judged))

    def _container(
        self, who: str, template: PodTemplate, container: ContainerRequest, multi_node: bool
    ) -> list[Finding]:
        command = container.command
        claims = self.config.claims
        count = gpu_count_finding(
            who, command, container.gpus, multi_node=multi_node, claims=claims
        )
        findings = [count] if count is not None else []
        if count is not None and count.outcome == "deny":
            return findings
        findings += reading_findings(who, command)
        spec = self.model_spec(who, command.model, command.options)
        fleet = self._published() if self._published is not None else None
        scope = pod_scope(who, fleet, template.spec)
        findings += [Finding("warn", scope.note)] if scope.note else []
        shapes = scope.shapes
        gpu = (choice(shapes[0]), []) if shapes else self.gpu_choice(who, template)
        for part in (spec, gpu):
            if isinstance(part, list):
                findings += part
        if isinstance(spec, ModelSpec) and isinstance(gpu, tuple):
            findings += gpu[1]
            draft = self.draft_spec(who, command)
            if isinstance(draft, Finding):
                return [*findings, draft]
            case = Case(spec, command, gpu[0], self.config.fit, draft=draft, multi_node=multi_node,
                        max_node_gpus=self.config.max_node_gpus, claims=claims)  # fmt: skip
            findings += (
                judge_published(who, case, shapes, scope.text) if shapes else judge(who, case)
            )
        return findings

    def draft_spec(self, who: str, command: VllmCommand) -> ModelSpec | Finding | None:
        """The speculative draft model, resolved as the target is (and cached with it)."""
        reference = draft_reference(command.options)
        if reference is None:
            return None
        try:
            return self._resolved(reference)
        except GatekeeperError as e:
            return unknown_model_finding(who, reference, e, self.config.unknown_model, draft=True)

    def _resolved(self, model: str, options: ServeOptions | None = None) -> ModelSpec:
        """``resolve`` (with the revision, download dir and config overrides the command
        line gives), remembered (a bounded cache); raises its ``GatekeeperError``."""
        located = model_location(options) if options is not None else {}
        key = (model, json.dumps(located, sort_keys=True))
        cached = self._specs.get(key)
        if cached is not None:
            return cached
        spec = self._resolve(model, **located)
        if len(self._specs) >= 256:
            self._specs.clear()
        self._specs[key] = spec
        return spec

    def model_spec(
        self, who: str, model: str | None, options: ServeOptions | None = None
    ) -> ModelSpec | list[Finding]:
        """The model's spec, or the findings that say why it cannot be had."""
        if model is None:
            return [
                Finding(
                    "warn",
                    f"{who}: cannot tell whether it fits: no model on the command line nor in a "
                    f"literal {', '.join(MODEL_ENV_VARS)} (valueFrom cannot be read at admission)",
                )
            ]
        try:
            return self._resolved(model, options)
        except GatekeeperError as e:
            return [unknown_model_finding(who, model, e, self.config.unknown_model)]

    def gpu_choice(
        self, who: str, template: PodTemplate
    ) -> tuple[GpuChoice, list[Finding]] | list[Finding]:
        """The GPU the template will land on (annotation, product selector, default) with
        notes, or the findings that say why none is known."""
        annotated = template.annotations.get(GPU_MEMORY_ANNOTATION)
        if annotated is not None:
            try:
                return gpu_from_value(annotated, f"annotation {GPU_MEMORY_ANNOTATION}"), []
            except GatekeeperError as e:
                return [Finding("deny", f"{who}: {e}")]
        products, where = gpu_product_constraint(template.spec)
        known: list[GpuChoice] = []
        unknown: list[str] = []
        for product in products:
            try:
                known.append(gpu_from_value(product, f"{where}={product}"))
            except GatekeeperError:
                unknown.append(product)
        notes = [
            Finding(
                "warn",
                f"{who}: cannot tell whether it fits on {p!r} ({where}): not in gatekeeper's GPU "
                f"table; annotate the pod template {GPU_MEMORY_ANNOTATION}: <memory, e.g. 79.19GiB>",
            )
            for p in unknown
        ]
        if known:
            return min(known, key=lambda g: g.total_bytes), notes
        if notes:
            return notes
        if self.config.default_gpu is not None:
            return self.config.default_gpu, []
        return [
            Finding(
                "warn",
                f"{who}: cannot tell whether it fits: no GPU named; set nodeSelector "
                f"nvidia.com/gpu.product, annotate {GPU_MEMORY_ANNOTATION}, or set "
                "GATEKEEPER_WEBHOOK_DEFAULT_GPU",
            )
        ]


MAX_MESSAGES = 16
"""The most reasons one answer lists (a pod of 500 containers denied 500 times says 16
and how many more)."""


def joined(messages: list[str]) -> str:
    """``messages``, one a line, the first ``MAX_MESSAGES`` of them and a count of the rest."""
    unique = list(dict.fromkeys(messages))
    shown = unique[:MAX_MESSAGES]
    more = len(unique) - len(shown)
    return "\n".join(shown + ([f"... and {more} more"] if more else []))


def _namespace(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def _name(obj: Mapping[str, Any], request: AdmissionRequest) -> str:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    for key, suffix in (("name", ""), ("generateName", "*")):
        value = metadata.get(key)
        if isinstance(value, str) and value:
            return value + suffix
    return request.name or "(unnamed)"


def _skipped(template: PodTemplate) -> bool:
    return template.annotations.get(SKIP_ANNOTATION, "").strip().lower() == "true"


def _skip_text(where: str) -> str:
    return f"{where}: {SKIP_ANNOTATION} is true, so gatekeeper skipped its GPU memory check"


def _legacy_text(where: str, old: str) -> str:
    return (
        f"{where}: annotation {old} is deprecated (OPA Gatekeeper owns the gatekeeper names); "
        f"rename it {LEGACY_ANNOTATIONS[old]}: the old name is read until the next release"
    )


def _combine(findings: list[Finding], skipped: list[str], notes: list[str]) -> WebhookDecision:
    """The decision from the findings; ``notes`` (deprecations) are warnings that never
    change a skip into a warning."""
    denials = [f.message for f in findings if f.outcome == "deny" and f.message]
    warnings = [f.message for f in findings if f.outcome == "warn" and f.message]
    warnings += [_skip_text(where) for where in skipped] + notes
    unique = tuple(dict.fromkeys(warnings))
    if denials:
        return WebhookDecision(False, "denied", joined(denials), unique)
    if skipped and not findings:
        return WebhookDecision(True, "skipped", warnings=unique)
    return WebhookDecision(True, "warned" if unique else "allowed", warnings=unique)
