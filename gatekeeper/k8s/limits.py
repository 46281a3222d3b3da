"""What the admission webhooks read of one review, bounded: the limits, and the shapes they
take (issue 38 item 1; ``docs/cluster.md``, "Bounded work per review").

Pure. The apiserver gives a webhook ``timeoutSeconds`` (10 in the shipped
configurations) and then follows the failure policy: a review that takes longer, or that
trips a bug, is admitted as written under ``Ignore``. So before either webhook reads a
vLLM command line, ``screen`` checks the object and answers with the denials (each
naming the field, or the limit and its setting) that stop it from reading further:

- **shapes**: each field the webhooks read (the object's metadata; along each pod
  template's path, the template, its metadata and annotations, its pod spec, each
  container's command, args, env and resources, the pod's claims, node selector and
  affinity) is absent, null, or of the type Kubernetes gives it (an object, a list, or a
  string or number); ``containers: 5`` is denied naming ``spec.containers``;
- **containers per pod** (``webhook_max_containers_per_pod``): containers and init
  containers of one pod template;
- **command-line bytes** (``webhook_max_line_bytes``) and **flags per line**
  (``webhook_max_flags_per_line``): of each container whose command line names vLLM (its
  command, args and literal env values, which ``$(VAR)`` and a script may expand into
  the line), the UTF-8 bytes, and the words that begin with a dash (other than negative
  numbers), a script's words included; the two flags the mutating webhook writes
  (``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``) and their values are not
  counted, so that a line at the limit, mutated, still reads for the validating webhook;
- **review bytes** (``webhook_max_review_bytes``) is the body's, counted as it is read
  (``review.review_body``); over it the review is denied unread (``review.over_limit``);
- **templates per review** (``webhook_max_templates_per_review``): the distinct claim
  templates the mutating webhook would create for one review (``too_many_templates``),
  checked as each is added: it stops sizing at the first one over, and creates none.

A ``Budget`` bounds the rest: each webhook checks it between containers and denies what
it has not finished within ``webhook_review_budget_seconds`` (2.5 s: half the shipped
validating configuration's timeout, a quarter of the mutating one's).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.k8s.pod_patch import BUDGET_FLAGS
from gatekeeper.k8s.workloads import PodTemplate, names_vllm, template_paths

__all__ = ["Budget", "ReviewLimits", "screen", "too_many_templates"]

_NEGATIVE_NUMBER = re.compile(r"-\.?\d")


@dataclass(frozen=True, slots=True)
class ReviewLimits:
    """The most one review may hold (the settings' ``webhook_max_*``)."""

    review_bytes: int = 3 * 2**20
    """The apiserver's own request body limit (3 MiB): a review of a stored object (etcd
    keeps at most 1.5 MiB) fits, an update's old and new objects of up to about 1.5 MiB
    each too."""
    containers_per_pod: int = 512
    line_bytes: int = 64 * 2**10
    flags_per_line: int = 128
    """vLLM 0.32's parser has 320 flags (483 spellings); lines seen in the wild name 5 to 40."""
    budget_seconds: float = 2.5
    """Half the shipped validating configuration's ``timeoutSeconds: 5`` (the mutating
    one's is 10)."""
    templates_per_review: int = 8
    """The most distinct ResourceClaimTemplates the mutating webhook creates for one review
    (a LeaderWorkerSet's two pod templates, a pod with a few vLLM containers)."""


@dataclass(slots=True)
class Budget:
    """The time one review may take, from its start."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def spent(self) -> bool:
        return time.monotonic() - self.start > self.seconds

    def text(self, where: str, done: int) -> str:
        return (
            f"{where}: gatekeeper could not finish reviewing it within its budget of "
            f"{self.seconds:g} s (setting webhook_review_budget_seconds; the apiserver gives "
            f"up at the configuration's timeoutSeconds), after {done} vLLM container(s); "
            "shorten the vllm serve lines or split the workload"
        )


# -- shapes ------------------------------------------------------------------------------

_SCALAR = "scalar"
_MAP = "map"
Shape = str | tuple[str, Any]
"""``_SCALAR``; ``_MAP`` (any object); ``("map", {key: shape, "*": shape})``;
``("list", shape)``."""

_CONTAINER: Shape = (
    _MAP,
    {
        "name": _SCALAR,
        "image": _SCALAR,
        "command": ("list", _SCALAR),
        "args": ("list", _SCALAR),
        "env": ("list", (_MAP, {"name": _SCALAR, "value": _SCALAR, "valueFrom": _MAP})),
        "resources": (
            _MAP,
            {
                "limits": (_MAP, {"*": _SCALAR}),
                "requests": (_MAP, {"*": _SCALAR}),
                "claims": ("list", (_MAP, {"name": _SCALAR, "request": _SCALAR})),
            },
        ),
    },
)
_METADATA: Shape = (
    _MAP,
    {
        "name": _SCALAR,
        "namespace": _SCALAR,
        "generateName": _SCALAR,
        "annotations": (_MAP, {"*": _SCALAR}),
        "labels": (_MAP, {"*": _SCALAR}),
    },
)
_CLAIM_ENTRY: Shape = (
    _MAP,
    {"name": _SCALAR, "resourceClaimTemplateName": _SCALAR, "resourceClaimName": _SCALAR},
)
_POD_SPEC: Shape = (
    _MAP,
    {
        "containers": ("list", _CONTAINER),
        "initContainers": ("list", _CONTAINER),
        "resourceClaims": ("list", _CLAIM_ENTRY),
        "nodeSelector": (_MAP, {"*": _SCALAR}),
        "nodeName": _SCALAR,
        "affinity": _MAP,
    },
)
_TEMPLATE: Shape = (_MAP, {"metadata": _METADATA, "spec": _POD_SPEC})


def _described(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r:.40})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    return "a list" if isinstance(value, list) else "an object"


def _expected(shape: Shape) -> str:
    if shape == _SCALAR:
        return "a string or a number"
    return "a list" if isinstance(shape, tuple) and shape[0] == "list" else "an object"


def _check(value: object, shape: Shape, path: str, out: list[str]) -> None:
    """Appends the first wrong field under ``path`` to ``out`` (one is enough to deny)."""
    if value is None or out:
        return
    kind = shape[0] if isinstance(shape, tuple) else shape
    ok = {
        _SCALAR: isinstance(value, str | int | float),
        _MAP: isinstance(value, Mapping),
        "list": isinstance(value, list),
    }[kind]
    if not ok:
        out.append(f"{path} is {_described(value)}, not {_expected(shape)}")
        return
    if not isinstance(shape, tuple):
        return
    if kind == "list":
        assert isinstance(value, list)
        for i, item in enumerate(value):
            _check(item, shape[1], f"{path}[{i}]", out)
        return
    assert isinstance(value, Mapping)
    fields: Mapping[str, Shape] = shape[1]
    every = fields.get("*")
    for key, item in value.items():
        inner = fields.get(key, every)
        if inner is not None:
            _check(item, inner, f"{path}.{key}" if path else key, out)


def _shape(kind: str, obj: Mapping[str, Any]) -> str | None:
    """The first field of ``obj`` the webhooks read that has the wrong type, described."""
    out: list[str] = []
    _check(obj.get("metadata"), _METADATA, "metadata", out)
    if kind == "Pod":
        _check(obj.get("spec"), _POD_SPEC, "spec", out)
    for path in template_paths(kind):
        node: object = obj
        for i, key in enumerate(path):
            if not isinstance(node, Mapping) or out:
                break
            node = node.get(key)
            last = i == len(path) - 1
            where = ".".join(path[: i + 1])
            _check(node, _TEMPLATE if last else _MAP, where, out)
    return out[0] if out else None


# -- sizes -------------------------------------------------------------------------------


def _words(container: Mapping[str, Any]) -> list[str]:
    """A container's command, args and literal env values, as text."""
    env = [e.get("value") for e in container.get("env") or [] if isinstance(e, Mapping)]
    items = [*(container.get("command") or []), *(container.get("args") or []), *env]
    return [str(t) for t in items if t is not None]


def _counted(words: list[str]) -> tuple[int, int]:
    """The bytes and flags of ``words`` (each split at whitespace for the flags) without
    the two flags the mutating webhook writes (``pod_patch.BUDGET_FLAGS``) and their
    values: the validating webhook, called after it, reads the line the user wrote."""
    parts = [p for w in words for p in w.split()]
    size = sum(len(w.encode()) for w in words)
    flags, i = 0, 0
    while i < len(parts):
        part = parts[i]
        name, eq, _ = part.partition("=")
        if name in BUDGET_FLAGS:
            taken = parts[i : i + (1 if eq else 2)]
            size -= sum(len(p.encode()) for p in taken)
            i += len(taken)
            continue
        flags += part[:1] == "-" and not _NEGATIVE_NUMBER.match(part)
        i += 1
    return max(0, size), flags


def _line_limits(who: str, container: Mapping[str, Any], limits: ReviewLimits) -> str | None:
    """Why the vLLM line of ``container`` is over a limit, or None."""
    words = _words(container)
    if not names_vllm(" ".join(words)):
        return None
    size, flags = _counted(words)
    if size > limits.line_bytes:
        return (
            f"{who}: its command line (command, args and literal env values) is {size} "
            f"bytes, over the webhook's limit of {limits.line_bytes} command-line bytes "
            "(setting webhook_max_line_bytes); move long values (a chat template, a JSON "
            "config) into a file the container reads"
        )
    if flags > limits.flags_per_line:
        return (
            f"{who}: its command line has {flags} flags, over the webhook's limit of "
            f"{limits.flags_per_line} flags per line (setting webhook_max_flags_per_line); "
            "vLLM takes each flag once: give it once"
        )
    return None


def _template_limits(where: str, template: PodTemplate, limits: ReviewLimits) -> list[str]:
    spec = template.spec
    containers: Sequence[Any] = [
        *(spec.get("containers") or []),
        *(spec.get("initContainers") or []),
    ]
    at = f"{where} ({template.path})" if template.path else where
    if len(containers) > limits.containers_per_pod:
        return [
            f"{at}: its pod has {len(containers)} containers, over the webhook's limit of "
            f"{limits.containers_per_pod} containers per pod (setting "
            "webhook_max_containers_per_pod)"
        ]
    out = []
    for i, container in enumerate(containers):
        name = container.get("name") if isinstance(container, Mapping) else None
        who = f"container {name if isinstance(name, str) else f'#{i}'!r} of {at}"
        found = _line_limits(who, container, limits) if isinstance(container, Mapping) else None
        if found is not None:
            out.append(found)
    return out


def screen(
    kind: str, obj: Mapping[str, Any], templates: Sequence[PodTemplate], where: str,
    limits: ReviewLimits,
) -> list[str]:  # fmt: skip
    """The denials that stop a webhook before it reads ``obj``'s vLLM lines: a field of
    the wrong type (the first), else each limit passed; empty when it may read on (and for
    kinds without a pod template)."""
    if kind != "Pod" and not template_paths(kind):
        return []
    wrong = _shape(kind, obj)
    if wrong is not None:
        return [
            f"{where}: the object is malformed: {wrong}; gatekeeper denies what it cannot "
            "read rather than admit it unread (the apiserver's own validation refuses it too)"
        ]
    return [text for template in templates for text in _template_limits(where, template, limits)]


def too_many_templates(where: str, count: int, cap: int) -> str:
    """The denial of a review whose vLLM containers need ``count`` distinct templates (or
    more: the webhook stops at the first one over the limit)."""
    return (
        f"{where}: its vLLM containers need at least {count} distinct ResourceClaimTemplates, over the "
        f"webhook's limit of {cap} templates per review (setting "
        "webhook_max_templates_per_review); give containers of one size the same flags, or "
        "split the workload"
    )
