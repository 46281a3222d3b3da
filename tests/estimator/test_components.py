"""The one table of memory components (``gatekeeper.estimator.components``) against
every form that names them: the estimate's and the prediction's fields, the start-up
log's figures, calibration, the metrics' ``component`` label (which dashboards and
alert rules select on) and the admin API's JSON."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from gatekeeper.estimator.calibration import CORRECTED as CALIBRATION_CORRECTED
from gatekeeper.estimator.components import (
    COMPONENTS,
    CORRECTED,
    MEMORY_COMPONENTS,
    by_field,
    by_log_key,
    deprecated_actual_keys,
)
from gatekeeper.estimator.vllm_method import StageEstimate
from gatekeeper.metrics import COMPONENTS as METRIC_COMPONENTS
from gatekeeper.placement.types import Prediction
from gatekeeper.units import GIB
from gatekeeper.vllm.log import MemoryFigures

ROOT = Path(__file__).resolve().parents[2]
LABEL = re.compile(r'component\s*(?:=|!=|=~|!~)\s*\\?"([^"\\]*)')


def test_the_component_label_values_are_the_ones_dashboards_and_alerts_use():
    assert COMPONENTS == ("weights", "kv_cache", "activation", "non_torch", "cuda_graph")
    assert METRIC_COMPONENTS == COMPONENTS
    files = [*(ROOT / "grafana").rglob("*.json"), *(ROOT / "deploy").rglob("*.yml")]
    used = {v for f in files for v in LABEL.findall(f.read_text())}
    assert used and used <= {*COMPONENTS, "total"}, used


def test_each_field_is_the_estimates_and_the_predictions_and_in_that_order():
    stage = {f.name for f in dataclasses.fields(StageEstimate)}
    assert {c.field for c in MEMORY_COMPONENTS} <= stage
    assert {f.name for f in dataclasses.fields(Prediction)} == {c.field for c in MEMORY_COMPONENTS}
    figures = Prediction(1, 2, 3, 4, 5).to_json()
    assert list(by_field(figures)) == list(COMPONENTS)


def test_each_log_key_is_what_the_start_up_log_reports():
    assert {c.log_key for c in MEMORY_COMPONENTS} <= {
        f.name for f in dataclasses.fields(MemoryFigures)
    }
    sizes: dict[str, Any] = {c.log_key: i + 1 for i, c in enumerate(MEMORY_COMPONENTS)}
    figures = MemoryFigures(**sizes)
    assert set(figures.components()) == {c.log_key for c in MEMORY_COMPONENTS}
    assert by_log_key(figures.components()) == {c: i + 1 for i, c in enumerate(COMPONENTS)}


def test_calibration_corrects_all_but_the_kv_cache():
    assert (
        CORRECTED == CALIBRATION_CORRECTED == ("weights", "activation", "non_torch", "cuda_graph")
    )


def test_the_worked_example():
    predicted = by_field({"activation_peak_bytes": 2 * GIB, "model": "x", "weights_bytes": True})
    actual = by_log_key({"activation_peak": round(2.5 * GIB), "kv_cache_tokens": 10})
    assert predicted == {"activation": 2 * GIB}
    assert actual == {"activation": round(2.5 * GIB)}
    assert (actual["activation"] - predicted["activation"]) / predicted["activation"] == 0.25


def test_the_deprecated_actual_keys_each_name_their_replacement():
    assert deprecated_actual_keys() == {
        "weights": "weights_bytes",
        "kv_cache": "kv_cache_bytes",
        "activation_peak": "activation_peak_bytes",
        "non_torch": "non_torch_bytes",
        "cuda_graph": "cuda_graph_bytes",
    }
