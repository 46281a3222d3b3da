"""The sidecar's /metrics with live workers, scraped by a real Prometheus, and
calibration shrinking the prediction error of the next launch of a family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, h100
from gatekeeper.units import GIB
from tests.support.prometheus_server import MISSING, SKIP_REASON, query, run_prometheus
from tests.support.promql_sources import (
    alert_expressions,
    dashboard_expressions,
    from_other_jobs,
    metric_names,
)
from tests.support.sidecar_harness import running_sidecar, settings_for

SLEEP_SERIES = {
    "gatekeeper_worker_sleeps_total",
    "gatekeeper_worker_wakes_total",
    "gatekeeper_worker_sleep_failures_total",
    "gatekeeper_worker_wake_duration_seconds_bucket",
    "gatekeeper_worker_wake_duration_seconds_count",
    "gatekeeper_worker_wake_duration_seconds_sum",
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(all_samples, name: str, **labels: str) -> float:
    matches = [
        v for (n, ls), v in all_samples.items() if n == name and set(labels.items()) <= set(ls)
    ]
    assert matches, f"no {name} {labels}"
    return float(sum(matches))


def ready_worker(sc) -> Any:
    r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
    assert r.status_code == 201, r.text
    return sc.wait_state(r.json()["deployment"]["id"], ("ready",))


def test_metrics_report_gpus_workers_admissions_and_traffic(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        d = ready_worker(sc)
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="x", max_retries=0)
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        sc.admin.post("/admin/deployments", json={"model": "meta-llama/Llama-3.1-405B-Instruct"})
        m = samples(httpx.get(f"{sc.url}/metrics").text)
        assert value(m, "gatekeeper_gpu_collect_success") == 1
        assert value(m, "gatekeeper_gpu_memory_total_bytes", gpu="0") == pytest.approx(
            79.19 * GIB, rel=1e-6
        )
        assert (
            value(m, "gatekeeper_worker_predicted_bytes", worker=d["id"], component="weights") > 1e9
        )
        assert (
            value(
                m, "gatekeeper_worker_actual_component_bytes", worker=d["id"], component="weights"
            )
            > 0
        )
        assert value(m, "gatekeeper_admissions_total", outcome="admitted") >= 1
        assert value(m, "gatekeeper_admissions_total", outcome="rejected") >= 1
        assert value(m, "gatekeeper_proxy_requests_total", model="tiny", code="200") >= 1
        assert value(m, "gatekeeper_workers", state="ready") == 1
        assert value(m, "gatekeeper_build_info") == 1


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING), reason=SKIP_REASON)
def test_real_prometheus_runs_every_dashboard_and_alert_expression_on_the_sidecar(
    tmp_path: Path, fake_nvml: FakeNvml
):
    """Stand-in driver, stand-in worker (claiming its memory in the driver), a real
    Prometheus: every dashboard and alert expression parses and returns series (but those
    of the webhook and the API server, jobs of their own: tests/metrics/test_prometheus_real.py)."""
    fake_nvml.set([h100(0), h100(1)])
    settings = settings_for(tmp_path / "state", gpus="nvml", restart_limit=1)
    settings.worker_env["GATEKEEPER_SIM_NVML_STATE"] = str(fake_nvml.state_path)
    settings.worker_env["GATEKEEPER_SIM_ACTIVATION_BYTES"] = str(4 * GIB)  # a wrong prediction
    with NvmlInventory() as inventory, running_sidecar(settings, inventory) as sc:
        d = ready_worker(sc)
        c = openai.OpenAI(base_url=f"{sc.url}/v1", api_key="x", max_retries=0)
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        sc.admin.post("/admin/deployments", json={"model": "meta-llama/Llama-3.1-405B-Instruct"})
        m = samples(httpx.get(f"{sc.url}/metrics").text)
        assert value(m, "gatekeeper_worker_actual_bytes", worker=d["id"]) > 0  # NVML, process tree
        (tmp_path / "prom").mkdir()
        workers = {  # the workers' own vllm:* series, found through the sidecar
            "job_name": "gatekeeper-workers",
            "http_sd_configs": [{"url": f"{sc.url}/discovery/workers", "refresh_interval": "1s"}],
        }
        sidecar = sc.url.removeprefix("http://")
        with run_prometheus([sidecar], tmp_path / "prom", scrape_configs=[workers]) as prom:
            # The sleep series are labelled by the model that slept, so they appear once a
            # worker has slept (this sidecar's workers stop when idle; tests/sidecar/test_sleep.py
            # reads them after a sleep and a wake).
            dashboard = [
                (w, e)
                for w, e in dashboard_expressions()
                if not from_other_jobs(e) and not metric_names(e) <= SLEEP_SERIES
            ]
            empty = [where for where, expr in dashboard if not query(prom, expr)]
            for where, expr in alert_expressions():
                if from_other_jobs(expr):
                    continue
                fired = query(prom, expr)  # parses (raises otherwise); fires only on trouble
                # Pending bytes exist only while a worker starts (tests/metrics has one).
                names = metric_names(expr) - {"gatekeeper_worker_pending_bytes"}
                missing = [name for name in names if not query(prom, name)]
                assert not missing, f"{where}: no series for {missing}"
                if "PredictionDrift" in where:
                    # The KV cache absorbs the wrong activation prediction: the worker's
                    # NVML total is as promised, so no alert; the dashboard shows it.
                    assert not fired, fired
                    off = 'gatekeeper_worker_prediction_error_ratio{component="activation"} > 0.25'
                    assert query(prom, off), "the wrong activation prediction is not shown"
        sc.admin.delete(f"/admin/deployments/{d['id']}")
    assert empty == [], f"expressions without series: {empty}"


def test_calibration_makes_the_second_launch_of_a_family_closer(tmp_path: Path):
    settings = settings_for(tmp_path)
    # The stand-in worker reports 3 GiB of activation where the estimate says ~2.2 GiB.
    settings.worker_env["GATEKEEPER_SIM_ACTIVATION_BYTES"] = str(3 * GIB)
    errors = []
    with running_sidecar(settings) as sc:
        for _ in range(2):
            d = ready_worker(sc)
            predicted = d["predicted"]["activation_peak_bytes"]
            actual = d["actual"]["activation_peak_bytes"]
            errors.append(abs(actual - predicted) / predicted)
            sc.admin.delete(f"/admin/deployments/{d['id']}")
    assert errors[1] < errors[0] / 2
    assert (tmp_path / "calibration.json").is_file()
