"""Cluster placement on Kubernetes' own scheduler (issue 29): gatekeeper's memory claims
against whole-GPU claims, measured on the real components.

Each variant gets a fresh control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager 1.37 from ``scripts/k8s-components.sh``, started as the test
fixture starts them: ``bench.kube_control_plane``), a namespace and eight nodes of eight
declared GPUs of mixed products (2 H100-80GB, H200, A100-80GB, A100-40GB, 2 L40S, L4), each
node's ResourceSlice published by the node agent's code. The same 200 vLLM workloads
drawn from the catalog (``bench.cluster_fleet.draw_workloads``: models up to 70B, lengths
2K-32K, fp8 on three in ten unquantized checkpoints, TP 1/2/4; three in four Deployments
of one replica, the rest bare Pods) are created at once from 16 threads:

- **gatekeeper**: as written (``nvidia.com/gpu`` = TP), through ``gatekeeper webhook
  --mutate`` behind a MutatingWebhookConfiguration (``failurePolicy: Fail``), which turns
  each into a claim of its ranks' bytes and the flags that hold vLLM to them;
- **whole GPU**: a claim of one device per rank with no capacity request (``count: 1``). On
  a device with ``allowMultipleAllocations`` such a request consumes the capacity's
  ``requestPolicy.default`` (KEP-5075; ``k8s.io/dynamic-resource-allocation``
  ``structured/internal/experimental/consumable_capacity.go``, ``fillEmptyRequest``),
  which the agent publishes equal to the whole capacity: one whole GPU, as the report's
  ``whole_gpu_consumed_is_capacity`` checks on the allocations the scheduler wrote.

Measured, per variant: workloads placed (every pod bound), pending with the scheduler's
reason, pending without one, refused at admission with a reason; GPUs used; over-commits
(devices where the allocated claims' ``consumedCapacity``, or the bytes their templates
request, sum past the published capacity); create to bound pod, p50 and p99 (the create
call's start to the pod first seen bound by a watch, this process's clock), and where that
time went (``phases_ms_*``: the create call, its return to the pod, pod to claim, claim to
bound; p50 and p99 of each); and, for
gatekeeper, the webhook's latency as the apiserver measures it
(``apiserver_admission_webhook_admission_duration_seconds``, p50/p99 interpolated in its
buckets as PromQL's ``histogram_quantile`` does, and the mean) and as the webhook times
its own phases (``webhook_phases``: body read, wait for a worker thread, the decision, and
within it the namespace check and the templates; ``gatekeeper_webhook_mutate_phase_seconds``
on its ``/metrics``). Whole-GPU placements
whose workload gatekeeper sized larger than the GPU it got (or refused: no GPU holds it)
are counted too: those would fail at start-up. The last line is one JSON object.

    python -m bench.cluster           # 200 workloads, about 90 s on 2 loaded cores
    python -m bench.cluster --quick   # 40 workloads on 2 nodes, about 40 s
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from lightkube.codecs import from_dict
from prometheus_client.parser import text_string_to_metric_families

from bench.cluster_fleet import (
    Fleet,
    Workload,
    draw_workloads,
    fleet,
    manifest,
    set_up,
    start_webhook,
    webhook_configuration,
    webhook_metrics,
    whole_gpu_template,
)
from bench.cluster_storm import DeviceBooks, StormResult, audit, storm, summary
from bench.kube_control_plane import KubeCluster, kube_bin_dir, missing_reason, start_cluster
from bench.proxy import percentile

PRODUCTS = ("H100-80GB", "H100-80GB", "H200", "A100-80GB", "A100-40GB", "L40S", "L40S", "L4")
QUICK_PRODUCTS = ("H100-80GB", "L40S")
HOOK = "gatekeeper-bench"
WEBHOOK_FAMILY = "apiserver_admission_webhook_admission_duration_seconds"
REJECTIONS_FAMILY = "apiserver_admission_webhook_rejection_count"
PHASES_FAMILY = "gatekeeper_webhook_mutate_phase_seconds"


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's ``histogram_quantile`` over cumulative ``(le, count)`` buckets: linear
    within the bucket that holds the rank; the highest finite bound when it is +Inf's."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = le, count
    return lower


def _samples(metrics: str, family: str, webhook: str) -> list[Any]:
    """``family``'s samples for ``webhook`` (its ``name`` label)."""
    return [
        sample
        for found in text_string_to_metric_families(metrics)
        if found.name == family
        for sample in found.samples
        if sample.labels.get("name") == webhook
    ]


def webhook_latency(metrics: str, webhook: str) -> dict[str, Any]:
    """The apiserver's own measure of ``webhook``'s admission calls, all operations, and
    its rejections by error type (``no_error``: the webhook denied; ``calling_webhook_error``:
    no answer in time, or none at all)."""
    buckets: dict[float, float] = defaultdict(float)
    total = count = 0.0
    for sample in _samples(metrics, WEBHOOK_FAMILY, webhook):
        if sample.name.endswith("_bucket"):
            buckets[float(sample.labels["le"])] += sample.value
        elif sample.name.endswith("_sum"):
            total += sample.value
        elif sample.name.endswith("_count"):
            count += sample.value
    rejections: Counter[str] = Counter()
    for sample in _samples(metrics, REJECTIONS_FAMILY, webhook):
        rejections[sample.labels.get("error_type", "")] += int(sample.value)
    pairs = list(buckets.items())
    return {
        "calls": int(count),
        "p50_ms": round(histogram_quantile(0.5, pairs) * 1000, 1),
        "p99_ms": round(histogram_quantile(0.99, pairs) * 1000, 1),
        "mean_ms": round(total / count * 1000, 1) if count else None,
        "buckets_s": sorted(le for le in buckets if le != float("inf")),
        "rejections": dict(rejections),
    }


def webhook_phases(metrics: str) -> dict[str, dict[str, Any]]:
    """The webhook's own timing of its mutating reviews' phases
    (``gatekeeper_webhook_mutate_phase_seconds``): count, p50, p99 and mean, in ms."""
    buckets: dict[str, list[tuple[float, float]]] = defaultdict(list)
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    for found in text_string_to_metric_families(metrics):
        if found.name != PHASES_FAMILY:
            continue
        for sample in found.samples:
            phase = sample.labels["phase"]
            if sample.name.endswith("_bucket"):
                buckets[phase].append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                sums[phase] = sample.value
            elif sample.name.endswith("_count"):
                counts[phase] = sample.value
    return {
        phase: {
            "count": int(counts[phase]),
            "p50_ms": round(histogram_quantile(0.5, pairs) * 1000, 1),
            "p99_ms": round(histogram_quantile(0.99, pairs) * 1000, 1),
            "mean_ms": round(sums[phase] / counts[phase] * 1000, 1),
        }
        for phase, pairs in buckets.items()
        if counts[phase]
    }


def _run(
    cluster: KubeCluster, f: Fleet, workloads: list[Workload], work: Path, whole: bool
) -> tuple[StormResult, dict[tuple[str, str], DeviceBooks]]:
    api = cluster.client()
    hook = None
    try:
        set_up(api, f)
        if whole:
            for tp in sorted({w.tp for w in workloads}):
                api.create(from_dict(whole_gpu_template(tp, f.namespace)))
        else:
            hook = start_webhook(cluster, work / "webhook")
            api.create(from_dict(webhook_configuration(HOOK, hook, f.namespace)))
        manifests = [(w, manifest(w, f, whole_gpu=whole)) for w in workloads]
        result = storm(cluster.client, f.namespace, manifests, timeout=300)
        if hook is not None:
            result.webhook_phases = webhook_phases(webhook_metrics(hook))
        return result, audit(api, f)
    finally:
        if hook is not None:
            hook.stop()
        api.close()


def _percentile(values: list[float], q: int) -> float | None:
    """``bench.proxy.percentile``, rounded; None with no values, the value with one."""
    if len(values) < 2:
        return round(values[0], 1) if values else None
    return round(percentile(values, q), 1)


def bind_percentiles(result: StormResult, workloads: list[Workload]) -> dict[str, float | None]:
    """Create to bound, p50 and p99: all placed workloads, then bare Pods and Deployments
    apart (a Deployment's pod waits for the deployment and replica-set controllers)."""
    figures = {}
    for label, kinds in (
        ("", ("Pod", "Deployment")),
        ("_pods", ("Pod",)),
        ("_deployments", ("Deployment",)),
    ):
        chosen = [
            ms
            for w in workloads
            if w.kind in kinds and (ms := result.bind_ms.get(w.name)) is not None
        ]
        for q in (50, 99):
            figures[f"bind_p{q}_ms{label}"] = _percentile(chosen, q)
    return figures


def phase_percentiles(result: StormResult, workloads: list[Workload]) -> dict[str, Any]:
    """Per kind, each phase of a placed workload's wait (``cluster_storm.phases``: the
    create call, its pod, its claim, bound), ``[p50, p99]`` in milliseconds."""
    figures: dict[str, Any] = {}
    for label, kind in (("pods", "Pod"), ("deployments", "Deployment")):
        chosen = [p for w in workloads if w.kind == kind and (p := result.phases_ms.get(w.name))]
        figures[f"phases_ms_{label}"] = {
            phase: [_percentile(values, 50), _percentile(values, 99)]
            for phase in ("admit", "pod", "claim", "bind")
            if (values := [p[phase] for p in chosen if phase in p])
        }
    return figures


def pod_percentiles(result: StormResult, workloads: list[Workload]) -> dict[str, Any]:
    """Create to pod first seen, p50 and p99, over every Deployment whose pod appeared,
    placed or not: the deployment and replica-set controllers' time, whatever the
    scheduler then did (``pod_p50_ms_deployments_all``)."""
    chosen = [ms for w in workloads if w.kind == "Deployment" and (ms := result.pod_ms.get(w.name))]
    return {f"pod_p{q}_ms_deployments_all": _percentile(chosen, q) for q in (50, 99)}


def client_throttle(metrics: str) -> dict[str, Any]:
    """The controller manager's own client-side throttling: seconds its requests waited
    on its rate limiter (``--kube-api-qps``, default 20, burst 30), summed, with the
    request count; and the deployment work queue's mean wait."""
    waited = requests = 0.0
    queue: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "rest_client_rate_limiter_duration_seconds_sum":
                waited += sample.value
            elif sample.name == "rest_client_rate_limiter_duration_seconds_count":
                requests += sample.value
            elif sample.name.startswith("workqueue_queue_duration_seconds_") and sample.labels.get(
                "name"
            ) in ("deployment", "replicaset"):
                queue[f"{sample.labels['name']}_{sample.name.rsplit('_', 1)[1]}"] = sample.value
    means = {
        f"{name}_queue_mean_s": round(queue[f"{name}_sum"] / queue[f"{name}_count"], 2)
        for name in ("deployment", "replicaset")
        if queue.get(f"{name}_count")
    }
    return {"rate_limiter_wait_s": round(waited, 1), "requests": int(requests)} | means


def common_binds(
    gk: dict[str, Any], whole: dict[str, Any], workloads: list[Workload]
) -> dict[str, Any]:
    """Create to bound, p50 and p99, of each variant over the same workloads: those both
    placed (a variant's own figures cover what it placed, and gatekeeper places later
    arrivals that whole GPUs leave pending, whose pods the controllers made later)."""
    both = {n for n in gk["result"].bind_ms if n in whole["result"].bind_ms}
    figures: dict[str, Any] = {"placed_by_both": len(both)}
    for label, kind in (("pods", "Pod"), ("deployments", "Deployment")):
        names = [w.name for w in workloads if w.kind == kind and w.name in both]
        for suffix, run in (("", gk), ("_whole_gpu", whole)):
            values = [run["result"].bind_ms[n] for n in names]
            for q in (50, 99):
                figures[f"bind_p{q}_ms_{label}_both_placed{suffix}"] = _percentile(values, q)
    return figures


def variant(
    workloads: list[Workload], products: tuple[str, ...], work: Path, *, whole: bool
) -> dict[str, Any]:
    """One storm on a fresh control plane: its summary, bind times, and the raw books."""
    name = "whole" if whole else "gatekeeper"
    started = time.monotonic()
    (work / f"{name}-kube").mkdir(parents=True)
    cluster = start_cluster(kube_bin_dir(), work / f"{name}-kube")
    try:
        f = fleet(name, name, products)
        result, books = _run(cluster, f, workloads, work / name, whole)
        report = summary(result, books)
        report |= bind_percentiles(result, workloads)
        report |= phase_percentiles(result, workloads)
        report |= pod_percentiles(result, workloads)
        report["controller_manager"] = client_throttle(
            cluster.component_metrics("kube-controller-manager")
        )
        report["kube_version"] = json.loads(cluster.get("/version"))["gitVersion"]
        if not whole:
            metrics = cluster.get("/metrics").decode()
            report["webhook"] = webhook_latency(metrics, f"{HOOK}.vllm-gatekeeper.io")
            report["webhook_phases"] = result.webhook_phases
    finally:
        cluster.stop()
    report["wall_s"] = round(time.monotonic() - started, 1)
    return {"report": report, "result": result, "books": books}


def would_not_start(whole: dict[str, Any], gatekeeper: dict[str, Any]) -> int:
    """Whole-GPU placements of workloads that gatekeeper sized larger than the GPU they
    got, or refused (no GPU holds a rank): their vLLM would fail at start-up."""
    needs = {a.workload.name: a.need_bytes for a in gatekeeper["result"].arrivals}
    failing = set()
    for device in whole["books"].values():
        for owner in device.owners:
            workload = owner.split("-")[0]  # w123, or w123-<replica set>-<pod>
            need = needs.get(workload)
            if need is None or need > device.capacity:
                failing.add(workload)
    return len(failing)


def whole_consumes_capacity(whole: dict[str, Any]) -> bool:
    """Each whole-GPU allocation's ``consumedCapacity``, as the scheduler wrote it, is
    its device's whole capacity."""
    used = [b for b in whole["books"].values() if b.claims]
    return bool(used) and all(
        not b.unreported and b.consumed == b.capacity * len(b.claims) for b in used
    )


def compare(gk: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    """The two variants' figures side by side (over-commits and reasonless pendings of
    both summed: each must be 0)."""
    g, w = gk["report"], whole["report"]
    timed = ("bind_", "phases_", "pod_", "controller_manager")
    binds = {k: v for k, v in g.items() if k.startswith(timed)}
    binds |= {f"{k}_whole_gpu": v for k, v in w.items() if k.startswith(timed)}
    return binds | {
        "gpus": g["gpus"],
        "placed": g["placed"],
        "placed_whole_gpu": w["placed"],
        "gpus_used": g["gpus_used"],
        "gpus_used_whole_gpu": w["gpus_used"],
        "over_commits": g["over_commits"] + w["over_commits"],
        "denied_with_reason": g["denied_with_reason"],
        "denied_without_reason": g["denied_without_reason"],
        "pending_with_reason": g["pending_with_reason"],
        "pending_without_reason": g["pending_without_reason"] + w["pending_without_reason"],
        "whole_gpu_would_not_start": would_not_start(whole, gk),
        "whole_gpu_consumed_is_capacity": whole_consumes_capacity(whole),
        "webhook_p50_ms": g["webhook"]["p50_ms"],
        "webhook_p99_ms": g["webhook"]["p99_ms"],
        "webhook_mean_ms": g["webhook"]["mean_ms"],
        "webhook_calls": g["webhook"]["calls"],
        "webhook_rejections": g["webhook"]["rejections"],
        "webhook_phases": g["webhook_phases"],
    }


def print_reasons(result: StormResult) -> None:
    """Each distinct denial or pending reason, with how many workloads got it."""
    counted = Counter(
        (outcome, result.reasons.get(name, ""))
        for name, outcome in result.outcomes.items()
        if outcome != "placed"
    )
    for (outcome, reason), n in sorted(counted.items()):
        print(f"  {n:4d} {outcome}: {reason[:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--quick", action="store_true", help="40 workloads on 2 nodes")
    args = parser.parse_args()
    reason = missing_reason(kube_bin_dir())
    if reason is not None:
        raise SystemExit(reason)
    count, products = (40, QUICK_PRODUCTS) if args.quick else (args.workloads, PRODUCTS)
    workloads = draw_workloads(count, args.seed)
    load = os.getloadavg()[0]
    print(
        f"bench.cluster: {count} workloads (seed {args.seed}), {len(products)} nodes of "
        f"8 declared GPUs ({', '.join(products)}); {os.cpu_count()} CPUs, load {load:.2f}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        gk = variant(workloads, products, Path(tmp), whole=False)
        whole = variant(workloads, products, Path(tmp), whole=True)
    for name, run in (("gatekeeper", gk), ("whole GPU", whole)):
        print(f"{name}: {json.dumps(run['report'])}")
        print_reasons(run["result"])
    figures = compare(gk, whole) | common_binds(gk, whole, workloads)
    figures |= {
        "workloads": count,
        "nodes": len(products),
        "kube_version": gk["report"]["kube_version"],
        "load_average_1m": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
