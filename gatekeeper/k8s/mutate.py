"""The mutating admission webhook: a vLLM workload gets a DRA claim of the bytes its ranks
need, and the flags that hold its worker to them (issue 29; ``docs/cluster.md``).

``POST /k8s/mutate`` takes ``admission.k8s.io/v1`` reviews of Pods, Deployments,
StatefulSets and LeaderWorkerSets (other kinds with a pod template too). For each pod
template and each container that runs vLLM (read as the validating webhook reads it, with
the flag table of the image's release), with no claims of its own:

1. the model and the GPU are found as the validating webhook finds them
   (``AdmissionWebhook.model_spec``, ``.draft_spec``, ``.gpu_choice``: the annotation,
   the product selector, ``webhook_default_gpu``; a workload with none of them is sized on
   the largest GPU in gatekeeper's table);
2. ``gatekeeper.cluster.claims.size_ranks`` sizes each rank as the sidecar's placement
   sizes a worker that shares its GPUs, and ``claim_template_spec`` writes the
   ResourceClaimTemplate (one request per rank of ``capacity.requests.memory``, the CEL
   selector the quantization needs, one node and distinct GPUs for several ranks), named by
   a hash of its spec;
3. the template is created through the API by ``ensure`` (the caller's I/O; skipped on a
   dry run, which is why the configuration says ``sideEffects: NoneOnDryRun``), and the
   response's JSON Patch puts the claim in the pod template (``spec.resourceClaims``, the
   container's ``resources.claims`` in place of ``nvidia.com/gpu``), the flags on the
   command line and the annotation ``vllm-gatekeeper.io/claim`` (``claim_annotation``).

The claims mode (``mode``, setting ``webhook_claims_mode``) says whose GPUs the request
names: ``gatekeeper`` (the template above, against gatekeeper's DeviceClass), ``nvidia-dra``
(the same template against NVIDIA's DRA driver's class and attribute names), or ``hami``
(no DRA: no template; the container's limits get HAMi's ``nvidia.com/gpu`` and
``nvidia.com/gpumem``). The flags are the same in every mode, and the record names the mode.

Left alone: an update that leaves the pod templates as they were; a template annotated
``vllm-gatekeeper.io/skip``; one gatekeeper already mutated while its record holds
(``claim_record.intact``: applying the manifest again changes nothing); one with claims of its own, unless a request is smaller than a rank needs: then
it is denied or warned about (``undersized``). Denied, with the reason and nothing
mutated: a ``vllm serve`` line whose model or values cannot be read, a shell script whose
expansions cannot be resolved, a model that fits no GPU, a template that cannot be
created. A review that trips a bug is allowed unmutated with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gatekeeper.cluster.claim_annotation import CLAIM_ANNOTATION, entry
from gatekeeper.cluster.claims import (
    CLAIM_NAME,
    ClaimsMode,
    RankSizing,
    claim_driver,
    claim_template,
    claim_template_spec,
    hami_resources,
    ours,
    size_ranks,
    template_name,
)
from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.products import gpu_products
from gatekeeper.k8s.claim_record import intact
from gatekeeper.k8s.decisions import Judged, Sizing, said
from gatekeeper.k8s.fit import Finding
from gatekeeper.k8s.limits import Budget, screen, too_many_templates
from gatekeeper.k8s.mutation_texts import internal_error, unreadable
from gatekeeper.k8s.own_requests import asks_itself, check_own, template_reader
from gatekeeper.k8s.pod_patch import (
    pointer,
    reads_back,
    template_ops,
    unread_script,
    unread_scripts,
    with_budget_flags,
    with_claim,
    with_resources,
)
from gatekeeper.k8s.review import AdmissionRequest, AdmissionReview, parse_review, review_response
from gatekeeper.k8s.webhook import AdmissionWebhook, joined
from gatekeeper.k8s.workloads import (
    SKIP_ANNOTATION,
    ContainerRequest,
    LineCache,
    PodTemplate,
    pod_templates,
    unread_text,
    unread_vllm_containers,
    vllm_containers,
)
from gatekeeper.models.spec import ModelSpec
from gatekeeper.vllm.launch import release_budget

__all__ = ["CLAIM_NAME", "Mutation", "Mutator", "NamespaceScope", "TemplateStore"]

logger = logging.getLogger(__name__)

MutationOutcome = Literal["mutated", "unchanged", "warned", "denied", "ignored", "malformed"]


class NamespaceScope(Protocol):
    """Where templates may be created (``template_store.ApiNamespaceScope``)."""

    def excluded(self, namespace: str) -> str | None:
        """Why nothing is written for ``namespace`` (None: it may be); ``GatekeeperError``
        when that cannot be told."""


class TemplateStore(Protocol):
    """The API the mutating webhook needs (``gatekeeper.k8s.template_store``)."""

    def ensure(self, template: Mapping[str, Any]) -> None:
        """Create the ResourceClaimTemplate unless it exists; ``GatekeeperError`` else."""

    def read(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A ResourceClaimTemplate as a dict, None when there is none."""

    def to_bytes(self, quantity: str) -> int:
        """A Kubernetes quantity in bytes; ``ValueError`` when it is not one."""


@dataclass(slots=True)
class Mutation:
    """What the review of one object comes to, and what the review has read and sized
    so far (identical containers are read and sized once)."""

    outcome: MutationOutcome = "unchanged"
    denials: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    lines: LineCache = field(default_factory=dict, repr=False, compare=False)
    sized: dict[tuple[object, ...], RankSizing | str] = field(
        default_factory=dict, repr=False, compare=False
    )
    budget: Budget | None = field(default=None, repr=False, compare=False)
    judged: list[Judged] = field(default_factory=list, repr=False, compare=False)
    """The vLLM containers sized, with their sizing (``decisions``)."""

    def add(self, findings: list[Finding]) -> None:
        for f in findings:
            target = self.denials if f.outcome == "deny" else self.warnings
            if f.outcome != "allow" and f.message:
                target.append(f.message)


@dataclass(frozen=True, slots=True)
class _Container:
    """One vLLM container being sized: where it is and what it runs."""

    who: str
    index: int
    request: ContainerRequest
    raw: Mapping[str, Any]


class Mutator:
    """Reviews in, JSON Patches out. ``webhook`` finds models and GPUs as the validating
    webhook does; ``store`` creates and reads claim templates; ``undersized``: what to do
    with a hand-written claim smaller than a rank needs; ``mode``: whose GPUs it claims;
    ``scope``: the namespaces its configuration selects (None: every one)."""

    def __init__(
        self,
        webhook: AdmissionWebhook,
        store: TemplateStore,
        *,
        undersized: Literal["warn", "deny"] = "deny",
        mode: ClaimsMode = "gatekeeper",
        count: Callable[[MutationOutcome], None] | None = None,
        scope: NamespaceScope | None = None,
    ) -> None:
        self.webhook = webhook
        self.store = store
        self.scope = scope
        self.undersized = undersized
        self.mode = mode
        self._count = count

    def counted(self, outcome: MutationOutcome) -> None:
        if self._count is not None:
            self._count(outcome)

    def answer(
        self, body: bytes, budget: Budget | None = None
    ) -> tuple[int, dict[str, Any], MutationOutcome]:
        """HTTP status, JSON body and outcome for a request body; ``budget``: the review's
        time, from its arrival (else from now)."""
        budget = budget or Budget(self.webhook.config.limits.budget_seconds)
        review = parse_review(body)
        if not isinstance(review, AdmissionReview):
            return review[0], review[1], "malformed"
        try:
            m = self.decide(review.request, budget)
        except Exception as e:  # a bug: deny, as a webhook that is down is under Fail
            logger.exception("mutating webhook: internal error on review %s", review.request.uid)
            m = Mutation("denied", denials=[internal_error(e)])
        warnings = tuple(dict.fromkeys(m.warnings))
        allowed = not m.denials
        reason = joined(m.denials) or "\n".join(warnings)
        speaks = bool(warnings) or m.outcome == "denied"
        audit = said("mutating", m.outcome, review.request, m.judged, reason, always=speaks)
        payload = review_response(
            review, allowed, joined(m.denials), warnings, m.patch, audit=audit
        )
        return 200, payload, m.outcome

    def decide(self, request: AdmissionRequest, budget: Budget | None = None) -> Mutation:
        """The mutation of one request; creates the templates it names unless a dry run."""
        kind, obj = request.kind.kind, request.object
        if request.operation not in ("CREATE", "UPDATE") or request.sub_resource or obj is None:
            return Mutation("ignored")
        raw_metadata = obj.get("metadata")
        metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
        if metadata.get("deletionTimestamp"):
            return Mutation("ignored")
        templates = pod_templates(kind, obj)
        namespace = str(request.namespace or metadata.get("namespace") or "default")
        where = f"{kind} {namespace}/{metadata.get('name') or metadata.get('generateName', '')}"
        limits = self.webhook.config.limits
        over = screen(kind, obj, templates, where, limits)
        if over:
            return Mutation("denied", denials=over)
        outside = self._outside(namespace, where)
        if outside is not None:
            return outside
        old = request.old_object
        if request.operation == "UPDATE" and old and pod_templates(kind, old) == templates:
            return Mutation("ignored")  # a label, replicas...: no rollout of gatekeeper's making
        m = Mutation(budget=budget or Budget(limits.budget_seconds))
        for template in templates:
            if template.annotations.get(SKIP_ANNOTATION, "").strip().lower() != "true":
                self._template(m, kind, obj, template, namespace, where)
        return self._finish(m, request.dry_run, where)

    def _outside(self, namespace: str, where: str) -> Mutation | None:
        """The answer to a review of a namespace the configuration does not select
        (nothing written, said), or to one whose scope cannot be told (denied); None when
        the namespace is selected."""
        if self.scope is None:
            return None
        try:
            why = self.scope.excluded(namespace)
        except GatekeeperError as e:
            return Mutation("denied", denials=[f"{where}: {e}"])
        return Mutation("ignored", warnings=[f"{where}: {why}"]) if why is not None else None

    def _finish(self, m: Mutation, dry_run: bool, where: str) -> Mutation:
        cap = self.webhook.config.limits.templates_per_review
        if len(m.templates) > cap and not m.denials:
            m.denials.append(too_many_templates(where, len(m.templates), cap))
        if m.denials:
            m.patch, m.outcome = [], "denied"
            return m
        if not dry_run:
            for done, template in enumerate(m.templates):
                if m.budget is not None and m.budget.spent():
                    text = f"{m.budget.text(where, len(m.lines))}; {done} claim templates created"
                    return Mutation("denied", denials=[text], warnings=m.warnings)
                try:
                    self.store.ensure(template)
                except GatekeeperError as e:
                    return Mutation("denied", denials=[str(e)], warnings=m.warnings)
        if m.patch:
            m.outcome = "mutated"
        elif m.warnings:
            m.outcome = "warned"
        return m

    def _template(
        self,
        m: Mutation,
        kind: str,
        obj: Mapping[str, Any],
        template: PodTemplate,
        namespace: str,
        where: str,
    ) -> None:
        part = f" ({template.path.rsplit('.', 1)[-1]})" if kind == "LeaderWorkerSet" else ""
        containers = list(template.spec.get("containers") or [])
        version = self.webhook.config.fit.default_vllm_version
        found = [
            _Container(f"container {c.name!r} of {where}{part}", i, c, containers[i])
            for c in vllm_containers(template, version, m.lines)
            for i in [_index(c.path)]
        ]
        multi = kind == "LeaderWorkerSet"
        m.denials += unread_scripts(containers, {c.index for c in found}, where)
        m.warnings += [  # the scripts above are denied; other unread mentions, said
            unread_text(f"container {name!r} of {where}{part}", words, "no claim is written")
            for i, name, words in unread_vllm_containers(template, [c.request for c in found])
            if unread_script(containers[i]) is None
        ]
        if not found or intact(template, [c.request for c in found]):
            return  # nothing runs vLLM, or gatekeeper mutated it and it still reads so
        raws = [c.raw for c in found]
        hami = self.mode == "hami"
        if CLAIM_ANNOTATION not in template.annotations and asks_itself(template.spec, raws, hami):
            for c in found:
                self._check_own(m, c, template, namespace, multi)
            return
        self._write(m, obj, template, namespace, found, multi)

    def _write(
        self,
        m: Mutation,
        obj: Mapping[str, Any],
        template: PodTemplate,
        namespace: str,
        found: list[_Container],
        multi: bool,
    ) -> None:
        """Each container sized and edited, its claim template (or HAMi's resources), and
        the pod template's patch."""
        driver = claim_driver(self.mode)
        edits: dict[int, Mapping[str, Any]] = {}
        claims: list[dict[str, str]] = []
        record: dict[str, Any] = {}
        for done, c in enumerate(found):
            if m.budget is not None and m.budget.spent():
                m.denials.append(m.budget.text(c.who.split(" of ", 1)[1], done))
                return
            sizing = self._size(m, c, template, multi)
            edited = self._edited(m, c, sizing) if sizing is not None else None
            if sizing is None or edited is None:
                continue
            if driver is None:
                edits[c.index] = with_resources(edited, hami_resources(sizing))
                record[c.request.name] = entry(None, sizing, self.mode)
                continue
            spec = claim_template_spec(sizing, driver)
            name, claim = template_name(spec), CLAIM_NAME + (f"-{len(claims)}" if claims else "")
            if all(t["metadata"]["name"] != name for t in m.templates):
                m.templates.append(claim_template(namespace, spec))
                cap = self.webhook.config.limits.templates_per_review
                if len(m.templates) > cap:  # stop here: the review is denied
                    where = c.who.split(" of ", 1)[1]
                    m.denials.append(too_many_templates(where, len(m.templates), cap))
                    return
            edits[c.index] = with_claim(edited, claim)
            claims.append({"name": claim, "resourceClaimTemplateName": name})
            record[c.request.name] = entry(name, sizing, self.mode)
        if edits:
            current = list(template.spec.get("resourceClaims") or [])
            kept = [e for e in current if not ours(e)]
            pod_claims = [*kept, *claims] if claims or len(kept) != len(current) else None
            note = (CLAIM_ANNOTATION, json.dumps(record, sort_keys=True))
            raw = _dig(obj, template.path)
            m.patch += template_ops(pointer(template.path), raw, edits, pod_claims, note)

    def _edited(self, m: Mutation, c: _Container, sizing: RankSizing) -> dict[str, Any] | None:
        """The container with the flags written, or None with the reason in ``m``."""
        kv, u = sizing.kv_cache_memory_bytes, sizing.gpu_memory_utilization
        release = c.request.command.vllm_version
        if not release_budget(release).byte_budget:
            m.denials.append(
                f"{c.who}: vLLM {release} has no --kv-cache-memory-bytes (it came in 0.10.2), "
                "so a claim of bytes cannot hold its worker to them; run vLLM 0.10.2 or later, "
                "write the claim yourself or annotate vllm-gatekeeper.io/skip"
            )
            return None
        command = c.request.command
        edited = with_budget_flags(c.raw, kv, u, lambda e: reads_back(e, command, kv, u, m.lines))
        if isinstance(edited, str):
            m.denials.append(f"{c.who}: cannot write the flags: {edited}")
            return None
        if not reads_back(edited, command, kv, u, m.lines):
            m.denials.append(
                f"{c.who}: the flags written into its command line do not read back as "
                "written; write the claim yourself or annotate vllm-gatekeeper.io/skip"
            )
            return None
        return edited

    def _size(
        self, m: Mutation, c: _Container, template: PodTemplate, multi_node: bool
    ) -> RankSizing | None:
        """The container's sizing, or None with the reasons in ``m``."""
        command = c.request.command
        unread = unreadable(c.who, command)
        if unread:
            m.denials.append(unread)
            return None
        if command.unknown:
            m.warnings.append(f"{c.who}: {'; '.join(command.unknown)}; sized without them")
        spec = self.webhook.model_spec(c.who, command.model, command.options)
        if not isinstance(spec, ModelSpec):
            m.add(spec)
            return None
        draft = self.webhook.draft_spec(c.who, command)
        if isinstance(draft, Finding):
            m.add([draft])
            return None
        total, name = self._gpu(m, c, template)
        options = command.options
        if options.kv_cache_memory_bytes is None:  # a fraction of an unknown GPU means nothing
            options = _without_fraction(options)
        ranks = (c.request.gpus or options.tensor_parallel_size) if multi_node else None
        key = (id(spec), options, total, name, id(draft), ranks)
        sized = m.sized.get(key)
        if sized is None:
            try:
                sized = size_ranks(
                    spec, options, total, name, self.webhook.config.fit, draft=draft, ranks=ranks
                )
            except GatekeeperError as e:
                sized = str(e)
            m.sized[key] = sized
        if isinstance(sized, str):
            m.denials.append(f"{c.who}: cannot size a claim: {sized}")
            return None
        m.judged.append(Judged(c.request.name, command.model, _sizing(sized, name)))
        return sized

    def _gpu(self, m: Mutation, c: _Container, template: PodTemplate) -> tuple[int, str]:
        """The GPU to size on: the template's (as the validating webhook finds it), else
        the largest in gatekeeper's table."""
        found = self.webhook.gpu_choice(c.who, template)
        if isinstance(found, tuple):
            m.add(found[1])
            gpu = found[0]
            return gpu.total_bytes, gpu.label
        largest = max(gpu_products(), key=lambda p: p.total_bytes)
        return largest.total_bytes, largest.name

    def _check_own(
        self, m: Mutation, c: _Container, template: PodTemplate, namespace: str, multi: bool
    ) -> None:
        """A workload's own request is left alone unless it is smaller than a rank."""
        scratch = Mutation()
        sizing = self._size(scratch, c, template, multi)
        m.judged += scratch.judged
        if sizing is None:
            return
        read = template_reader(self.store, namespace)
        found = check_own(c.who, template.spec, c.raw, sizing, read, self.undersized)
        m.denials += found.denials
        m.warnings += found.warnings


def _sizing(sized: RankSizing, gpu: str) -> Sizing:
    """A claim's sizing as the decision line and the audit annotations say it."""
    return Sizing(sized.rank_bytes, sized.ranks, sized.max_model_len, sized.sequences, gpu)


def _dig(obj: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    for part in (p for p in path.split(".") if p):
        obj = obj.get(part) or {}
    return obj


def _index(path: str) -> int:
    """The container's index in its ``…containers[i]`` path."""
    return int(path.rsplit("[", 1)[1].rstrip("]"))


def _without_fraction(options: ServeOptions) -> ServeOptions:
    return dataclasses.replace(options, gpu_memory_utilization=None)
