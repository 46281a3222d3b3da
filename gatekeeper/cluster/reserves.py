"""Whether the vLLM flags of a claim's pods let vLLM take more than the claim (pure).

At prepare, the plugin reads the pods a claim is reserved for and hands them here:

- ``claim_users`` finds each container (init containers too: a sidecar may serve) that
  uses the claim (``resources.claims`` naming the pod's entry for it, in ``spec`` or, for
  a claim made from a template, in ``status.resourceClaimStatuses``) and reads its vLLM
  command line with gatekeeper's own reader (``gatekeeper.vllm.command``); containers that
  run no vLLM are named apart, and their pod is prepared without the check;
- ``vllm_takes`` is what one rank of that command reserves on a GPU of ``total_bytes``:
  with ``--kv-cache-memory-bytes``, the estimate's per-rank figure for the command (CUDA
  context + weights + non-torch + activation peak + CUDA graphs + that KV cache, as
  ``claims.size_ranks`` computes the bytes the mutating webhook claims), or, when the
  model cannot be sized here, the KV cache alone (a lower bound); with only
  ``--gpu-memory-utilization u`` (or the release's default), ``ceil(u x total)``;
- ``check_reserves`` refuses a device whose users' figures add up to more than its
  ``consumedCapacity.memory``, naming the claim, the container, both numbers and the flag
  to change.

Example: a claim of 16 GiB on an H100 (85520809984 bytes total) used by ``vllm serve
Qwen/Qwen2.5-7B-Instruct --gpu-memory-utilization 0.9``: vLLM takes ceil(0.9 x
85520809984) = 76968728986 bytes > 17179869184, refused; the same pod with the flags the
webhook writes (``--kv-cache-memory-bytes`` and a small fraction) takes the estimate's
figure, which is what the claim requested.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gatekeeper.cluster.claims import size_ranks
from gatekeeper.cluster.prepared import ClaimRef, PreparedDevice, PrepareError
from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.accounting import accounting_for
from gatekeeper.estimator.plan import default_utilization
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.units import gib
from gatekeeper.vllm.command import VllmCommand, parse_vllm_command

__all__ = ["ClaimUser", "Takes", "check_reserves", "claim_users", "rank_sizer", "vllm_takes"]

RankSizer = Callable[[VllmCommand, int, str], int | None]
"""The estimate's per-rank bytes of a command on a GPU (total bytes, name); None when the
model cannot be sized here."""


@dataclass(frozen=True, slots=True)
class ClaimUser:
    """A container of a pod that runs vLLM on the claim."""

    pod: str
    """``namespace/name`` of its pod."""
    container: str
    command: VllmCommand
    requests: tuple[str, ...] | None
    """The claim's requests it uses; None for all of them."""


@dataclass(frozen=True, slots=True)
class Takes:
    """What one rank of a vLLM command reserves on one GPU, and which flag sets it."""

    bytes: int
    flag: str
    how: str


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _entries(pod: Mapping[str, Any], claim_name: str) -> set[str]:
    """The pod's own names (``spec.resourceClaims[].name``) for the claim ``claim_name``."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    named = {
        str(e.get("name"))
        for e in map(_map, _list(spec.get("resourceClaims")))
        if e.get("resourceClaimName") == claim_name
    }
    named |= {
        str(e.get("name"))
        for e in map(_map, _list(status.get("resourceClaimStatuses")))
        if e.get("resourceClaimName") == claim_name
    }
    return named


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    env = {}
    for item in map(_map, _list(container.get("env"))):
        if isinstance(item.get("name"), str) and isinstance(item.get("value"), str):
            env[item["name"]] = item["value"]
    return env


def claim_users(
    pod: Mapping[str, Any], claim_name: str, default_release: str | None = None
) -> tuple[list[ClaimUser], list[str]]:
    """The vLLM containers of ``pod`` that use claim ``claim_name``, and the names of its
    other containers that use it."""
    metadata, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
    who = f"{metadata.get('namespace')}/{metadata.get('name')}"
    entries = _entries(pod, claim_name)
    users: list[ClaimUser] = []
    others: list[str] = []
    for container in map(
        _map, [*_list(spec.get("initContainers")), *_list(spec.get("containers"))]
    ):
        refs = [r for r in map(_map, _list(_map(container.get("resources")).get("claims")))]
        refs = [r for r in refs if r.get("name") in entries]
        if not refs:
            continue
        name = str(container.get("name"))
        command = parse_vllm_command(
            [str(t) for t in _list(container.get("command"))],
            [str(t) for t in _list(container.get("args"))],
            str(container.get("image") or ""),
            _env(container),
            default_release=default_release,
        )
        if command is None:
            others.append(f"container {name!r} of pod {who}")
            continue
        requests = (
            None
            if any(not r.get("request") for r in refs)
            else tuple(str(r["request"]) for r in refs)
        )
        users.append(ClaimUser(who, name, command, requests))
    return users, others


def rank_sizer(resolve: Callable[[str], ModelSpec], policy: PlacementPolicy) -> RankSizer:
    """A ``RankSizer``: the model resolved by ``resolve``, sized by ``claims.size_ranks``
    with ``policy`` (the webhook's sizing); None when either fails."""

    def size(command: VllmCommand, total_bytes: int, gpu_name: str) -> int | None:
        if command.model is None:
            return None
        try:
            spec = resolve(command.model)
            return size_ranks(spec, command.options, total_bytes, gpu_name, policy).rank_bytes
        except GatekeeperError:
            return None

    return size


def vllm_takes(command: VllmCommand, total_bytes: int, estimated: int | None) -> Takes:
    """What one rank of ``command`` reserves on a GPU of ``total_bytes`` (see the module);
    ``estimated`` is the estimate's per-rank figure, None when unknown."""
    kv = command.options.kv_cache_memory_bytes
    if kv is not None:
        if estimated is None:
            how = f"its KV cache alone ({kv} bytes; the model could not be sized here)"
            return Takes(kv, "--kv-cache-memory-bytes", how)
        how = f"weights, activations, non-torch, CUDA graphs and a KV cache of {kv} bytes"
        return Takes(max(estimated, kv), "--kv-cache-memory-bytes", how)
    u = command.options.gpu_memory_utilization
    given = u is not None
    if u is None:
        acc = accounting_for(command.vllm_version)
        try:  # 0.34's extensible KV cache: 1.0 of the device, a cap it may fill
            u = default_utilization(acc, command.options)
        except GatekeeperError:  # a flag the release refuses: vLLM would not start
            u = acc.default_utilization
    how = f"{u} x {total_bytes} bytes total" + ("" if given else " (vLLM's default)")
    return Takes(math.ceil(u * total_bytes), "--gpu-memory-utilization", how)


def _bytes(n: int) -> str:
    return f"{n} bytes ({gib(n):.2f} GiB)"


def check_reserves(
    ref: ClaimRef,
    device: PreparedDevice,
    total_bytes: int,
    users: Iterable[tuple[ClaimUser, Takes]],
) -> None:
    """Passes when what the users of ``device`` reserve fits its claimed bytes; otherwise
    ``PrepareError`` with the claim, the container, both numbers and the flag to change."""
    using = [(u, t) for u, t in users if u.requests is None or device.claimed.request in u.requests]
    taken = sum(t.bytes for _, t in using)
    claimed = device.claimed.memory_bytes
    if not using or claimed == 0 or taken <= claimed:
        return
    user, takes = max(using, key=lambda ut: ut[1].bytes)
    room = claimed - (taken - takes.bytes)
    fix = (
        f"lower --gpu-memory-utilization to {math.floor(max(0, room) * 10_000 / total_bytes) / 10_000}"
        if takes.flag == "--gpu-memory-utilization"
        else "lower --kv-cache-memory-bytes or --max-model-len"
    )
    raise PrepareError(
        f"claim {ref}: container {user.container!r} of pod {user.pod} runs vLLM with flags that "
        f"let it take {_bytes(takes.bytes)} on device {device.claimed.device} (GPU "
        f"{device.gpu_index}) ({takes.flag}: {takes.how})"
        + (f"; with the claim's other users, {_bytes(taken)}" if len(using) > 1 else "")
        + f", but the claim holds {_bytes(claimed)} there; {fix}, or raise the claim's "
        f"capacity.requests.memory to {taken} (remove both flags and the claim to have "
        "gatekeeper's mutating webhook write them)",
        field=takes.flag,
        value=takes.bytes,
    )
