"""Whether one vLLM container fits the GPU it will land on, in words an operator can act on.

Pure: a ``Case`` (a ``ModelSpec`` and the speculative draft's, resolved by the caller as
it resolved the target: ``gatekeeper.estimator.options.draft_reference``; the container's
``VllmCommand``; the GPU it will run on; the rules) in; a ``Finding``
(allow, warn or deny, with its message) out. The estimator judges the flags as given,
every flag it models (LoRA slots, the draft, CPU offload, DP/EP, ...), the way vLLM
will at start-up (its budget is ``gpu_memory_utilization x total``)::

    need  = weights (+ LoRA slots, + the draft, - what --cpu-offload-gb keeps in host
            memory) + non-torch + activation peak [+ CUDA graphs, vLLM 0.21+]
            + the KV cache of one sequence of max_model_len (vLLM's minimum; said as
              placement says it, "sized for 1 sequence of M tokens": ``placement.sizing``)
    rank  = need + the CUDA context (+ CUDA graphs before 0.21): what the GPU holds for a
            rank, as placement counts it (the denial's headline and ``Sizing.rank_bytes``)
    slack = budget - need        (total - what the worker holds, with --kv-cache-memory-bytes)
    deny  when vLLM would refuse to start; warn when slack < margin + fraction x total

A denial names what the model needs per GPU, what the GPU has and what would fit
instead, from the menu the sidecar also uses (``gatekeeper.placement.nearby``): a larger
``--tensor-parallel-size``, the longest ``--max-model-len``, an fp8
KV cache, online fp8 weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from gatekeeper.cluster.claims import ClaimsMode
from gatekeeper.errors import GatekeeperError, HubError, ServeOptionsError, UnknownGpuError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, StageEstimate, estimate
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.k8s.decisions import Sizing
from gatekeeper.k8s.gpu_terms import give_text, gpus_text, has_text, nothing_nearby
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.nearby import (
    FP8_WEIGHTS_MIN_CAPABILITY,
    MAX_NODE_GPUS,
    MIN_SUGGESTED_LEN,
    fp8_weights_run,
    larger_sizes,
    lighter_variants,
)
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.sizing import kv_text, sequences_held
from gatekeeper.units import format_gib, parse_size
from gatekeeper.vllm.command import VllmCommand

__all__ = [
    "Case",
    "Finding",
    "GpuChoice",
    "Outcome",
    "gpu_count_finding",
    "gpu_from_value",
    "judge",
    "reading_findings",
    "suggestions",
    "unknown_model_finding",
]

Outcome = Literal["allow", "warn", "deny"]
_MAX_GPU_BYTES = 16 * 2**40
"""Larger than any GPU's memory: a bigger size is a typo."""


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """The GPU a workload will land on: total bytes as vLLM sees them, and where from."""

    total_bytes: int
    name: str | None
    origin: str
    compute_capability: tuple[int, int] | None = None
    """From the GPU table when the GPU is a product; None for a bare size."""

    @property
    def label(self) -> str:
        return self.name or f"a {format_gib(self.total_bytes)} GPU"


@dataclass(frozen=True, slots=True)
class Finding:
    outcome: Outcome
    message: str | None = None
    sizing: Sizing | None = None
    """How the container was sized, on the findings ``judge`` makes once it has (the
    decision line and the audit annotations say it)."""


def gpu_from_value(value: str, origin: str) -> GpuChoice:
    """A size (``79.19GiB``) or a GPU product (``H100-80GB``, ``NVIDIA-H100-80GB-HBM3``).

    Raises ``GatekeeperError`` naming the value and both accepted forms.
    """
    try:
        size = parse_size(value, field=origin)
    except (ValueError, OverflowError):
        pass
    else:
        if size <= _MAX_GPU_BYTES:
            return GpuChoice(size, None, origin)
    try:
        product = lookup_gpu(value)
    except UnknownGpuError as e:
        raise GatekeeperError(
            f"{origin}: {value!r} is neither a size (79.19GiB) nor a GPU in gatekeeper's "
            "table (H100-80GB, NVIDIA-L4 …); give the memory the GPU reports, e.g. 79.19GiB",
            field=origin,
            value=value,
        ) from e
    return GpuChoice(product.total_bytes, product.name, origin, product.compute_capability)


def gpu_count_finding(
    who: str,
    command: VllmCommand,
    gpus: int | None,
    *,
    multi_node: bool = False,
    claims: ClaimsMode | None = None,
) -> Finding | None:
    """Deny TP above the pod's GPUs; warn when TP x PP x DP exceeds them, unless the pods
    form a multi-node group (a LeaderWorkerSet's Ray cluster). Without GPUs the pod may get
    them another way (a DRA claim, a runtime class): warn when vLLM needs more than one.
    The pod's GPUs are its ``nvidia.com/gpu`` or, in a claims mode, its claim's ranks, the
    texts in the mode's words (``gpu_terms``). Checked before the model is known, so the
    count is the options' (``Estimate.gpus``: dp x tp x pp)."""
    o = command.options
    tp = o.tensor_parallel_size
    world = o.data_parallel_size * tp * o.pipeline_parallel_size
    if gpus is None:
        if world == 1:
            return None
        unless = " unless a DRA claim provides them" if claims is None else ""
        return Finding(
            "warn",
            f"{who}: vLLM needs {world} GPUs (TP x PP x DP) but {has_text(gpus, claims)}; "
            f"{give_text(world, claims)}{unless}",
        )
    if tp > gpus:
        sep = " or" if claims is None else ", or"
        return Finding(
            "deny",
            f"{who}: --tensor-parallel-size {tp} needs {tp} GPUs in the pod but "
            f"{has_text(gpus, claims, 'it')}; {give_text(max(world, tp), claims)}{sep} lower "
            f"--tensor-parallel-size to {max(gpus, 1)}",
        )
    if world > gpus and not multi_node:
        return Finding(
            "warn",
            f"{who}: TP x PP x DP = {world} GPUs but {has_text(gpus, claims)}; vLLM starts "
            "only if a Ray cluster provides the rest",
        )
    return None


def unknown_model_finding(
    who: str, reference: str, error: GatekeeperError, outcome: Outcome, *, draft: bool = False
) -> Finding:
    """The finding for a model gatekeeper cannot read (``webhook_unknown_model``: warn,
    checked no further, or deny). A speculative draft follows the same rule as the
    target: a draft unknown to the catalog (an offline EAGLE-3 head) is as checkable as
    an unknown target, which is to say not."""
    verb = "denied (webhook_unknown_model=deny)" if outcome == "deny" else "not checked"
    why = f"the hub lookup failed: {error}" if isinstance(error, HubError) else "not in the catalog"
    what = (
        f"speculative_config's draft model {reference!r} is unknown to gatekeeper ({why}; "
        f"{error}), so the memory it takes beside the target cannot be counted and it is {verb}"
        if draft
        else f"model {reference!r} is unknown to gatekeeper ({why}), so it is {verb}"
    )
    return Finding(
        outcome,
        f"{who}: {what}; check the name, or set GATEKEEPER_ALLOW_NETWORK=true to look it up on "
        "the hub",
    )


def reading_findings(who: str, command: VllmCommand) -> list[Finding]:
    """Warnings for what the command line holds that could not be read as vLLM reads it."""
    findings = [Finding("warn", f"{who}: {command.version_note}")] if command.version_note else []
    if command.unknown:
        text = "; ".join(command.unknown)
        findings.append(
            Finding(
                "warn",
                f"{who}: {text}; vLLM would refuse an unknown flag unless the image's release "
                "has it; checked without it",
            )
        )
    if command.problems:
        text = "; ".join(command.problems)
        findings.append(Finding("warn", f"{who}: {text}; checked with vLLM's default instead"))
    return findings


@dataclass(frozen=True, slots=True)
class Case:
    """One container to judge: its model, its command, the GPU it lands on and the rules."""

    spec: ModelSpec
    command: VllmCommand
    gpu: GpuChoice
    policy: PlacementPolicy
    draft: ModelSpec | None = None
    """The speculative draft model's spec, when the options name one (``draft_reference``)."""
    multi_node: bool = False
    """The pod leads a group (a LeaderWorkerSet), so pipeline stages may span pods."""
    max_node_gpus: int = MAX_NODE_GPUS
    """The most GPUs a suggestion puts on one node (``webhook_max_gpus_per_node``)."""
    claims: ClaimsMode | None = None
    """How the pod gets its GPUs: ``nvidia.com/gpu`` (None), or the mutating webhook's
    claims mode; the suggestions speak of what the operator changes in it."""


@dataclass(frozen=True, slots=True)
class _Eval:
    e: Estimate
    need_bytes: int
    """Inside vLLM's budget, with vLLM's least KV cache: what ``u x total`` must hold."""
    rank_bytes: int
    """What the GPU holds for the rank: ``need_bytes`` and what lies outside the budget
    (the CUDA context, and CUDA graphs before vLLM 0.21), as placement counts a rank."""
    kv_min_bytes: int
    slack_bytes: int
    margin_bytes: int


def _evaluate(case: Case, options: ServeOptions) -> _Eval:
    gpu = case.gpu
    e = estimate(
        case.spec,
        options,
        GpuTarget(gpu.total_bytes, name=gpu.name, compute_capability=gpu.compute_capability),
        default_version=case.policy.default_vllm_version,
        draft=case.draft,
    )
    w = e.worst
    kv_min = e.kv_bytes_for()
    rank, need = e.rank_bytes(w, kv_min)
    if options.kv_cache_memory_bytes is not None:
        slack = gpu.total_bytes - w.nvml_bytes
    else:
        slack = w.budget_bytes - need
    margin = case.policy.margin_for(gpu.total_bytes)
    return _Eval(e, need, rank, kv_min, slack, margin)


def judge(who: str, case: Case) -> list[Finding]:
    """The findings for one container whose model and GPU are known, each with the
    container's ``Sizing`` once the estimate gave it."""
    command, gpu = case.command, case.gpu
    options = command.options
    refused = _fp8_refusal(who, options, gpu)
    if refused is not None:
        return [refused]
    try:
        ev = _evaluate(case, options)
    except ServeOptionsError as e:
        vllm_refuses = e.field in ("tensor_parallel_size", "pipeline_parallel_size")
        return [Finding("deny" if vllm_refuses else "warn", f"{who}: {e}")]
    findings = [Finding("warn", f"{who}: {w}") for w in ev.e.warnings]
    if command.max_model_len_auto and ev.e.max_model_len_fit > 0 and not ev.e.fits:
        length = dataclasses.replace(options, max_model_len=ev.e.max_model_len_fit)
        ev = _evaluate(case, length)
    return [
        dataclasses.replace(f, sizing=_sizing(case, ev)) for f in _judged(who, case, ev, findings)
    ]


def _sizing(case: Case, ev: _Eval) -> Sizing:
    e = ev.e
    held = sequences_held(e, ev.kv_min_bytes)
    return Sizing(ev.rank_bytes, e.gpus, e.max_model_len, held, case.gpu.label)


def _judged(who: str, case: Case, ev: _Eval, findings: list[Finding]) -> list[Finding]:
    spec, gpu, options = case.spec, case.gpu, case.command.options
    if not ev.e.fits:
        fixes = suggestions(case, ev)
        return [*findings, Finding("deny", _denial(who, case, ev, fixes))]
    if ev.slack_bytes < ev.margin_bytes:
        shorter = _margin_length(case, options, ev)
        hint = f"lower --max-model-len to {shorter}" if shorter else "lower --max-model-len"
        findings.append(
            Finding(
                "warn",
                f"{who}: {spec.name} fits on {gpu.label} with "
                f"{format_gib(ev.slack_bytes)} to spare, under the {format_gib(ev.margin_bytes)} "
                f"safety margin; {hint} or use --kv-cache-dtype fp8",
            )
        )
    return findings or [Finding("allow")]


def _fp8_refusal(who: str, options: ServeOptions, gpu: GpuChoice) -> Finding | None:
    """Deny online fp8 weights (``--quantization fp8...``) on a GPU below compute capability
    7.5: vLLM refuses them at start (``_get_quantization_config`` in vLLM's
    ``config/vllm.py`` against ``Fp8Config.get_min_capability``, 75)."""
    method, cc = options.quantization, gpu.compute_capability
    if method is None or not method.startswith("fp8") or cc is None or fp8_weights_run(cc):
        return None
    least = ".".join(map(str, FP8_WEIGHTS_MIN_CAPABILITY))
    return Finding(
        "deny",
        f"{who}: --quantization {method} needs a GPU of compute capability {least} or more "
        f"but {gpu.label} has {cc[0]}.{cc[1]}, so vLLM would refuse to start; drop "
        "--quantization or pin a newer GPU (nodeSelector nvidia.com/gpu.product)",
    )


def _denial(who: str, case: Case, ev: _Eval, fixes: list[str]) -> str:
    spec, gpu, e, w = case.spec, case.gpu, ev.e, ev.e.worst
    shape = f"TP={e.tensor_parallel_size}" + (
        f" PP={e.pipeline_parallel_size}" if e.pipeline_parallel_size > 1 else ""
    )
    graphs = f", CUDA graphs {format_gib(w.cuda_graph_bytes)}"
    inside, outside = (graphs, "") if e.cuda_graphs_in_budget else ("", graphs)
    context = ev.rank_bytes - ev.need_bytes - (0 if e.cuda_graphs_in_budget else w.cuda_graph_bytes)
    would = "Would fit: " + "; or ".join(fixes) if fixes else nothing_nearby(case.claims)
    return (
        f"{who}: {spec.name} does not fit on {gpu.label} ({gpu.origin}): at {shape} it needs "
        f"{format_gib(ev.rank_bytes)} per GPU (CUDA context {format_gib(context)}{outside} "
        f"outside vLLM's budget; inside it {format_gib(ev.need_bytes)}: weights "
        f"{format_gib(w.weights_bytes)}"
        f"{_weights_parts(w)}, {kv_text(e, ev.kv_min_bytes)} (vLLM's least), "
        f"activation {format_gib(w.activation_peak_bytes)}, non-torch "
        f"{format_gib(w.non_torch_bytes)}{inside}) but the GPU has "
        f"{format_gib(gpu.total_bytes)}, of which vLLM may use {format_gib(w.budget_bytes)} at "
        f"--gpu-memory-utilization {e.gpu_memory_utilization}. vLLM would refuse: "
        f"{'; '.join(e.reasons)}. {would}."
    )


def _weights_parts(w: StageEstimate) -> str:
    """What the weights hold beside the model's own: LoRA slots, the draft, and what
    ``--cpu-offload-gb`` keeps in host memory."""
    parts = []
    if w.lora_bytes:
        parts.append(f"LoRA slots {format_gib(w.lora_bytes)}")
    if w.draft_weights_bytes:
        parts.append(f"draft model {format_gib(w.draft_weights_bytes)}")
    if w.cpu_offloaded_bytes:
        parts.append(f"{format_gib(w.cpu_offloaded_bytes)} more offloaded to CPU memory")
    return f" with {', '.join(parts)}" if parts else ""


def _margin_length(case: Case, options: ServeOptions, ev: _Eval) -> int | None:
    """The longest max_model_len that fits with the safety margin left in vLLM's budget."""
    if options.kv_cache_memory_bytes is not None:
        return None
    u = ev.e.gpu_memory_utilization - ev.margin_bytes / case.gpu.total_bytes
    if u <= 0:
        return None
    try:
        fit = _evaluate(
            case, dataclasses.replace(options, gpu_memory_utilization=u)
        ).e.max_model_len_fit
    except GatekeeperError:
        return None
    return fit if MIN_SUGGESTED_LEN <= fit < ev.e.max_model_len else None


def _fits(case: Case, options: ServeOptions) -> bool:
    try:
        return _evaluate(case, options).e.fits
    except GatekeeperError:
        return False


def suggestions(case: Case, ev: _Eval) -> list[str]:
    """Nearby flags that fit: TP (PP across a multi-node group), max model len, fp8 KV
    cache, online fp8 weights."""
    options = case.command.options
    out = _parallel(case, options, ev.e.max_model_len)
    length = _margin_length(case, options, ev) or ev.e.max_model_len_fit
    if MIN_SUGGESTED_LEN <= length < ev.e.max_model_len:
        out.append(f"--max-model-len {length}")
    version = case.policy.default_vllm_version
    for v in lighter_variants(case.spec, options, version, case.gpu.compute_capability):
        if _fits(case, dataclasses.replace(options, **v.changes)):
            out.append(v.flag)
    return out


def _parallel(case: Case, o: ServeOptions, length: int) -> list[str]:
    """The smallest larger TP (PP in a multi-node group) that fits as asked, and a
    smaller one that fits with a shorter max_model_len; GPUs as the estimate counts
    them (``Estimate.gpus``: dp x tp x pp), no more than one node has
    (``webhook_max_gpus_per_node``, default ``MAX_NODE_GPUS``) unless the pods form a multi-node group."""
    out: list[str] = []
    tp, pp = o.tensor_parallel_size, o.pipeline_parallel_size
    sizes = (
        [(tp, p) for p in larger_sizes(pp)]
        if case.multi_node  # pipeline stages span the group's pods
        else [(t, pp) for t in larger_sizes(tp, pp * o.data_parallel_size, case.max_node_gpus)]
    )
    for t, p in sizes:
        changed = dataclasses.replace(o, tensor_parallel_size=t, pipeline_parallel_size=p)
        try:
            ev = _evaluate(case, changed)
        except GatekeeperError:
            continue
        if case.multi_node:
            text = f"--pipeline-parallel-size {p} ({ev.e.gpus} GPUs in the group)"
        else:
            text = f"--tensor-parallel-size {t} {gpus_text(ev.e.gpus, case.claims)}"
        if ev.e.fits:
            return [*out, text]
        fit = ev.e.max_model_len_fit
        if not out and MIN_SUGGESTED_LEN <= fit < length:
            out.append(f"{text} and --max-model-len {fit}")
    return out
