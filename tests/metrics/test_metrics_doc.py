"""``docs/metrics.md`` against what the sidecar and the node agent export: every family
that ``register_collectors`` (and the agent's ``AgentCollector``) puts on a registry has
its row in the doc's tables, with its type, and the tables name no family that is not
exported."""

from __future__ import annotations

import re

from prometheus_client.metrics_core import Metric

from gatekeeper.gpus.static import StaticInventory
from tests.support.agent_state import agent_registry
from tests.support.metrics_fixtures import sidecar_registry
from tests.support.promql_sources import ROOT

DOC = ROOT / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(gatekeeper_[a-z_]+)(?:\{[a-z_, ]*\})?` \| ([a-z]+) \|(.*)$", re.MULTILINE)
"""A table row: the name in backticks (with the labels it adds in braces), its type, the
rest of the row."""
EXPOSED_SUFFIX = {"counter": "_total", "info": "_info"}
"""What the exposition appends to a counter's and an info's family name."""


def families() -> dict[str, Metric]:
    """Name as exposed -> family, for every family of a sidecar's and an agent's registry."""
    inventory = StaticInventory.from_json(ROOT / "tests" / "fixtures" / "gpus" / "h100_80g_x8.json")
    registries = (sidecar_registry(inventory).registry, agent_registry())
    return {f.name + EXPOSED_SUFFIX.get(f.type, ""): f for r in registries for f in r.collect()}


def exported() -> dict[str, str]:
    """Name as exposed -> type."""
    return {name: f.type for name, f in families().items()}


def documented(text: str) -> dict[str, str]:
    """Name -> type, for every row of the doc's tables."""
    return {name: kind for name, (kind, _) in _rows(text).items()}


def _rows(text: str) -> dict[str, tuple[str, str]]:
    rows = ROW.findall(text)
    names = [name for name, _, _ in rows]
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, f"docs/metrics.md has more than one row for {repeated}"
    return {name: (kind, rest) for name, kind, rest in rows}


def test_every_exported_family_has_its_row_in_docs_metrics_md():
    families, rows = exported(), documented(DOC.read_text())
    missing = sorted(set(families) - set(rows))
    assert not missing, f"exported but without a row in docs/metrics.md: {missing}"
    stale = sorted(set(rows) - set(families))
    assert not stale, f"docs/metrics.md has rows for families not exported: {stale}"
    wrong = {n: (rows[n], t) for n, t in families.items() if rows[n] != t}
    assert not wrong, f"docs/metrics.md's type differs from the exported one: {wrong}"


def test_the_check_reads_rows_and_catches_a_missing_or_extra_one():
    text = DOC.read_text()
    rows = documented(text)
    assert rows["gatekeeper_gpu_healthy"] == "gauge"
    assert rows["gatekeeper_worker_predicted_bytes"] == "gauge"  # the {component} is read
    assert len(rows) == len(exported())
    without = text.replace("| `gatekeeper_gpu_healthy` |", "| gatekeeper_gpu_healthy |")
    assert "gatekeeper_gpu_healthy" not in documented(without)
    extra = text + "\n| `gatekeeper_gpu_power_watts` | gauge | not exported |\n"
    assert "gatekeeper_gpu_power_watts" in set(documented(extra)) - set(exported())


def test_a_family_is_deprecated_in_its_help_exactly_when_its_row_says_so():
    rows = _rows(DOC.read_text())
    deprecated = {n for n, f in families().items() if f.documentation.startswith("DEPRECATED: use")}
    assert "gatekeeper_gpu_memory_reserved_bytes" in deprecated  # until it is removed
    assert {n for n, (_, rest) in rows.items() if "deprecated" in rest.lower()} == deprecated
