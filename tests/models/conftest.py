"""Fixtures of the model tests: an isolated Hugging Face set-up and the stand-in hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from tests.support.fake_hub import FakeHub, serve_fake_hub


@pytest.fixture(autouse=True)
def _isolated_hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No saved token, no offline switch, no shared cache: only what each test sets."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with serve_fake_hub() as state:
        yield state
