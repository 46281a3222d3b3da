"""gatekeeper.vllm.shell: a vllm serve line in a container's script, split as the shell
splits it (the manifests it comes from: tests/fixtures/workloads/)."""

from __future__ import annotations

import pytest

from gatekeeper.vllm.shell import expand_shell_vars, script_arguments, shell_script


def test_the_script_and_its_positional_arguments():
    assert shell_script(["/bin/bash", "-c", "exec vllm serve $@", "--", "M", "-tp", "2"]) == (
        "exec vllm serve $@",
        ["M", "-tp", "2"],
    )
    assert shell_script(["bash", "-ec", "x"]) == ("x", [])
    assert shell_script(["python3", "-c", "x"]) is None


@pytest.mark.parametrize(
    "shell",
    [
        ["bash", "-o", "pipefail", "-c"],
        ["/bin/bash", "-eo", "pipefail", "-c"],
        ["bash", "-O", "extglob", "+o", "posix", "--noprofile", "-c"],
        ["bash", "--rcfile", "/etc/vllm.rc", "-lc"],
        ["sh", "+e", "-xc"],
    ],
)
def test_the_shell_s_options_before_c_are_skipped_with_their_arguments(shell):
    assert shell_script([*shell, "exec vllm serve $@", "sh", "M"]) == ("exec vllm serve $@", ["M"])


def test_no_script_after_the_end_of_the_options_or_an_option_s_missing_word():
    assert shell_script(["bash", "--", "-c", "x"]) is None  # -c there is a file's name
    assert shell_script(["bash", "-o", "pipefail"]) is None
    assert shell_script(["bash", "-c"]) is None


def test_positional_arguments_and_unquoted_expansions_are_words():
    env = {"ARGS": "--max-model-len 8192  --enforce-eager", "EMPTY": ""}
    words = script_arguments("exec vllm serve $@ $ARGS $EMPTY --port 1", ["Qwen/Qwen3-8B"], env)
    assert words == ["Qwen/Qwen3-8B", "--max-model-len", "8192", "--enforce-eager", "--port", "1"]


def test_substitutions_stay_whole_and_unresolved_names_stay_as_written():
    script = 'N=$(nproc)\nexec vllm serve M -dp $((A * B)) --x "$(cat /f | head -1)" ${UNSET}'
    assert script_arguments(script, [], {}) == [
        "M", "-dp", "$((A * B))", "--x", "$(cat /f | head -1)", "${UNSET}",
    ]  # fmt: skip


def test_eval_is_split_again():
    script = 'V=$(vllm --version)\neval "exec vllm serve /mnt/models --name "a" \\\n  -tp 2 $@"'
    assert script_arguments(script, [], {}) == ["/mnt/models", "--name", "a", "-tp", "2"]


@pytest.mark.parametrize(
    "script", ["echo 'vllm serve M", 'echo "vllm serve M"', 'eval "eval \\"eval x\\""']
)
def test_no_vllm_line_or_one_the_shell_would_not_split(script):
    assert script_arguments(script, [], {}) is None


@pytest.mark.parametrize(
    ("word", "expanded"),
    [
        ("${E:-16k}", "16k"),
        ("${E-16k}", ""),
        ("${U-16k}", "16k"),
        ("${S:-16k}", "8k"),
        ("$U", "$U"),
    ],
)
def test_defaults_as_the_shell_gives_them(word, expanded):
    assert expand_shell_vars(word, {"E": "", "S": "8k"}) == expanded
