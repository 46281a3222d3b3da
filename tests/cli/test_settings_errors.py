"""Broken settings, as an operator meets them: the installed ``gatekeeper`` command run
in a subprocess with a TOML file that does not parse or an environment variable with a
value that is not valid. Each ends with exit code 2 and one line naming the file and
line or the variable, the value, and what to do; never "internal error" or a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"


def gatekeeper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    return subprocess.run(
        [str(GATEKEEPER), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
    )


def assert_clean_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 2, out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("gatekeeper: error: "), out.stderr
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr)


@pytest.mark.parametrize("command", [["gpus", "--node", "1xL4"], ["serve", "--rehearsal"]])
def test_a_toml_syntax_error_names_the_file_and_line(tmp_path: Path, command: list[str]):
    path = tmp_path / "gatekeeper.toml"
    path.write_text("share_gpus = true\nport = \n")
    out = gatekeeper("--config", str(path), *command, env={"GATEKEEPER_STATE_DIR": str(tmp_path)})
    assert_clean_error(out, str(path), "line 2", "fix the TOML syntax")


def test_a_toml_syntax_error_in_gatekeeper_config_file(tmp_path: Path):
    path = tmp_path / "gatekeeper.toml"
    path.write_text("[models\n")
    out = gatekeeper("gpus", "--node", "1xL4", env={"GATEKEEPER_CONFIG_FILE": str(path)})
    assert_clean_error(out, str(path), "line 1")


def test_a_missing_gatekeeper_config_file_is_an_error(tmp_path: Path):
    path = tmp_path / "nope.toml"
    out = gatekeeper("gpus", "--node", "1xL4", env={"GATEKEEPER_CONFIG_FILE": str(path)})
    assert_clean_error(out, "GATEKEEPER_CONFIG_FILE", str(path))


@pytest.mark.parametrize("command", [["gpus", "--node", "1xL4"], ["serve", "--rehearsal"]])
@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GATEKEEPER_PORT", "abc"),
        ("GATEKEEPER_SHARE_GPUS", "maybe"),
        ("GATEKEEPER_WORKER_ENV", "not-json"),
        ("GATEKEEPER_MODELS", "[{"),
        ("GATEKEEPER_WORKER_COMMAND", "vllm serve"),
    ],
)
def test_an_invalid_environment_variable_is_named_with_its_value(
    tmp_path: Path, command: list[str], variable: str, value: str
):
    out = gatekeeper(*command, env={variable: value, "GATEKEEPER_STATE_DIR": str(tmp_path)})
    assert_clean_error(out, f"{variable}={value!r}", "environment")


def test_an_invalid_value_in_the_toml_file_names_the_file_and_key(tmp_path: Path):
    path = tmp_path / "gatekeeper.toml"
    path.write_text('port = "abc"\n')
    out = gatekeeper("--config", str(path), "gpus", "--node", "1xL4")
    assert_clean_error(out, str(path), "'port'", "'abc'")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GATEKEEPER_API_KEYS", '["sk-secret-1", "sk secret"]'),
        ("GATEKEEPER_API_KEYS", "sk-secret-2"),
    ],
)
def test_an_invalid_secret_is_named_but_never_shown(tmp_path: Path, variable: str, value: str):
    out = gatekeeper(
        "gpus", "--node", "1xL4", env={variable: value, "GATEKEEPER_STATE_DIR": str(tmp_path)}
    )
    assert_clean_error(out, variable, "hidden")
    assert "secret" not in out.stderr, out.stderr


def test_an_unknown_key_gets_did_you_mean_not_a_variable_to_set(tmp_path: Path):
    path = tmp_path / "gatekeeper.toml"
    path.write_text("prot = 18123\n")
    out = gatekeeper("gpus", "--node", "1xL4", env={"GATEKEEPER_CONFIG_FILE": str(path)})
    assert_clean_error(out, f"unknown setting 'prot' in settings file {str(path)!r}")
    assert "did you mean 'port'?" in out.stderr and "GATEKEEPER_PROT" not in out.stderr


def test_gatekeeper_config_is_not_silently_ignored(tmp_path: Path):
    path = tmp_path / "gatekeeper.toml"
    path.write_text("port = 9000\n")
    out = gatekeeper("gpus", "--node", "1xL4", env={"GATEKEEPER_CONFIG": str(path)})
    assert_clean_error(out, "GATEKEEPER_CONFIG=", "GATEKEEPER_CONFIG_FILE=PATH")


def test_an_unknown_variable_is_a_warning_and_the_command_still_runs(tmp_path: Path):
    out = gatekeeper(
        "gpus",
        "--node",
        "1xL4",
        env={"GATEKEEPER_PROT": "9000", "GATEKEEPER_STATE_DIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == (
        "gatekeeper: warning: environment variable GATEKEEPER_PROT is not a gatekeeper "
        "setting; did you mean GATEKEEPER_PORT?\n"
    )
