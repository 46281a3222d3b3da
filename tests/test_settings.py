"""Settings from GATEKEEPER_* environment variables and a TOML file."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gatekeeper.settings import (
    Settings,
    SettingsError,
    load_settings,
    setting_source,
    unknown_environment,
)


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


def refused(tmp_path, monkeypatch, toml: str) -> tuple[str, str]:
    """(the path, the SettingsError's message) of loading a file holding ``toml``."""
    monkeypatch.delenv("GATEKEEPER_CONFIG_FILE", raising=False)
    path = tmp_path / "gatekeeper.toml"
    path.write_text(toml)
    with pytest.raises(SettingsError) as info:
        load_settings(path)
    return str(path), str(info.value)


def test_an_unknown_key_in_the_file_names_the_nearest_setting(tmp_path, monkeypatch):
    path, message = refused(tmp_path, monkeypatch, "prot = 18123\n")
    assert message == (
        f"unknown setting 'prot' in settings file {path!r} (prot = 18123); did you mean 'port'?"
    )
    assert "GATEKEEPER_PROT" not in message


def test_an_unknown_key_of_a_model_entry_and_one_with_no_near_name(tmp_path, monkeypatch):
    monkeypatch.delenv("GATEKEEPER_CONFIG_FILE", raising=False)
    path = tmp_path / "gatekeeper.toml"
    path.write_text('[[models]]\nname = "a"\nmodle = "Qwen/Qwen3-8B"\n')
    with pytest.raises(SettingsError, match=r"unknown key 'modle' in models\[0\] .*'model'\?"):
        load_settings(path)
    path.write_text("zzzzzz = 1\n")
    with pytest.raises(SettingsError, match="the keys are: state_dir, allow_network"):
        load_settings(path)


def test_an_unknown_key_near_a_secret_hides_its_value(tmp_path, monkeypatch):
    _, message = refused(tmp_path, monkeypatch, 'admin_tokn = "s3cr3t-value"\n')
    assert "did you mean 'admin_token'?" in message
    assert "s3cr3t" not in message and "<hidden, 12 characters>" in message


def test_gatekeeper_config_is_refused_naming_gatekeeper_config_file(tmp_path, monkeypatch):
    path = tmp_path / "gatekeeper.toml"
    path.write_text("port = 9000\n")
    monkeypatch.setenv("GATEKEEPER_CONFIG", str(path))
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert "GATEKEEPER_CONFIG_FILE=PATH" in str(info.value) and str(path) in str(info.value)
    monkeypatch.delenv("GATEKEEPER_CONFIG")
    monkeypatch.setenv("GATEKEEPER_CONFIG_FILE", str(path))
    assert load_settings().port == 9000


def test_unknown_environment_variables_are_found_with_the_nearest_name():
    environ = {
        "GATEKEEPER_PROT": "1",
        "GATEKEEPER_PORT": "2",
        "gatekeeper_admin_tokn": "x",
        "GATEKEEPER_QQQQQQ": "1",
        "GATEKEEPER_SIM_WEIGHTS_BYTES": "1",  # the simulator's, not a setting
        "GATEKEEPER_DEBUG": "1",
        "OTHER": "1",
    }
    assert unknown_environment(environ) == [
        "environment variable GATEKEEPER_PROT is not a gatekeeper setting; "
        "did you mean GATEKEEPER_PORT?",
        "environment variable GATEKEEPER_QQQQQQ is not a gatekeeper setting; "
        "the settings are listed in gatekeeper/settings.py",
        "environment variable gatekeeper_admin_tokn is not a gatekeeper setting; "
        "did you mean GATEKEEPER_ADMIN_TOKEN?",
    ]


def test_setting_source_names_the_variable_the_file_or_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv("GATEKEEPER_CONFIG_FILE", raising=False)
    monkeypatch.delenv("GATEKEEPER_ADMIN_TOKEN", raising=False)
    path = tmp_path / "gatekeeper.toml"
    path.write_text('admin_token = "t"\n')
    from_file = load_settings(path)
    assert setting_source(from_file, "admin_token") == f"settings file {str(path)!r} (admin_token)"
    assert setting_source(from_file, "port") == "default"
    monkeypatch.setenv("GATEKEEPER_ADMIN_TOKEN", "u")
    from_env = load_settings(path)
    assert from_env.admin_token == "u"
    assert setting_source(from_env, "admin_token") == "environment variable GATEKEEPER_ADMIN_TOKEN"


# The sidecar's configured vLLM release picks the flag table its doors read options with:
# [[models]] options when the settings load, and the admin API's deployments.


@pytest.mark.parametrize(("release", "has_kv_bytes"), [("0.8.5", False), ("0.11.0", True),
                                                      ("0.33.0", True)])  # fmt: skip
def test_model_options_are_read_with_the_configured_release(release, has_kv_bytes):
    entry = {"name": "a", "model": "Qwen/Qwen3-0.6B",
             "options": {"kv_cache_memory_bytes": "4G", "max-num-seq": 8}}  # fmt: skip
    if has_kv_bytes:
        settings = Settings.model_validate({"default_vllm_version": release, "models": [entry]})
        assert settings.models[0].options["max-num-seq"] == 8
        return
    with pytest.raises(ValidationError) as raised:
        Settings.model_validate({"default_vllm_version": release, "models": [entry]})
    assert (
        "models[0].options: 'kv_cache_memory_bytes' is not a flag of vllm serve 0.8.5 (it "
        "came in vLLM 0.10.2;" in str(raised.value)
    )


def test_the_configured_release_must_be_a_version():
    with pytest.raises(ValidationError, match="'banana' is not a version"):
        Settings(default_vllm_version="banana")


@pytest.mark.parametrize("release", ["0.8.5", "0.11.0", "0.33.0"])
def test_admin_deployments_are_read_with_the_sidecars_release(tmp_path, release):
    """POST /admin/deployments: 0.8.5 has no --kv-cache-memory-bytes (a 400 naming the
    release that brought it); abbreviated keys are read as vLLM's argparse reads them."""
    from tests.support.sidecar_harness import running_sidecar, settings_for

    body = {"model": "tiny", "options": {"kv_cache_memory_bytes": "4G", "max-num-seq": 8}}
    with running_sidecar(settings_for(tmp_path, default_vllm_version=release)) as sidecar:
        answer = sidecar.admin.post("/admin/deployments", json=body)
        if release == "0.8.5":
            assert answer.status_code == 400, answer.text
            assert "is not a flag of vllm serve 0.8.5 (it came in vLLM 0.10.2" in answer.text
            return
        assert answer.status_code == 201, answer.text
        args = answer.json()["deployment"]["vllm_args"]
        assert args[args.index("--max-num-seqs") + 1] == "8"
        assert args[args.index("--kv-cache-memory-bytes") + 1] == str(4 << 30)
