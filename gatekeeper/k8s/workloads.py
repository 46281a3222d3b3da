"""Find the pod templates of a Kubernetes object, the vLLM containers in them, the GPUs
they request and the GPU product they are pinned to.

Pure and total: any JSON value in, never an exception out (a field of the wrong type
counts as absent). Pod templates by kind:

=================  ==========================================================
Pod                the object itself
Deployment, StatefulSet, ReplicaSet, ReplicationController, DaemonSet, Job
                   ``spec.template``
CronJob            ``spec.jobTemplate.spec.template``
LeaderWorkerSet    ``spec.leaderWorkerTemplate.leaderTemplate`` and ``.workerTemplate``
=================  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.claim_annotation import ANNOTATION_PREFIX, read_record
from gatekeeper.cluster.claims import GPU_RESOURCE, container_gpus
from gatekeeper.vllm.command import VllmCommand, parse_vllm_command

__all__ = [
    "GKE_ACCELERATOR_LABEL",
    "GPU_MEMORY_ANNOTATION",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "LEGACY_ANNOTATIONS",
    "SKIP_ANNOTATION",
    "ContainerRequest",
    "LineCache",
    "PodTemplate",
    "gpu_product_constraint",
    "names_vllm",
    "pod_templates",
    "read_container",
    "template_paths",
    "unread_text",
    "unread_vllm_containers",
    "vllm_containers",
]

GPU_MEMORY_ANNOTATION = f"{ANNOTATION_PREFIX}gpu-memory"
SKIP_ANNOTATION = f"{ANNOTATION_PREFIX}skip"
LEGACY_ANNOTATIONS = {
    "gatekeeper.io/gpu-memory": GPU_MEMORY_ANNOTATION,
    "gatekeeper.io/skip": SKIP_ANNOTATION,
}
"""The earlier names, still read for one release (the new name wins when both are
given), each use warned of in the review (DEPRECATED: use the new name)."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The node label GPU Feature Discovery sets, e.g. ``NVIDIA-H100-80GB-HBM3``."""
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
"""The node label of a GKE GPU node pool, e.g. ``nvidia-l4``: GKE's samples pin vLLM to a
GPU with it, not with ``nvidia.com/gpu.product``."""
_GKE_PRODUCTS = {
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-v100": "V100-16GB",
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "A100-40GB",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-h100-80gb": "H100-80GB",
    "nvidia-h100-mega-80gb": "H100-80GB",
    "nvidia-h200-141gb": "H200",
    "nvidia-b200": "B200",
}
"""GKE's accelerator names, as gatekeeper's GPU table names the products; another value is
passed on as written (the webhook warns when its table lacks it)."""
_PRODUCT_LABELS = (GPU_PRODUCT_LABEL, GKE_ACCELERATOR_LABEL)

_TEMPLATE_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "template"),),
    "StatefulSet": (("spec", "template"),),
    "ReplicaSet": (("spec", "template"),),
    "ReplicationController": (("spec", "template"),),
    "DaemonSet": (("spec", "template"),),
    "Job": (("spec", "template"),),
    "CronJob": (("spec", "jobTemplate", "spec", "template"),),
}


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """One pod template: where it is in the object, its annotations and its pod spec."""

    path: str
    """``spec.template``, ``spec.leaderWorkerTemplate.workerTemplate`` … (empty for a Pod)."""
    annotations: Mapping[str, str]
    """The template's annotations over the object's own (the template's win), each
    earlier name (``LEGACY_ANNOTATIONS``) also under its new one."""
    spec: Mapping[str, Any]
    legacy: tuple[str, ...] = ()
    """The earlier annotation names the template used."""


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """A container that runs vLLM: what it serves and the GPUs it requests."""

    name: str
    path: str
    """``spec.template.spec.containers[0]`` …"""
    command: VllmCommand
    gpus: int | None
    """``resources.limits["nvidia.com/gpu"]`` (else requests), else the ranks the mutating
    webhook's DRA claim gives it (``cluster.claim_annotation``); None when neither."""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def _strings(value: object) -> list[str]:
    return [v if isinstance(v, str) else str(v) for v in _seq(value) if v is not None]


def _dig(obj: object, path: Sequence[str]) -> object:
    for key in path:
        obj = _map(obj).get(key)
    return obj


def _annotations(metadata: object) -> dict[str, str]:
    raw = _map(_map(metadata).get("annotations"))
    return {str(k): str(v) for k, v in raw.items() if isinstance(v, str | int | float | bool)}


def template_paths(kind: str) -> tuple[tuple[str, ...], ...]:
    """Where an object of ``kind`` holds its pod templates (none for a Pod, which is its
    own, and for kinds without one)."""
    if kind == "LeaderWorkerSet":
        lws = ("spec", "leaderWorkerTemplate")
        return ((*lws, "leaderTemplate"), (*lws, "workerTemplate"))
    return _TEMPLATE_PATHS.get(kind, ())


def pod_templates(kind: str, obj: object) -> list[PodTemplate]:
    """The pod templates of an object of ``kind``; empty for kinds without one."""
    top = _annotations(_map(obj).get("metadata"))
    if kind == "Pod":
        return [_template("", top, _map(_map(obj).get("spec")))]
    out = []
    for path in template_paths(kind):
        template = _dig(obj, path)
        if isinstance(template, Mapping):
            annotations = {**top, **_annotations(template.get("metadata"))}
            out.append(_template(".".join(path), annotations, _map(template.get("spec"))))
    return out


def _template(path: str, annotations: dict[str, str], spec: Mapping[str, Any]) -> PodTemplate:
    """A template, its earlier annotation names read under the new ones."""
    legacy = tuple(old for old in LEGACY_ANNOTATIONS if old in annotations)
    for old in legacy:
        annotations.setdefault(LEGACY_ANNOTATIONS[old], annotations[old])
    return PodTemplate(path, annotations, spec, legacy)


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    """Literal ``env`` values (``valueFrom`` cannot be read at admission)."""
    env: dict[str, str] = {}
    for item in _seq(container.get("env")):
        item = _map(item)
        name, value = item.get("name"), item.get("value")
        if isinstance(name, str) and isinstance(value, str | int | float):
            env[name] = str(value)
    return env


def _claimed_ranks(template: PodTemplate, name: object) -> int | None:
    """The devices the mutating webhook claimed for container ``name``, when its record
    is on the template and the container still uses a claim."""
    mine = read_record(template.annotations).get(name) if isinstance(name, str) else None
    ranks = mine.ranks if mine is not None else None
    claimed = template.spec.get("resourceClaims")
    return ranks if ranks is not None and ranks > 0 and claimed else None


LineCache = dict[tuple[object, ...], VllmCommand | None]
"""The command lines one review has read, by their words, image, env and release: a pod
of many identical containers is read once."""


def read_container(
    raw: object, default_release: str | None = None, cache: LineCache | None = None
) -> VllmCommand | None:
    """The vLLM command a container runs (``parse_vllm_command``, with the flags of the
    release its image's tag names, else of ``default_release``), or None; read once per
    review for identical lines when ``cache`` is given."""
    container = _map(raw)
    image = container.get("image")
    image = image if isinstance(image, str) else ""
    command, args = _strings(container.get("command")), _strings(container.get("args"))
    env = _env(container)
    key = (tuple(command), tuple(args), image, tuple(env.items()), default_release)
    if cache is not None and key in cache:
        return cache[key]
    found = parse_vllm_command(command, args, image, env, default_release=default_release)
    if cache is not None:
        cache[key] = found
    return found


def vllm_containers(
    template: PodTemplate, default_release: str | None = None, cache: LineCache | None = None
) -> list[ContainerRequest]:
    """The containers of ``template`` that run vLLM (init containers are not looked at),
    each read by ``read_container`` (``cache``: the lines this review has read)."""
    prefix = f"{template.path}.spec" if template.path else "spec"
    out = []
    for i, raw in enumerate(_seq(template.spec.get("containers"))):
        container = _map(raw)
        command = read_container(container, default_release, cache)
        if command is None:
            continue
        name = container.get("name")
        gpus = container_gpus(container)
        out.append(
            ContainerRequest(
                name=name if isinstance(name, str) else f"#{i}",
                path=f"{prefix}.containers[{i}]",
                command=command,
                gpus=_claimed_ranks(template, name) if gpus is None else gpus,
            )
        )
    return out


_NAMES_VLLM = re.compile(r"(?:^|[\s/=;&|(])vllm(?:[\s/.]|$)")
"""``vllm`` as a command, a module or a path component (``vllm serve``, ``-m vllm.x``,
``/workspace/vllm/inference_api.py``), not inside another name (``vllm-router``)."""


def names_vllm(text: str) -> bool:
    """Whether ``text`` (a container's words, joined) names vLLM as a command, a module
    or a path component."""
    return _NAMES_VLLM.search(text) is not None


def unread_vllm_containers(
    template: PodTemplate, read: Sequence[ContainerRequest]
) -> list[tuple[int, str, str]]:
    """The containers of ``template`` whose command or arguments name vLLM but that
    ``vllm_containers`` did not read (a wrapper such as KAITO's ``inference_api.py``, a
    script that cannot be split as the shell would), each as (index, name, the words that
    name vLLM, cut to 80 characters): the webhooks say they could not judge them."""
    taken = {c.path.rsplit("[", 1)[-1] for c in read}
    out = []
    for i, raw in enumerate(_seq(template.spec.get("containers"))):
        container = _map(raw)
        words = " ".join([*_strings(container.get("command")), *_strings(container.get("args"))])
        if f"{i}]" in taken or not _NAMES_VLLM.search(words):
            continue
        name = container.get("name")
        out.append((i, name if isinstance(name, str) else f"#{i}", words[:80]))
    return out


def unread_text(who: str, words: str, consequence: str = "it is not judged") -> str:
    """What a webhook says of a container ``unread_vllm_containers`` gave."""
    return (  # a warning is cut at 256 characters: what happened first, the words last
        f"{who}: no vllm serve line gatekeeper can read, so {consequence}; put vllm serve "
        f"and its flags in the command or args, or annotate {SKIP_ANNOTATION}. It names "
        f"vLLM: {words!r}"
    )


def gpu_product_constraint(spec: Mapping[str, Any]) -> tuple[list[str], str]:
    """The GPU products a pod may land on, and where that was read.

    From ``nodeSelector`` first, else from the required node affinity's ``In``
    expressions (every term: the pod may land on any), on ``nvidia.com/gpu.product``, else
    on GKE's ``cloud.google.com/gke-accelerator`` (read as the product it names). Empty
    when the pod is not pinned to a product.
    """
    selector = _map(spec.get("nodeSelector"))
    for label in _PRODUCT_LABELS:
        selected = selector.get(label)
        if isinstance(selected, str) and selected.strip():
            where = _where(f"nodeSelector {label}", label, [selected])
            return [_product(label, selected.strip())], where
    required = _dig(
        spec, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
    )
    terms = [_map(t) for t in _seq(_map(required).get("nodeSelectorTerms"))]
    keys = {e.get("key") for t in terms for e in map(_map, _seq(t.get("matchExpressions")))}
    label = next((k for k in _PRODUCT_LABELS if k in keys), GPU_PRODUCT_LABEL)
    values: list[str] = []
    for term in terms:
        found = [
            _strings(e.get("values"))
            for e in map(_map, _seq(term.get("matchExpressions")))
            if e.get("key") == label and e.get("operator") == "In"
        ]
        if not found:  # terms are ORed: this one lets the pod land on any GPU
            return [], f"required node affinity on {label}"
        allowed = set.intersection(*(set(f) for f in found))
        values += [v for v in found[0] if v in allowed and v not in values]
    where = _where(f"required node affinity on {label}", label, values)
    return [_product(label, v) for v in values], where


def _product(label: str, value: str) -> str:
    """A GPU product as gatekeeper's table names it (GKE's accelerator names mapped)."""
    return _GKE_PRODUCTS.get(value.lower(), value) if label == GKE_ACCELERATOR_LABEL else value


def _where(origin: str, label: str, values: list[str]) -> str:
    """Where the product was read; GKE's names are said as written before the product."""
    gke = values if label == GKE_ACCELERATOR_LABEL else []
    known = [v.strip() for v in gke if v.strip().lower() in _GKE_PRODUCTS]
    return f"{origin}: {', '.join(known)}, the product" if known else origin
