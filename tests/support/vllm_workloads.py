"""vLLM workloads as operators write them, for the admission webhooks' cluster tests: a
Deployment as vLLM's docs write one (whole GPUs through ``nvidia.com/gpu``), a
LeaderWorkerSet as LWS's vLLM example writes one, an AdmissionReview's request for an
object, and an object with a webhook's JSON Patch applied."""

from __future__ import annotations

import json
from typing import Any

from gatekeeper.k8s.review import AdmissionRequest

IMAGE = "vllm/vllm-openai:v0.32.0"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
APPS = {"group": "apps", "version": "v1"}


def deployment(
    name: str,
    namespace: str,
    args: list[str],
    *,
    pod: dict[str, Any] | None = None,
    **container: Any,
) -> dict[str, Any]:
    """One replica of ``vllm serve`` ``args`` on 2 GPUs; ``pod``: more pod-spec fields
    (tolerations, a node selector), ``container``: more (or other) container fields."""
    labels = {"app": name}
    vllm = {"name": "vllm", "image": IMAGE, "command": ["vllm", "serve"], "args": args,
            "resources": {"limits": {"nvidia.com/gpu": 2}}, **container}  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [vllm], **(pod or {})},
            },
        },
    }


def leaderworkerset(name: str, namespace: str, leader_script: str) -> dict[str, Any]:
    """A LeaderWorkerSet of 2 pods of 2 GPUs each: the leader runs ``leader_script``
    (``ray start --head && exec vllm serve ...``), the worker joins its Ray cluster."""
    leader = deployment(name, namespace, [])["spec"]["template"]
    leader["spec"]["containers"][0].pop("args")
    leader["spec"]["containers"][0]["command"] = ["sh", "-c", leader_script]
    worker = {"spec": {"containers": [{"name": "worker", "image": IMAGE,
              "command": ["sh", "-c", "ray start --block --address=$(LWS_LEADER_ADDRESS):6379"],
              "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}  # fmt: skip
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"leaderWorkerTemplate": {"size": 2, "leaderTemplate": leader,
                                          "workerTemplate": worker}},
    }  # fmt: skip


def review(kind: dict[str, str], obj: dict[str, Any], namespace: str) -> AdmissionRequest:
    """The request of a CREATE review of ``obj`` (a ``kind`` with group and version)."""
    return AdmissionRequest.model_validate(
        {"uid": "u", "kind": kind, "operation": "CREATE", "namespace": namespace, "object": obj}
    )


def patched(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``doc`` with a webhook's RFC 6902 operations (add and replace) applied."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        target: Any = out
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = op["value"]
        else:
            target[last] = op["value"]
    return out
