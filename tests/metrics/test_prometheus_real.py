"""A real Prometheus (Debian's ``prometheus`` package) scraping gatekeeper's collectors.

A small HTTP server on 127.0.0.1 exposes every collector over a declared node with a
few workers, another a vLLM worker's ``/metrics`` (``data/vllm_worker.prom``, with the
target labels ``/discovery/workers`` gives), another the webhook's metrics after a few
reviews (the job ``gatekeeper-webhook``), another a node agent's (the job
``gatekeeper-agent``) and another the API server's admission webhook counters
(``data/apiserver_admission.prom``); Prometheus scrapes them every second.
Then every dashboard expression and every alert expression runs through Prometheus'
HTTP API, and ``promtool test rules`` runs the alert unit tests.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.gpus.static import StaticInventory
from gatekeeper.k8s.webhook import WebhookMetrics
from gatekeeper.units import GIB
from tests.metrics.text_exporter import APISERVER, VLLM_WORKER, serve_registry, serve_text
from tests.support.agent_state import agent_registry
from tests.support.metrics_fixtures import (
    FAILED,
    LLAMA,
    QWEN,
    STOPPED,
    record_events,
    sidecar_registry,
)
from tests.support.metrics_fixtures import NODE as NODE_NAME
from tests.support.prometheus_server import MISSING, SKIP_REASON, query, run_prometheus
from tests.support.promql_sources import (
    ALERTS,
    ALERTS_TEST,
    alert_expressions,
    apiserver_names,
    dashboard_expressions,
    load_dashboard,
    metric_names,
    panels,
    substitute,
    vllm_names,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(MISSING), reason=SKIP_REASON)]

# Two H100s held by the TP=2 llama worker's ranks (211, 212 under root 210): a whole-card
# worker, no alert. A free H100 for the loading qwen worker, and an L4 that another
# process nearly filled after a worker was admitted to it (the pending-workers alert).
NODE = {
    "gpus": [
        {"name": "H100-80GB", "used": "60GiB", "processes": [{"pid": 211, "used": "60GiB"}]},
        {"name": "H100-80GB", "used": "60GiB", "processes": [{"pid": 212, "used": "60GiB"}]},
        {"name": "H100-80GB"},
        {"name": "L4", "used": "21.5GiB", "processes": [{"pid": 4242, "used": "21.5GiB"}]},
    ]
}
# The llama worker holds 120 GiB where 80 GiB were predicted: +50% (the error alert).
OVER = dataclasses.replace(LLAMA, predicted_total_bytes=(40 * GIB, 40 * GIB))
ADMITTED = dataclasses.replace(
    QWEN, worker="qwen-7b-0a1b2c3d", state="admitted", gpu_indices=(3,), pid=None
)
FIRING = {
    "alert GatekeeperGpuShortForPendingWorkers",
    "alert GatekeeperPredictionDrift",
    "alert GatekeeperWorkerFailed",
    "alert GatekeeperPodOnVanishedGpu",  # the agent's pod on a vanished GPU
    "alert GatekeeperUnclaimedGpuPods",  # the agent's pod holding a whole GPU in no claim
}


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """gatekeeper's collectors served on 127.0.0.1; yields host:port."""
    node_file = tmp_path_factory.mktemp("node") / "node.json"
    node_file.write_text(json.dumps(NODE))
    inventory = StaticInventory(parse_declared_node(str(node_file)))
    sidecar = sidecar_registry(inventory, (OVER, QWEN, ADMITTED, FAILED, STOPPED))
    record_events(sidecar.metrics)
    with serve_registry(sidecar.registry) as address:
        yield address


@pytest.fixture(scope="module")
def vllm_worker() -> Iterator[str]:
    """A vLLM worker's /metrics (vLLM 0.32's names) on 127.0.0.1; yields host:port."""
    with serve_text(VLLM_WORKER.read_text()) as address:
        yield address


@pytest.fixture(scope="module")
def webhook_registry() -> tuple[CollectorRegistry, WebhookMetrics]:
    """The webhook's metrics (gatekeeper/k8s/webhook.py) after a few reviews."""
    registry = CollectorRegistry()
    metrics = WebhookMetrics(registry)
    for outcome, seconds in (("allowed", 0.004), ("denied", 0.02), ("denied", 0.03)):
        metrics.reviews.labels(outcome).inc()
        metrics.duration.observe(seconds)
    return registry, metrics


@pytest.fixture(scope="module")
def webhook_metrics(webhook_registry: tuple[CollectorRegistry, WebhookMetrics]) -> WebhookMetrics:
    return webhook_registry[1]


@pytest.fixture(scope="module")
def webhook(webhook_registry: tuple[CollectorRegistry, WebhookMetrics]) -> Iterator[str]:
    """The webhook's metrics served on 127.0.0.1; yields host:port."""
    with serve_registry(webhook_registry[0]) as address:
        yield address


@pytest.fixture(scope="module")
def agent() -> Iterator[str]:
    """A node agent's metrics (tests/support/agent_state.py: one pod on a vanished GPU)
    on 127.0.0.1; yields host:port."""
    with serve_registry(agent_registry()) as address:
        yield address


@pytest.fixture(scope="module")
def prometheus(
    exporter: str,
    vllm_worker: str,
    webhook: str,
    agent: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[httpx.Client]:
    """A real Prometheus scraping ``exporter``, ``vllm_worker``, ``webhook`` and the API
    server's counters every second, with the alert rules loaded; the worker has the labels
    /discovery/workers gives it, the webhook the job its ServiceMonitor gives it."""
    work = tmp_path_factory.mktemp("prometheus")
    labels = {"model": OVER.model, "worker": OVER.worker, "gpu": "0,1", "Hostname": NODE_NAME}
    jobs = [
        {
            "job_name": "gatekeeper-workers",
            "static_configs": [{"targets": [vllm_worker], "labels": labels | {"node": NODE_NAME}}],
        },
        {"job_name": "gatekeeper-webhook", "static_configs": [{"targets": [webhook]}]},
        {"job_name": "gatekeeper-agent", "static_configs": [{"targets": [agent]}]},
    ]
    with serve_text(APISERVER.read_text()) as apiserver:
        jobs.append({"job_name": "apiserver", "static_configs": [{"targets": [apiserver]}]})
        with run_prometheus([exporter], work, rule_files=[ALERTS], scrape_configs=jobs) as client:
            yield client


@pytest.mark.parametrize(("where", "expr"), dashboard_expressions(), ids=lambda x: str(x)[:60])
def test_dashboard_expression_returns_series(prometheus, where, expr):
    assert query(prometheus, expr), f"{where}: no series for {expr}"


@pytest.mark.parametrize(("where", "expr"), alert_expressions(), ids=lambda x: str(x)[:60])
def test_alert_expression_runs_and_its_metrics_have_series(prometheus, where, expr):
    result = query(prometheus, expr)
    for name in metric_names(expr) | vllm_names(expr) | apiserver_names(expr):
        assert query(prometheus, name), f"{where}: {name} has no series"
    if where in FIRING:
        assert result, f"{where} should match the fixture node: {expr}"
    else:
        assert not result, f"{where} should not match the fixture node: {result}"


LEGENDS = [
    (f"panel {p['id']} {t['refId']}", substitute(t["expr"]), label)
    for p in panels(load_dashboard())
    for t in p.get("targets", [])
    for label in re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", ""))
]


@pytest.mark.parametrize(("where", "expr", "label"), LEGENDS, ids=lambda x: str(x)[:40])
def test_every_legend_label_is_on_its_series(prometheus, where, expr, label):
    result = query(prometheus, expr)
    assert result and all(label in r["metric"] for r in result), f"{where}: no {label}"


def test_only_the_gpu_promised_to_a_starting_worker_is_short(prometheus):
    """The whole-card llama worker (GPUs 0, 1) and the loading qwen worker (GPU 2) are
    healthy; the worker admitted to the L4 (GPU 3) another process filled is not."""
    (expr,) = [e for w, e in alert_expressions() if w.endswith("ShortForPendingWorkers")]
    (short,) = query(prometheus, expr)
    assert short["metric"]["gpu"] == "3" and short["metric"]["Hostname"] == NODE_NAME
    assert float(short["value"][1]) == 20 * GIB


def test_the_core_series_hold_the_collectors_values(prometheus):
    headroom = query(prometheus, 'gatekeeper_gpu_headroom_bytes{gpu="3"}')
    assert float(headroom[0]["value"][1]) < 0
    actual = query(prometheus, 'gatekeeper_worker_actual_bytes{gpu="0"}')
    assert float(actual[0]["value"][1]) == 60 * GIB
    assert query(prometheus, "gatekeeper_gpu_collect_success")[0]["value"][1] == "1"
    states = query(prometheus, "gatekeeper_workers")
    assert len(states) == 10  # WORKER_STATES, unhealthy (#27 item 7), sleeping and waking (#40)


def test_launch_time_shows_a_value_after_exactly_one_launch(prometheus):
    """record_events made one launch (llama-70b, 42 s, in the bucket 30-45 s): the Launch
    time panel shows it, though its series appeared holding it (test_launch_time.py)."""
    (panel,) = [p for p in panels(load_dashboard()) if p["title"].startswith("Launch time")]
    shown = {}
    for target in panel["targets"]:
        (bar,) = query(prometheus, substitute(target["expr"]))
        shown[target["legendFormat"].split()[-1]] = (bar["metric"]["model"], float(bar["value"][1]))
    assert shown == {"p50": (LLAMA.model, 37.5), "p95": (LLAMA.model, 44.25)}


def test_the_webhook_row_shows_reviews_made_while_scraped(prometheus, webhook_metrics):
    """Denials and their latency (20 ms, in the bucket 10-25 ms) counted while Prometheus
    scrapes reach the webhook row's panels as numbers."""
    row = [p for p in panels(load_dashboard()) if p["title"].lower().startswith("webhook")]
    exprs = {p["title"].split()[1]: [substitute(t["expr"]) for t in p["targets"]] for p in row}
    for _ in range(30):
        webhook_metrics.reviews.labels("denied").inc()
        webhook_metrics.duration.observe(0.02)
    deadline = time.monotonic() + 15
    while not query(prometheus, f"({exprs['denials,'][0]}) > 0"):
        assert time.monotonic() < deadline, "the denials never reached the panel"
        time.sleep(0.25)
    (median,) = query(prometheus, exprs["review"][0])
    assert 0.01 < float(median["value"][1]) <= 0.025
    outcomes = {r["metric"]["outcome"] for r in query(prometheus, exprs["reviews"][0])}
    assert outcomes == {"allowed", "warned", "denied", "skipped", "ignored", "malformed"}


def test_prometheus_loaded_the_alert_rules(prometheus):
    deadline = time.monotonic() + 10
    while True:
        groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules):
            break
        assert time.monotonic() < deadline, "rules were not evaluated"
        time.sleep(0.25)
    assert len(rules) == len(alert_expressions())
    assert all(r["health"] == "ok" for r in rules), rules


def test_promtool_test_rules():
    result = subprocess.run(
        ["promtool", "test", "rules", ALERTS_TEST.name],
        cwd=ALERTS_TEST.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
