"""The workers found by Prometheus through the sidecar's ``/discovery/workers``
(``http_sd_configs``), and gatekeeper's series joined with DCGM exporter's and
kube-state-metrics' without ``label_replace``: a real sidecar with simulator workers on
the NVML stand-in, a real Prometheus, and DCGM exporter's and kube-state-metrics' series
served from ``data/`` as those exporters would serve them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, h100
from gatekeeper.units import MIB
from tests.metrics.text_exporter import DCGM_NODE, KUBE_STATE_METRICS, serve_text
from tests.support.prometheus_server import MISSING, SKIP_REASON, query, run_prometheus
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

NODE = "node-a"
"""The node name of the sidecar (setting node_name) and of the DCGM and KSM fixtures."""
DAEMONSET = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "daemonset.yaml"


def ready_worker(sc: Sidecar, model: str = "tiny") -> dict[str, Any]:
    r = sc.admin.post("/admin/deployments", json={"model": model})
    assert r.status_code == 201, r.text
    return sc.wait_state(r.json()["deployment"]["id"], ("ready",))


def targets(prometheus: httpx.Client, job: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The job's active targets once every one is up (http_sd refreshes each second)."""
    deadline = time.monotonic() + timeout
    while True:
        active = prometheus.get("/api/v1/targets").json()["data"]["activeTargets"]
        found = [t for t in active if t["labels"].get("job") == job]
        if found and all(t["health"] == "up" for t in found):
            return found
        assert time.monotonic() < deadline, f"no healthy {job} target: {active}"
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=SKIP_REASON)
def test_prometheus_scrapes_the_discovered_workers_and_joins_dcgm_and_kube_state_metrics(
    tmp_path: Path, fake_nvml: FakeNvml
):
    fake_nvml.set([h100(0), h100(1)])
    settings = settings_for(tmp_path / "state", gpus="nvml", node_name=NODE)
    settings.worker_env["GATEKEEPER_SIM_NVML_STATE"] = str(fake_nvml.state_path)
    with (
        NvmlInventory() as inventory,
        running_sidecar(settings, inventory) as sc,
        serve_text(DCGM_NODE.read_text()) as dcgm,
        serve_text(KUBE_STATE_METRICS.read_text()) as ksm,
    ):
        d = ready_worker(sc)
        sidecar = sc.url.removeprefix("http://")
        jobs = [
            {
                "job_name": "gatekeeper-workers",
                "http_sd_configs": [
                    {"url": f"{sc.url}/discovery/workers", "refresh_interval": "1s"}
                ],
            },
            {"job_name": "dcgm-exporter", "static_configs": [{"targets": [dcgm]}]},
            {"job_name": "kube-state-metrics", "static_configs": [{"targets": [ksm]}]},
        ]
        (tmp_path / "prom").mkdir()
        with run_prometheus([sidecar], tmp_path / "prom", scrape_configs=jobs) as prom:
            (worker,) = targets(prom, "gatekeeper-workers")
            assert worker["labels"]["model"] == "tiny"
            assert worker["labels"]["worker"] == d["id"]
            assert worker["labels"]["Hostname"] == NODE
            assert worker["scrapeUrl"] == f"http://127.0.0.1:{d['port']}/metrics"
            check_joins(prom, d)
            check_openmetrics(prom)
        sc.admin.delete(f"/admin/deployments/{d['id']}")


def series(prom: httpx.Client, expr: str, count: int, timeout: float = 20.0) -> list[Any]:
    """``expr``'s series once there are ``count`` (the worker's first scrape may lag)."""
    deadline = time.monotonic() + timeout
    while len(result := query(prom, expr)) != count:
        assert time.monotonic() < deadline, f"{expr}: {len(result)} series, not {count}"
        time.sleep(0.25)
    return result


def check_joins(prom: httpx.Client, d: dict[str, Any]) -> None:
    (gpu,) = d["gpus"]
    # The engine's own series, with the labels discovery gave the worker.
    (kv,) = series(prom, 'vllm:kv_cache_usage_perc{job="gatekeeper-workers"}', 1)
    assert kv["metric"]["model"] == "tiny" and kv["metric"]["worker"] == d["id"]
    # GPU series x DCGM exporter's, on its UUID label and on (Hostname, gpu).
    joined = series(prom, "gatekeeper_gpu_memory_total_bytes * on(UUID) DCGM_FI_DEV_FB_FREE", 2)
    assert {r["metric"]["UUID"] for r in joined} == {h100(0).uuid, h100(1).uuid}
    ratio = "gatekeeper_gpu_memory_free_bytes / on(Hostname, gpu) (DCGM_FI_DEV_FB_FREE * 2^20)"
    for r in series(prom, ratio, 2):  # the stand-in's free against DCGM's recorded 81004 MiB
        assert 0 < float(r["value"][1]) < 1.01
    # A worker's series x DCGM's, picking up DCGM's pci_bus_id; vLLM's too (discovery's UUID).
    expr = "gatekeeper_worker_actual_bytes * on(UUID) group_left(pci_bus_id) DCGM_FI_DEV_GPU_UTIL"
    (w,) = series(prom, expr, 1)
    assert w["metric"]["gpu"] == str(gpu) and w["metric"]["pci_bus_id"].endswith(":00.0")
    expr = "vllm:kv_cache_usage_perc * on(UUID) group_left(modelName) DCGM_FI_DEV_GPU_UTIL"
    (v,) = series(prom, expr, 1)
    assert v["metric"]["modelName"] == "NVIDIA H100 80GB HBM3"
    # kube-state-metrics' node label.
    expr = "gatekeeper_gpu_memory_total_bytes * on(node) group_left(kernel_version) kube_node_info"
    for r in series(prom, expr, 2):
        assert r["metric"]["kernel_version"] == "6.1.0-18-amd64"
    total = query(prom, f'gatekeeper_gpu_memory_total_bytes{{gpu="{gpu}"}}')[0]["value"][1]
    assert float(total) > 79_000 * MIB


def check_openmetrics(prom: httpx.Client) -> None:
    """Prometheus asked the sidecar for OpenMetrics (metrics/exposition.py) and stored its
    types: an info family and a counter named without ``_total`` exist only in OpenMetrics
    (the text format says ``gatekeeper_build_info gauge``, ``…_total counter``)."""
    metadata = prom.get("/api/v1/metadata").json()["data"]
    assert [m["type"] for m in metadata["gatekeeper_build"]] == ["info"]
    assert [m["type"] for m in metadata["gatekeeper_admissions"]] == ["counter"]
    assert "gatekeeper_build_info" not in metadata


def test_the_daemonset_names_the_node_as_dcgm_exporter_does():
    (container,) = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    source = env["GATEKEEPER_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert source == "spec.nodeName"
