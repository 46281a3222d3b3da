"""bench.cluster's pure parts: the quantile it reads from the apiserver's histogram, the
metrics it picks out, the workloads it draws and the objects it writes (issue 29)."""

from __future__ import annotations

import math

import kubernetes_validate
import pytest

from bench.cluster import (
    client_throttle,
    common_binds,
    histogram_quantile,
    pod_percentiles,
    webhook_latency,
)
from bench.cluster_fleet import Workload, draw_workloads, fleet, manifest, whole_gpu_template
from bench.cluster_storm import StormResult
from gatekeeper.models import find_in_catalog

INF = float("inf")


def test_histogram_quantile_interpolates_as_promql_does():
    # 10 calls: 4 under 25 ms, 5 more under 100 ms, 1 over 10 s.
    buckets = [(0.025, 4.0), (0.1, 9.0), (10.0, 9.0), (INF, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.025 + 0.075 * 1 / 5)
    assert histogram_quantile(0.2, buckets) == pytest.approx(0.0125)
    assert histogram_quantile(0.99, buckets) == 10.0  # in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))


METRICS = """\
# HELP apiserver_admission_webhook_admission_duration_seconds [STABLE] latency
# TYPE apiserver_admission_webhook_admission_duration_seconds histogram
apiserver_admission_webhook_admission_duration_seconds_bucket{name="a.io",operation="CREATE",rejected="false",type="admit",le="0.025"} 3
apiserver_admission_webhook_admission_duration_seconds_bucket{name="a.io",operation="CREATE",rejected="false",type="admit",le="0.1"} 3
apiserver_admission_webhook_admission_duration_seconds_bucket{name="a.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 3
apiserver_admission_webhook_admission_duration_seconds_sum{name="a.io",operation="CREATE",rejected="false",type="admit"} 0.03
apiserver_admission_webhook_admission_duration_seconds_count{name="a.io",operation="CREATE",rejected="false",type="admit"} 3
apiserver_admission_webhook_admission_duration_seconds_bucket{name="a.io",operation="CREATE",rejected="true",type="admit",le="0.025"} 0
apiserver_admission_webhook_admission_duration_seconds_bucket{name="a.io",operation="CREATE",rejected="true",type="admit",le="0.1"} 1
apiserver_admission_webhook_admission_duration_seconds_bucket{name="a.io",operation="CREATE",rejected="true",type="admit",le="+Inf"} 1
apiserver_admission_webhook_admission_duration_seconds_sum{name="a.io",operation="CREATE",rejected="true",type="admit"} 0.05
apiserver_admission_webhook_admission_duration_seconds_count{name="a.io",operation="CREATE",rejected="true",type="admit"} 1
apiserver_admission_webhook_admission_duration_seconds_bucket{name="other.io",operation="CREATE",rejected="false",type="admit",le="+Inf"} 50
apiserver_admission_webhook_admission_duration_seconds_count{name="other.io",operation="CREATE",rejected="false",type="admit"} 50
# HELP apiserver_admission_webhook_rejection_count [ALPHA] rejections
# TYPE apiserver_admission_webhook_rejection_count counter
apiserver_admission_webhook_rejection_count{error_type="no_error",name="a.io",operation="CREATE",rejection_code="403",type="admit"} 1
apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",name="other.io",operation="CREATE",rejection_code="0",type="admit"} 7
"""


def test_webhook_latency_reads_one_webhook_from_the_apiserver_metrics():
    found = webhook_latency(METRICS, "a.io")
    assert found["calls"] == 4  # the other webhook's 50 are not counted
    assert found["mean_ms"] == pytest.approx(20.0)
    assert found["p50_ms"] == pytest.approx(round(0.025 * 2 / 3 * 1000, 1))
    assert found["rejections"] == {"no_error": 1}
    assert found["buckets_s"] == [0.025, 0.1]


CONTROLLER_METRICS = """\
# TYPE rest_client_rate_limiter_duration_seconds histogram
rest_client_rate_limiter_duration_seconds_sum{host="127.0.0.1:1",verb="POST"} 12.5
rest_client_rate_limiter_duration_seconds_count{host="127.0.0.1:1",verb="POST"} 40
rest_client_rate_limiter_duration_seconds_sum{host="127.0.0.1:1",verb="PUT"} 2.5
rest_client_rate_limiter_duration_seconds_count{host="127.0.0.1:1",verb="PUT"} 10
# TYPE workqueue_queue_duration_seconds histogram
workqueue_queue_duration_seconds_sum{name="deployment"} 30
workqueue_queue_duration_seconds_count{name="deployment"} 4
workqueue_queue_duration_seconds_sum{name="resource_claim"} 99
workqueue_queue_duration_seconds_count{name="resource_claim"} 1
"""


def test_client_throttle_sums_the_rate_limiter_waits_and_the_deployment_queue():
    found = client_throttle(CONTROLLER_METRICS)
    assert found == {"rate_limiter_wait_s": 15.0, "requests": 50, "deployment_queue_mean_s": 7.5}


def _result(bind_ms: dict[str, float], pod_ms: dict[str, float]) -> StormResult:
    return StormResult([], {}, {}, bind_ms, 1.0, pod_ms=pod_ms)


def test_binds_are_compared_on_the_workloads_both_variants_placed():
    workloads = [Workload(f"w{i}", "m", ("m",), 1, "Deployment") for i in range(4)]
    workloads.append(Workload("p0", "m", ("m",), 1, "Pod"))
    gk = {"result": _result({"w0": 100.0, "w1": 200.0, "w2": 9000.0, "p0": 50.0}, {})}
    whole = {"result": _result({"w0": 300.0, "w1": 400.0, "p0": 70.0}, {})}
    found = common_binds(gk, whole, workloads)
    assert found["placed_by_both"] == 3  # w2 only gatekeeper placed: not compared
    assert found["bind_p99_ms_deployments_both_placed"] < 9000.0
    assert found["bind_p50_ms_deployments_both_placed_whole_gpu"] == 350.0
    assert found["bind_p50_ms_pods_both_placed"] == 50.0


def test_pod_percentiles_cover_every_deployment_placed_or_not():
    workloads = [Workload(f"w{i}", "m", ("m",), 1, "Deployment") for i in range(3)]
    workloads.append(Workload("p0", "m", ("m",), 1, "Pod"))
    result = _result({}, {"w0": 10.0, "w1": 30.0, "p0": 5000.0})
    assert pod_percentiles(result, workloads)["pod_p50_ms_deployments_all"] == 20.0


def test_workloads_are_drawn_the_same_and_split_their_heads():
    drawn = draw_workloads(60, seed=7)
    assert drawn == draw_workloads(60, seed=7) != draw_workloads(60, seed=8)
    assert {w.tp for w in drawn} == {1, 2, 4}
    assert {w.kind for w in drawn} == {"Pod", "Deployment"}
    for w in drawn:
        entry = find_in_catalog(w.model)
        assert entry is not None and (entry.parameters or 0) <= 75e9
        text = entry.config.get("text_config") or {}
        heads = entry.config.get("num_attention_heads") or text.get("num_attention_heads")
        assert (heads or 1) % w.tp == 0, w
        assert int(w.args[w.args.index("--tensor-parallel-size") + 1]) == w.tp


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_the_objects_written_validate_strictly(version: str):
    f = fleet("ns", "pool", ("H100-80GB",))
    objects = [whole_gpu_template(tp, "ns") for tp in (1, 4)]
    for w in draw_workloads(40)[:8]:
        objects += [manifest(w, f), manifest(w, f, whole_gpu=True)]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    requests = objects[1]["spec"]["spec"]["devices"]["requests"]
    assert len(requests) == 4 and all("capacity" not in r["exactly"] for r in requests)
