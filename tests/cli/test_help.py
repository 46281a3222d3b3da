"""Help and shells (#31 item 9), through the installed command: ``estimate --help`` lists
the vllm serve flags gatekeeper models and the groups; ``--help=all``, ``--help=GROUP``
and ``--help=WORD`` as ``vllm serve``'s; ``serve --help`` describes the sidecar;
``gatekeeper completion bash|zsh`` completes commands, options, choices and vLLM flags
in a real bash."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.cli.entry import build_parser
from gatekeeper.models.source import MODEL_SOURCE_FLAGS
from gatekeeper.vllm.flags import MODELLED, flag_table

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"


def gatekeeper(*args: str) -> str:
    result = subprocess.run(
        [str(GATEKEEPER), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def modelled_options(release: str | None = None) -> list[str]:
    table = flag_table(release)
    # a modelled flag the release lacks (--enable-extensible-kv-cache before 0.34) is not listed
    modelled = [d for d in MODELLED if d not in MODEL_SOURCE_FLAGS and d in table.flags]
    return [table.flags[d].name for d in modelled]


@pytest.mark.parametrize("command", ["estimate", "check", "deploy"])
def test_help_lists_the_modelled_flags_and_the_groups(command: str):
    text = gatekeeper(command, "--help")
    listed = text.split("Modelled:", 1)[1].replace("\n", " ")
    assert [o.strip(" .") for o in listed.split(",")] == modelled_options()
    for group in ("modelled", "model-source", "checked", "gatekeeper"):
        assert f"  {group} " in text
    assert "--help=all" in text and "any vllm serve flag is accepted" not in text


def test_help_all_shows_every_flag_of_the_release():
    text = gatekeeper("estimate", "--help=all")
    table = flag_table()
    missing = [f.name for f in table.flags.values() if f.name not in text]
    assert not missing
    assert "--gpu-memory" in text and "--method" in text  # gatekeeper's own


def test_help_group_shows_that_group_only():
    text = gatekeeper("estimate", "--help=modelled")
    assert text.startswith("modelled:")
    assert all(o in text for o in modelled_options())
    assert "--seed" not in text and "--revision" not in text
    source = gatekeeper("estimate", "--help=model-source")
    assert all(f"--{d.replace('_', '-')}" in source for d in MODEL_SOURCE_FLAGS)


def test_help_word_finds_flags_by_name_and_marks_the_modelled():
    text = gatekeeper("estimate", "--help=kv_cache")
    assert text.startswith("Flags matching 'kv-cache'")
    line = text.split("--kv-cache-dtype ", 1)[1].split("\n--", 1)[0]
    assert "[modelled]" in line
    assert "--kv-cache-metrics" in text  # matched, not modelled
    assert "No group or flag matching 'nosuch'" in gatekeeper("estimate", "--help=nosuch")


def test_the_release_asked_for_is_the_table_shown():
    assert "vLLM 0.8.5's" in gatekeeper("estimate", "--help", "--vllm-version", "0.8.5")


def test_serve_help_has_a_description():
    text = gatekeeper("serve", "--help")
    assert "Run the sidecar on one node" in text and "--log-format" in text


def complete(script: str, *words: str) -> list[str]:
    probe = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); "
        "COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _gatekeeper; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_bash_completion_completes_commands_options_choices_and_vllm_flags():
    script = gatekeeper("completion", "bash")
    assert complete(script, "gatekeeper", "un") == ["undeploy"]
    assert complete(script, "gatekeeper", "ps", "--a") == ["--all"]
    assert complete(script, "gatekeeper", "estimate", "M", "--method", "") == ["vllm", "simple"]
    assert "--max-model-len" in complete(script, "gatekeeper", "estimate", "M", "--max-model")
    assert complete(script, "gatekeeper", "--config", "f.toml", "serve", "--reh") == ["--rehearsal"]
    assert complete(script, "gatekeeper", "gpus", "--max-model") == []  # not a serving command


def test_zsh_completion_is_the_bash_one_under_bashcompinit():
    script = gatekeeper("completion", "zsh")
    assert script.startswith("#compdef gatekeeper\n")
    assert "bashcompinit" in script and gatekeeper("completion", "bash") in script
    if shutil.which("zsh") is None:
        return  # the bash half ran in bash above; zsh itself is not on this machine
    zsh = subprocess.run(["zsh", "-c", script], capture_output=True, text=True, timeout=30)
    assert zsh.returncode == 0, zsh.stderr


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_option_of_every_command_has_help(command: str):
    """#39: no option (or positional) is listed bare in ``gatekeeper COMMAND --help``."""
    parser = _commands()[command]
    bare = [
        a.option_strings[0] if a.option_strings else a.dest
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert not bare, f"gatekeeper {command}: no help for {bare}"
    text = gatekeeper(*([command] if command else []), "--help")
    for action in parser._actions:
        if action.help and action.help != argparse.SUPPRESS and "%" not in action.help:
            first = action.help.split()[0]
            assert first in text, (command, action.dest)
