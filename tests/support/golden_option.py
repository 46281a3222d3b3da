"""Golden files: ``pytest --update-golden`` rewrites ``tests/golden/*`` from the current
output instead of comparing with it (like the exporter's ``-update``).

A pytest plugin: ``tests/conftest.py`` loads it with
``pytest_plugins = ["tests.support.golden_option"]``. Until then the option is unknown to
pytest and ``check_golden`` compares (it never rewrites).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parents[1] / "golden"
OPTION = "--update-golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        action="store_true",
        default=False,
        help="rewrite the golden files under tests/golden/ from the current output",
    )


def check_golden(config: pytest.Config, name: str, text: str) -> None:
    """Compare ``text`` with ``tests/golden/<name>``, or rewrite it under ``--update-golden``."""
    path = GOLDEN_DIR / name
    if config.getoption(OPTION, default=False):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path} does not exist; create it with `pytest {OPTION}` and review it")
    expected = path.read_text()
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{path} (golden)",
                tofile="current output",
            )
        )
        pytest.fail(
            f"output differs from {path}; if the change is intended, run `pytest {OPTION}` "
            f"and review the diff:\n{diff}"
        )
