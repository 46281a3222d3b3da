"""Calibration: bounded per-family corrections that shrink the next launch's error."""

from __future__ import annotations

import json
import logging
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gatekeeper.estimator.calibration import BOUNDS, CORRECTED, CalibrationTable, scale_estimate
from gatekeeper.estimator.components import MEMORY_COMPONENTS
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.metrics.gpus import CalibrationCollector
from gatekeeper.models.source import resolve_model
from gatekeeper.sidecar.calibrator import CALIBRATION_FILENAME, Calibrator, load_table, save_table
from gatekeeper.units import GIB

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
H100 = GpuTarget(total_bytes=round(79.19 * GIB), name="H100-80GB")


def components(e: Estimate) -> dict[str, int]:
    """The worst stage's corrected components, by name."""
    return {c.name: getattr(e.worst, c.field) for c in MEMORY_COMPONENTS if c.corrected}


def stand_in_worker(raw: dict[str, int], factors: dict[str, float]) -> dict[str, int]:
    """What the stand-in worker claims: the raw prediction times a configured factor."""
    return {c: round(b * factors.get(c, 1.0)) for c, b in raw.items()}


def errors(predicted: dict[str, int], actual: dict[str, int]) -> dict[str, float]:
    return {c: (actual[c] - predicted[c]) / predicted[c] for c in predicted if predicted[c]}


TRUE_FACTORS = {"activation": 1.18, "cuda_graph": 0.85, "non_torch": 1.6}


def launch(calibrator: Calibrator, family: str) -> dict[str, float]:
    """One launch: admit with the current correction, run, record; the errors seen."""
    raw = estimate(LLAMA8, ServeOptions(max_model_len=8192), H100)
    applied = calibrator.factors(family)
    predicted = components(scale_estimate(raw, applied))
    actual = stand_in_worker(components(raw), TRUE_FACTORS)
    calibrator.record_worker(family, predicted, actual, applied)
    return errors(predicted, actual)


def test_the_second_launch_of_a_family_is_closer_than_the_first(tmp_path):
    calibrator = Calibrator.in_state_dir(tmp_path)
    first = launch(calibrator, LLAMA8.model_type)
    second = launch(calibrator, LLAMA8.model_type)
    for component in ("activation", "cuda_graph", "non_torch"):
        assert abs(second[component]) < abs(first[component]), component
    assert second["activation"] == pytest.approx(0, abs=1e-6)
    assert second["cuda_graph"] == pytest.approx(0, abs=1e-6)
    # 1.6 is beyond the bound: corrected by 1.25 only, the rest stays visible.
    assert second["non_torch"] == pytest.approx(1.6 / 1.25 - 1, rel=1e-3)
    assert first["weights"] == second["weights"] == 0
    assert (tmp_path / CALIBRATION_FILENAME).exists()


def test_a_later_launch_keeps_the_error_small_and_other_families_are_untouched(tmp_path):
    calibrator = Calibrator.in_state_dir(tmp_path)
    for _ in range(4):
        last = launch(calibrator, "llama")
    assert abs(last["activation"]) < 1e-6
    assert calibrator.factors("qwen2") == {}
    assert launch(calibrator, "qwen2")["activation"] == pytest.approx(0.18, rel=1e-3)


def test_switched_off_it_neither_learns_nor_corrects(tmp_path):
    calibrator = Calibrator.in_state_dir(tmp_path, enabled=False)
    first = launch(calibrator, "llama")
    second = launch(calibrator, "llama")
    assert first == second
    assert calibrator.metric_items() == {}
    assert not (tmp_path / CALIBRATION_FILENAME).exists()


@given(
    truth=st.floats(min_value=0.3, max_value=3.0),
    second_truth=st.floats(min_value=0.3, max_value=3.0),
)
def test_factors_stay_within_bounds(truth, second_truth):
    table = CalibrationTable().record("llama", "activation", 1000, round(1000 * truth))
    table = table.record(
        "llama",
        "activation",
        table.apply("llama", {"activation": 1000})["activation"],
        round(1000 * second_truth),
        applied=table.factor("llama", "activation"),
    )
    assert BOUNDS[0] <= table.factor("llama", "activation") <= BOUNDS[1]


@given(truth=st.floats(min_value=0.5, max_value=2.0))
def test_with_a_steady_truth_the_error_never_grows(truth):
    table = CalibrationTable()
    raw, actual = 10_000, round(10_000 * truth)
    first = abs(actual - raw) / raw
    table = table.record("f", "activation", raw, actual)
    predicted = table.apply("f", {"activation": raw})["activation"]
    assert abs(actual - predicted) / predicted <= first + 1e-3


def test_the_running_mean_follows_the_worked_example():
    table = CalibrationTable().record("llama", "activation", GIB, round(1.2 * GIB))
    assert table.factor("llama", "activation") == pytest.approx(1.2)
    predicted = table.apply("llama", {"activation": GIB})["activation"]
    table = table.record(
        "llama",
        "activation",
        predicted,
        round(1.1 * GIB),
        applied=table.factor("llama", "activation"),
    )
    assert table.factor("llama", "activation") == pytest.approx(0.7 * 1.2 + 0.3 * 1.1, rel=1e-6)
    assert table.entries[("llama", "activation")].samples == 2


@pytest.mark.parametrize(
    ("component", "predicted", "actual"),
    [
        ("kv_cache", GIB, 2 * GIB),  # derived, never corrected
        ("activation", 0, GIB),  # nothing predicted (enforce eager graphs, say)
        ("activation", GIB, -1),
        ("activation", GIB, 10 * GIB),  # implausible: a misread log line
        ("activation", GIB, 0),
    ],
)
def test_unusable_pairs_are_ignored(component, predicted, actual):
    table = CalibrationTable()
    assert table.record("llama", component, predicted, actual) is table


def test_apply_scales_only_learned_components():
    table = CalibrationTable().record("llama", "cuda_graph", 1000, 1100)
    assert table.apply("llama", {"cuda_graph": 1000, "weights": 500, "kv_cache": 7}) == {
        "cuda_graph": 1100,
        "weights": 500,
        "kv_cache": 7,
    }


def test_scale_estimate_changes_only_the_static_components():
    raw = estimate(LLAMA8, ServeOptions(max_model_len=8192, tensor_parallel_size=2), H100)
    scaled = scale_estimate(raw, {"activation": 1.1, "kv_cache": 2.0})
    for before, after in zip(raw.stages, scaled.stages, strict=True):
        assert after.activation_peak_bytes == math.ceil(before.activation_peak_bytes * 1.1)
        assert after.kv_cache_bytes == before.kv_cache_bytes
        assert after.weights_bytes == before.weights_bytes
    assert scale_estimate(raw, {}) is raw
    assert scale_estimate(raw, {"weights": 1.0}) is raw


def test_the_table_round_trips_through_the_state_directory(tmp_path):
    calibrator = Calibrator.in_state_dir(tmp_path)
    calibrator.record_worker("llama", {"activation": 1000}, {"activation": 1200})
    calibrator.record_worker("qwen2", {"cuda_graph": 1000}, {"cuda_graph": 900})
    again = Calibrator.in_state_dir(tmp_path)
    assert again.table.entries == calibrator.table.entries
    data = json.loads((tmp_path / CALIBRATION_FILENAME).read_text())
    assert data["schema"] == "gatekeeper.calibration/v1"
    assert {(f["family"], f["component"]) for f in data["factors"]} == {
        ("llama", "activation"),
        ("qwen2", "cuda_graph"),
    }


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        '{"schema": "other/v9", "factors": []}',
        '{"schema": "gatekeeper.calibration/v1", "factors": [{"family": "x"}]}',
        '{"schema": "gatekeeper.calibration/v1", "factors": [{"family": "x", "component": '
        '"activation", "ratio": -1, "samples": 1}]}',
        "[]",
    ],
)
def test_an_unreadable_file_starts_empty_with_a_warning(tmp_path, content, caplog):
    path = tmp_path / CALIBRATION_FILENAME
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="gatekeeper.estimator.calibration"):
        assert load_table(path).entries == {}
    assert "cannot be read" in caplog.text
    assert load_table(tmp_path / "missing.json").entries == {}


def test_save_is_atomic_and_creates_the_directory(tmp_path):
    path = tmp_path / "state" / CALIBRATION_FILENAME
    table = CalibrationTable().record("llama", "weights", 100, 101)
    save_table(path, table)
    assert load_table(path).entries == table.entries
    assert [p.name for p in path.parent.iterdir()] == [CALIBRATION_FILENAME]


def test_the_factors_are_exported_as_a_metric(tmp_path):
    calibrator = Calibrator.in_state_dir(tmp_path)
    calibrator.record_worker("llama", {"activation": 1000}, {"activation": 2000})
    registry = CollectorRegistry()
    CalibrationCollector(calibrator.metric_items, registry=registry)
    labels = {"family": "llama", "component": "activation"}
    assert registry.get_sample_value("gatekeeper_calibration_factor_ratio", labels) == 1.25
    assert registry.get_sample_value("gatekeeper_calibration_samples", labels) == 1
    assert set(CORRECTED) == {"weights", "activation", "non_torch", "cuda_graph"}
