"""The admission webhooks' time per review at the size limits (issue 38 item 1), measured
against the real ``gatekeeper webhook --mutate`` process over TLS on loopback.

A control plane (``bench.kube_control_plane``: the mutating webhook creates its claim
templates through it) and ``gatekeeper webhook --mutate`` (``bench.webhook_process``, the
default limits) are started; the shipped MutatingWebhookConfiguration is registered for
the bench's namespace (``bench.webhook_configs``), so that the webhook takes it as one it
serves. Then this process posts AdmissionReviews of Pods straight to ``/k8s/mutate`` and
``/k8s/validate``, one at a time, ``--requests`` of each (the first two of each not
counted: the catalog's load), and reports each one's p50, p99 and max in milliseconds
(nearest rank) and the answer:

- ``flags-64k``: a vLLM line of 64 KiB of flags (``--max-model-len 8192`` over and over,
  the shape that took 1.5 s before the limits): denied by ``flags per line``;
- ``value-64k``: a vLLM line of 64 KiB at the limit, its bytes in one value
  (``--served-model-name``): mutated;
- ``pod-500-same``: a Pod of 500 identical vLLM containers: mutated (read and sized once);
- ``pod-500-distinct``: a Pod of 500 vLLM containers, each with its own
  ``--max-model-len``: denied by ``templates per review`` at the ninth distinct template
  (the validating webhook reads and judges every line).

The last line is one JSON object.

    python -m bench.webhook_limits                 # 60 requests of each
    python -m bench.webhook_limits --requests 20
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from lightkube.codecs import from_dict

from bench.kube_control_plane import kube_bin_dir, missing_reason, start_cluster
from bench.webhook_configs import MUTATING, shipped_configuration
from bench.webhook_process import WebhookProcess, start_webhook

NAMESPACE = "bench-limits"
IMAGE = "vllm/vllm-openai:v0.32.0"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
LINE_BYTES = 64 * 2**10


def _vllm(name: str, args: list[str]) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["vllm", "serve"], "args": args,
            "resources": {"limits": {"nvidia.com/gpu": 1}}}  # fmt: skip


def _pod(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": containers}}  # fmt: skip


def workloads() -> dict[str, dict[str, Any]]:
    """The four Pods, by name."""
    flags = ["--max-model-len", "8192"] * (LINE_BYTES // len("--max-model-len 8192 "))
    base = [MODEL, "--max-model-len", "8192", "--served-model-name"]
    used = sum(len(w) for w in ["vllm", "serve", *base])
    value = [*base, "m" * (LINE_BYTES - used)]
    same = [_vllm(f"c{i}", [MODEL, "--max-model-len", "8192"]) for i in range(500)]
    distinct = [_vllm(f"c{i}", [MODEL, "--max-model-len", str(4096 + 16 * i)]) for i in range(500)]
    return {
        "flags-64k": _pod("flags-64k", [_vllm("vllm", [MODEL, *flags])]),
        "value-64k": _pod("value-64k", [_vllm("vllm", value)]),
        "pod-500-same": _pod("pod-500-same", same),
        "pod-500-distinct": _pod("pod-500-distinct", distinct),
    }


def review(obj: dict[str, Any]) -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": NAMESPACE, "object": obj},
    }).encode()  # fmt: skip


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))]


def measure(client: httpx.Client, url: str, obj: dict[str, Any], n: int) -> dict[str, Any]:
    """``n`` reviews of ``obj`` posted to ``url`` one at a time (two more first, uncounted)."""
    times: list[float] = []
    answers: Counter[str] = Counter()
    for i in range(n + 2):
        body = review(obj)
        start = time.perf_counter()
        reply = client.post(url, content=body, headers={"content-type": "application/json"})
        seconds = time.perf_counter() - start
        response = reply.json().get("response", {})
        answer = "mutated" if response.get("patch") else "allowed"
        answer = answer if response.get("allowed") else "denied"
        if i >= 2:
            times.append(seconds * 1000)
            answers[f"{reply.status_code} {answer}"] += 1
    return {
        "review_bytes": len(review(obj)),
        "p50_ms": round(statistics.median(times), 1),
        "p99_ms": round(nearest_rank(times, 0.99), 1),
        "max_ms": round(max(times), 1),
        "answers": dict(answers),
    }


def run(webhook: WebhookProcess, n: int) -> dict[str, Any]:
    context = ssl.create_default_context(cadata=webhook.ca_pem.decode())
    out: dict[str, Any] = {}
    with httpx.Client(verify=context, timeout=60) as client:
        for name, obj in workloads().items():
            for path in ("/k8s/mutate", "/k8s/validate"):
                found = measure(client, webhook.url(path), obj, n)
                out[f"{name} {path.rsplit('/', 1)[1]}"] = found
                print(f"{name:17} {path:14} {json.dumps(found)}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="reviews of each (default 60)")
    args = parser.parse_args()
    reason = missing_reason(kube_bin_dir())
    if reason is not None:
        raise SystemExit(reason)
    load = os.getloadavg()[0]
    print(f"bench.webhook_limits: {args.requests} reviews of each; {os.cpu_count()} CPUs, "
          f"load {load:.2f}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-webhook-limits-") as tmp:
        work = Path(tmp)
        (work / "cluster").mkdir()
        cluster = start_cluster(kube_bin_dir(), work / "cluster")
        webhook = None
        try:
            api = cluster.client()
            api.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": NAMESPACE}}))  # fmt: skip
            (work / "webhook").mkdir()
            webhook = start_webhook(
                work / "webhook", "--mutate", "--kubeconfig", str(cluster.kubeconfig)
            )
            api.create(from_dict(shipped_configuration(
                MUTATING, webhook.url(""), webhook.ca_bundle, NAMESPACE, "Fail"
            )))  # fmt: skip
            figures = run(webhook, args.requests)
        finally:
            if webhook is not None:
                webhook.stop()
            cluster.stop()
    figures["load_average_1m"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
