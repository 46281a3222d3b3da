"""Every PromQL expression gatekeeper ships: the Grafana dashboard's (panel targets and
variable queries) and the alert rules', with Grafana's macros replaced so that
Prometheus and promtool can run them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "gatekeeper.json"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"

MACROS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$instance": ".*",
    "$gpu": ".*",
    "$hostname": ".*",
    "$webhook": ".*",
    "$agent": ".*",
}
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?(\w+)\)$")
METRIC_NAME = re.compile(r"\bgatekeeper_[a-z0-9_]+")
VLLM_NAME = re.compile(r"\bvllm:[a-z0-9_]+")
"""The workers' own series (vLLM's names), scraped through /discovery/workers."""
APISERVER_NAME = re.compile(r"\bapiserver_[a-z0-9_]+")
"""The API server's series (its admission webhook counters)."""


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def load_alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def substitute(expr: str) -> str:
    """``expr`` with Grafana's macros and the dashboard's variables replaced (longest first)."""
    for macro in sorted(MACROS, key=len, reverse=True):
        expr = expr.replace(macro, MACROS[macro])
    return expr


def variable_selector(query: str) -> str | None:
    """The series selector inside ``label_values(selector, label)``, if any."""
    match = _LABEL_VALUES.match(query.strip())
    return match.group(1) if match else None


def dashboard_expressions() -> list[tuple[str, str]]:
    """(where, expression) for every panel target and variable query, macros replaced."""
    dashboard = load_dashboard()
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", substitute(t["expr"])))
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            selector = variable_selector(v["query"]["query"])
            assert selector is not None, v["name"]
            out.append((f"variable {v['name']}", substitute(selector)))
    return out


def alert_expressions() -> list[tuple[str, str]]:
    return [(f"alert {r['alert']}", r["expr"]) for r in load_alerts()]


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


def vllm_names(expr: str) -> set[str]:
    return set(VLLM_NAME.findall(expr))


def apiserver_names(expr: str) -> set[str]:
    return set(APISERVER_NAME.findall(expr))


WEBHOOK_PREFIX = "gatekeeper_webhook_"
"""The standalone webhook's own series (job ``gatekeeper-webhook``), not the sidecars'."""


AGENT_PREFIXES = ("gatekeeper_agent_", "gatekeeper_pod_")
"""The node agent's own series (job ``gatekeeper-agent``), not the sidecars'; its per-pod
figures reuse the worker families with a ``pod`` label, which the sidecar never sets."""


def from_other_jobs(expr: str) -> bool:
    """Whether ``expr`` reads series no sidecar serves: the webhook's, the node agent's or
    the API server's (tests/metrics/test_prometheus_real.py scrapes stand-ins of each)."""
    names = metric_names(expr)
    webhook = any(name.startswith(WEBHOOK_PREFIX) for name in names)
    agent = any(name.startswith(AGENT_PREFIXES) for name in names) or 'pod!=""' in expr
    return webhook or agent or bool(apiserver_names(expr))
