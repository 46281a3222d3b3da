"""The Grafana dashboard, its provisioning files and the alert rules, checked offline:
JSON structure, names against what the collectors export, and PromQL through promtool."""

from __future__ import annotations

import shutil
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.gpus.static import StaticInventory
from tests.support.metrics_fixtures import record_events, sidecar_registry
from tests.support.promql_sources import (
    ALERTS,
    ROOT,
    alert_expressions,
    dashboard_expressions,
    load_alerts,
    load_dashboard,
    metric_names,
    panels,
)

NO_PROMTOOL = "promtool is not installed (apt-get install --no-install-recommends prometheus)"
DASHBOARD = load_dashboard()
PANELS = panels(DASHBOARD)
CONTENT = [p for p in PANELS if p["type"] != "row"]


def exported_names() -> set[str]:
    inventory = StaticInventory.from_json(ROOT / "tests" / "fixtures" / "gpus" / "h100_80g_x8.json")
    sidecar = sidecar_registry(inventory)
    record_events(sidecar.metrics)
    return {s.name for family in sidecar.registry.collect() for s in family.samples}


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
    for name in ("instance", "gpu"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
    exprs = [t["expr"] for p in CONTENT for t in p["targets"]]
    assert all('instance=~"$instance"' in e for e in exprs), "every query filters by node"
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
    ):
        assert words in titles, words


def test_every_metric_name_is_one_the_collectors_export():
    exported = exported_names()
    for where, expr in dashboard_expressions() + alert_expressions():
        names = metric_names(expr)
        assert names, where
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported"


def test_no_macro_is_left_after_substitution():
    for where, expr in dashboard_expressions():
        assert "$" not in expr, where


def test_alert_rules_are_complete():
    rules = load_alerts()
    names = {r["alert"] for r in rules}
    assert {
        "GatekeeperGpuHeadroomLow",
        "GatekeeperPredictionErrorHigh",
        "GatekeeperWorkerRestarting",
        "GatekeeperGpuCollectionFailing",
    } <= names
    for r in rules:
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]


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
