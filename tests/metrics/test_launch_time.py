"""The dashboard's "Launch time" panel shows a model's first launch.

``gatekeeper_worker_launch_duration_seconds`` has a ``model`` label, so a model's series
appears only when its first worker becomes ready, already holding that launch (count 1 at
its first scrape). ``increase()`` counts from the first sample, so over that series it is 0
and ``histogram_quantile`` of all-zero buckets is NaN: an empty panel. The panel counts a
series that did not exist at the range's start whole. ``promtool test rules`` evaluates the
panel's own expressions over series written minute by minute; test_prometheus_real.py runs
them on a real Prometheus after exactly one launch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.metrics.events import LAUNCH_BUCKETS
from tests.support.promql_sources import load_dashboard, panels, substitute

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is missing")

NAME = "gatekeeper_worker_launch_duration_seconds_bucket"
MINUTES = 11
"""Samples at 0..10 minutes; the panel is evaluated at 10m over its 5m range."""


def launch_expressions() -> dict[str, str]:
    """The Launch time panel's expressions by legend suffix (p50, p95), macros replaced."""
    (panel,) = [p for p in panels(load_dashboard()) if p["title"].startswith("Launch time")]
    return {t["legendFormat"].split()[-1]: substitute(t["expr"]) for t in panel["targets"]}


def bucket_series(model: str, launches: list[tuple[int, float]], first: int) -> list[Any]:
    """The model's bucket series, present from minute ``first``, with ``launches`` as
    (minute, seconds): one input series per ``le``."""
    out = []
    for le in [*map(str, LAUNCH_BUCKETS), "+Inf"]:
        values = []
        for minute in range(MINUTES):
            count = sum(1 for at, s in launches if at <= minute and s <= float(le))
            values.append("_" if minute < first else str(count))
        labels = f'instance="node-a:8080", model="{model}", le="{le}"'
        out.append({"series": f"{NAME}{{{labels}}}", "values": " ".join(values)})
    return out


def midpoint(seconds: float, q: float) -> float:
    """histogram_quantile of one observation: linear within the bucket holding it."""
    upper = next(b for b in LAUNCH_BUCKETS if seconds <= b)
    lower = max((b for b in LAUNCH_BUCKETS if b < upper), default=0.0)
    return lower + (upper - lower) * q


def assert_promtool_passes(path: Path, series: list[Any], tests: list[Any]) -> None:
    """Write a ``promtool test rules`` unit of ``tests`` over ``series`` (1m steps) to
    ``path`` and assert that it passes."""
    unit = {
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run(
        ["promtool", "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_launch_time_shows_first_launches_and_launches_within_the_range(tmp_path: Path):
    series = [
        # The first launch of "first" (42 s) at 7m: its series appears holding it.
        *bucket_series("first", [(7, 42.0)], first=7),
        # "again" launched at 0m (100 s, before the range) and again at 8m (42 s).
        *bucket_series("again", [(0, 100.0), (8, 42.0)], first=0),
        # "old" launched at 1m only: nothing in the range, so no bar.
        *bucket_series("old", [(1, 42.0)], first=1),
    ]
    tests = []
    for legend, expr in launch_expressions().items():
        q = 0.5 if legend == "p50" else 0.95
        samples = [
            {"labels": f'{{model="{model}"}}', "value": midpoint(42.0, q)}
            for model in ("again", "first")
        ]
        tests.append({"expr": expr, "eval_time": "10m", "exp_samples": samples})
    assert_promtool_passes(tmp_path / "launch_time_test.yml", series, tests)


def test_a_bare_increase_leaves_the_first_launch_out(tmp_path: Path):
    """The expression the panel had: the first launch gives no number (NaN, or nothing)."""
    series = bucket_series("first", [(7, 42.0)], first=7)
    old = f"histogram_quantile(0.5, sum by (le, model) (increase({NAME}[5m]))) > 0"
    tests = [{"expr": old, "eval_time": "10m", "exp_samples": []}]
    assert_promtool_passes(tmp_path / "bare_increase_test.yml", series, tests)
