"""Settings from GATEKEEPER_* environment variables and a TOML file."""

from __future__ import annotations

import pytest

from gatekeeper.settings import SettingsError, load_settings


def test_environment_overrides_defaults(monkeypatch):
    monkeypatch.setenv("GATEKEEPER_DEFAULT_VLLM_VERSION", "0.19.0")
    monkeypatch.setenv("GATEKEEPER_ALLOW_NETWORK", "true")
    s = load_settings()
    assert s.default_vllm_version == "0.19.0" and s.allow_network is True


def test_toml_file_is_read(tmp_path, monkeypatch):
    monkeypatch.delenv("GATEKEEPER_CONFIG_FILE", raising=False)
    path = tmp_path / "gatekeeper.toml"
    path.write_text('default_vllm_version = "0.10.1"\nsafety_margin_bytes = 1073741824\n')
    s = load_settings(path)
    assert s.default_vllm_version == "0.10.1" and s.safety_margin_bytes == 1 << 30


def test_invalid_value_names_the_field(monkeypatch):
    monkeypatch.delenv("GATEKEEPER_CONFIG_FILE", raising=False)
    monkeypatch.setenv("GATEKEEPER_SAFETY_MARGIN_FRACTION", "2")
    with pytest.raises(SettingsError, match="safety_margin_fraction"):
        load_settings()


def test_missing_toml_file_is_a_clear_error(tmp_path):
    with pytest.raises(SettingsError, match="not a readable file"):
        load_settings(tmp_path / "nope.toml")
