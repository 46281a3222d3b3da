"""``--config FILE`` after the command (#39, CLI habits): ``gatekeeper serve --config
f.toml`` as ``vllm serve --config`` is typed means what ``gatekeeper --config f.toml
serve`` means, for every command; two different files, one in each place, are an error
naming both. After ``estimate``, ``check`` and ``deploy`` a ``.toml`` file is gatekeeper's
settings and a YAML one stays vLLM's ``--config``. The installed command, in a
subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gatekeeper.cli.entry import build_parser
from tests.cli.test_settings_errors import assert_clean_error, gatekeeper


def test_every_command_takes_config_after_it():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        options = {o for a in command._actions for o in a.option_strings}
        assert "--config" in options, name


def test_a_settings_file_after_the_command_is_read(tmp_path: Path):
    settings = tmp_path / "gatekeeper.toml"
    settings.write_text('gpus = "2xL4"\n')
    for argv in (["gpus", "--config", str(settings)], ["gpus", f"--config={settings}"]):
        out = gatekeeper(*argv)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("source: declared, 2 GPUs"), out.stdout
    assert gatekeeper("--config", str(settings), "gpus").stdout == out.stdout


@pytest.mark.parametrize(
    "command", [["serve", "--rehearsal"], ["ps"], ["undeploy", "x"], ["gpus"], ["models"]]
)
def test_after_the_command_the_file_is_checked_as_before_it(tmp_path: Path, command: list[str]):
    settings = tmp_path / "gatekeeper.toml"
    settings.write_text("prot = 18123\n")
    out = gatekeeper(*command, "--config", str(settings))
    assert_clean_error(out, "unknown setting 'prot'", str(settings), "did you mean 'port'?")


def test_two_different_files_are_an_error_naming_both(tmp_path: Path):
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text('gpus = "1xL4"\n')
    two.write_text('gpus = "2xL4"\n')
    out = gatekeeper("--config", str(one), "serve", "--config", str(two))
    assert_clean_error(out, "two settings files", str(one), str(two))
    same = gatekeeper("--config", str(one), "gpus", "--config", str(tmp_path / "." / "one.toml"))
    assert same.returncode == 0 and "1 GPU" in same.stdout, same.stderr


def run_json(*args: str) -> dict[str, object]:
    out: subprocess.CompletedProcess[str] = gatekeeper(*args, "--json")
    assert out.returncode == 0, out.stderr
    payload: dict[str, object] = json.loads(out.stdout)
    return payload


def test_after_a_serving_command_toml_is_gatekeepers_and_yaml_is_vllms(tmp_path: Path):
    settings = tmp_path / "gatekeeper.toml"
    settings.write_text('default_vllm_version = "0.32.0"\n')
    flags = tmp_path / "serve.yaml"
    flags.write_text("max-model-len: 2048\n")
    model = "Qwen/Qwen3-0.6B"
    both = run_json("estimate", model, "--config", str(flags), "--config", str(settings))
    assert (both["vllm_version"], both["max_model_len"]) == ("0.32.0", 2048)
    assert run_json("estimate", model, "--config", str(flags))["vllm_version"] != "0.32.0"
    before = run_json("--config", str(settings), "estimate", model, "--config", str(flags))
    assert before == both
