"""The mutating webhook's edits to one pod template, as RFC 6902 JSON Patch operations.

Pure: plain dicts in, new dicts and patch operations out, nothing edited in place.

- ``with_budget_flags`` writes ``--kv-cache-memory-bytes`` and ``--gpu-memory-utilization``
  into a container's vLLM command line: in an argument list (``command``/``args``) every
  earlier spelling of either flag is removed and both are appended; in a shell script
  (``sh -c``: ``gatekeeper.vllm.shell.script_index``, as the reader finds it) both are
  inserted after the launcher the reader knows (``vllm serve``,
  ``-m vllm.entrypoints.openai.api_server``, ``-m dynamo.vllm``: ``shell.launcher_ends``),
  and a script that sets either flag itself is refused (its own value would come later
  and win);
- ``with_claim`` makes the container use a pod claim (``resources.claims``) instead of
  whole GPUs (``nvidia.com/gpu`` leaves its limits and requests: the claim is its GPUs);
- ``with_resources`` (``hami`` mode, no DRA) writes HAMi's ``nvidia.com/gpu`` and
  ``nvidia.com/gpumem`` into its limits instead, and into its requests where it names them;
- ``reads_back`` checks an edited container with the webhooks' own reader
  (``parse_vllm_command``): the same model, the budget as written;
- ``template_ops`` is the patch of one pod template: the containers replaced, the pod's
  ``resourceClaims`` set (unless there are none to write), and the annotation recording what was written.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gatekeeper.k8s.workloads import GPU_RESOURCE, LineCache, read_container
from gatekeeper.vllm.command import VllmCommand
from gatekeeper.vllm.shell import launcher_ends, script_index

__all__ = [
    "BUDGET_FLAGS",
    "escape",
    "pointer",
    "reads_back",
    "template_ops",
    "unread_script",
    "unread_scripts",
    "with_budget_flags",
    "with_claim",
    "with_resources",
]

BUDGET_FLAGS = ("--kv-cache-memory-bytes", "--gpu-memory-utilization")
_BUDGET_SPELLING = re.compile(r"--(kv[-_]cache[-_]memory[-_]bytes|gpu[-_]memory[-_]utilization)")


def escape(key: str) -> str:
    """A key as one JSON Pointer segment (``~`` and ``/`` escaped)."""
    return key.replace("~", "~0").replace("/", "~1")


def pointer(path: str) -> str:
    """``spec.template`` as ``/spec/template``; the empty path (a Pod) as ``""``."""
    return "".join(f"/{escape(part)}" for part in path.split(".") if part)


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def unread_script(container: Mapping[str, Any]) -> str | None:
    """The shell script of a container whose script names ``vllm serve`` (the caller found
    no vLLM command line in it: it cannot be split as the shell would, an unbalanced quote),
    else None."""
    tokens = [*_strings(container.get("command")), *_strings(container.get("args"))]
    at = script_index(tokens)
    return tokens[at] if at is not None and launcher_ends(tokens[at]) else None


def unread_scripts(containers: list[Any], read: set[int], where: str) -> list[str]:
    """Denials for the containers (not at an index in ``read``) whose shell script names
    vLLM but could not be read."""
    out = []
    for i, container in enumerate(containers):
        script = unread_script(container) if i not in read and isinstance(container, dict) else None
        if script is not None:
            out.append(
                f"container {container.get('name')!r} of {where}: its shell script names vLLM "
                f"but cannot be split as the shell would ({script[:80]!r}: an unbalanced "
                "quote?), so no claim is written; fix the script, write the claim yourself or "
                "annotate vllm-gatekeeper.io/skip"
            )
    return out


def _without_budget(tokens: Sequence[str]) -> list[str]:
    """``tokens`` without any spelling of the two budget flags (and their values)."""
    out: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if _BUDGET_SPELLING.fullmatch(token.partition("=")[0]):
            skip = "=" not in token
            continue
        out.append(token)
    return out


def with_budget_flags(
    container: Mapping[str, Any],
    kv_bytes: int,
    utilization: float,
    reads: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any] | str:
    """The container with the two budget flags on its vLLM command line, or why they
    cannot be written there. In a script, after the first launcher whose flags ``reads``
    accepts (``reads_back``: a launcher's text in a comment or an echoed string is not
    the one the shell runs), else the first."""
    flags = [BUDGET_FLAGS[0], str(kv_bytes), BUDGET_FLAGS[1], f"{utilization:.4f}"]
    command, args = _strings(container.get("command")), _strings(container.get("args"))
    out = copy.deepcopy(dict(container))
    at = script_index([*command, *args])
    if at is None:
        key = "args" if args or not command else "command"
        out[key] = [*_without_budget(args if key == "args" else command), *flags]
        return out
    key, index = ("command", at) if at < len(command) else ("args", at - len(command))
    script = (command if key == "command" else args)[index]
    if _BUDGET_SPELLING.search(script):
        return (
            "its shell script sets --kv-cache-memory-bytes or --gpu-memory-utilization itself, "
            "and a value written before it would lose; remove them from the script so that "
            "gatekeeper writes them, or write the claim yourself"
        )
    lines = list(command if key == "command" else args)
    tried: list[dict[str, Any]] = []
    for end in launcher_ends(script):
        lines[index] = f"{script[:end]} {' '.join(flags)}{script[end:]}"
        tried.append({**out, key: list(lines)})
        if reads is None or reads(tried[-1]):
            return tried[-1]
    if not tried:
        return "its shell script has no 'vllm serve' gatekeeper can write flags after"
    return tried[0]


def reads_back(
    container: Mapping[str, Any],
    before: VllmCommand,
    kv_bytes: int,
    utilization: float,
    cache: LineCache | None = None,
) -> bool:
    """Whether the edited container reads as ``before``'s model with the budget written
    (read as the webhooks read it: ``workloads.read_container``)."""
    after = read_container(container, before.vllm_version, cache)
    return (
        after is not None
        and after.model == before.model
        and after.options.kv_cache_memory_bytes == kv_bytes
        and after.options.gpu_memory_utilization == utilization
    )


def with_claim(container: Mapping[str, Any], claim: str) -> dict[str, Any]:
    """The container using pod claim ``claim`` instead of ``nvidia.com/gpu``."""
    out = copy.deepcopy(dict(container))
    resources = out.get("resources")
    resources = dict(resources) if isinstance(resources, Mapping) else {}
    for section in ("limits", "requests"):
        values = resources.get(section)
        if isinstance(values, Mapping) and GPU_RESOURCE in values:
            resources[section] = {k: v for k, v in values.items() if k != GPU_RESOURCE}
    claims = [c for c in resources.get("claims") or [] if c.get("name") != claim]
    resources["claims"] = [*claims, {"name": claim}]
    out["resources"] = resources
    return out


def with_resources(container: Mapping[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    """The container with ``values`` (extended resources) in its limits, and in its
    requests where those name them (Kubernetes requires the two equal for them)."""
    out = copy.deepcopy(dict(container))
    resources = out.get("resources")
    resources = dict(resources) if isinstance(resources, Mapping) else {}
    limits = resources.get("limits")
    resources["limits"] = {**(limits if isinstance(limits, Mapping) else {}), **values}
    requests = resources.get("requests")
    if isinstance(requests, Mapping) and any(k in requests for k in values):
        resources["requests"] = {**requests, **values}
    out["resources"] = resources
    return out


def template_ops(
    base: str,
    template: Mapping[str, Any],
    containers: Mapping[int, Mapping[str, Any]],
    claims: Sequence[Mapping[str, str]] | None,
    annotation: tuple[str, str],
) -> list[dict[str, Any]]:
    """The operations that put ``containers`` (by index), the pod ``claims`` (None: leave
    ``resourceClaims`` as it is) and the ``annotation`` (name, value) into the pod template
    at pointer ``base`` (``template`` is what is there now: its ``metadata`` and ``spec``)."""
    spec = f"{base}/spec"
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": f"{spec}/containers/{i}", "value": dict(c)}
        for i, c in sorted(containers.items())
    ]
    if claims is not None:
        pod_claims = [dict(c) for c in claims]
        ops.append({"op": "add", "path": f"{spec}/resourceClaims", "value": pod_claims})
    name, value = annotation
    metadata = template.get("metadata")
    if not isinstance(metadata, Mapping):
        ops.append(
            {"op": "add", "path": f"{base}/metadata", "value": {"annotations": {name: value}}}
        )
    elif not isinstance(metadata.get("annotations"), Mapping):
        ops.append({"op": "add", "path": f"{base}/metadata/annotations", "value": {name: value}})
    else:
        ops.append(
            {"op": "add", "path": f"{base}/metadata/annotations/{escape(name)}", "value": value}
        )
    return ops
