"""The "did you mean" of an unknown ``vllm serve`` flag (#39, CLI habits) names vLLM's
short aliases and the long form each stands for: ``--tp 2`` -> ``-tp
(--tensor-parallel-size)``, not ``--dtype or --port or --host``. The installed command,
in a subprocess."""

from __future__ import annotations

import pytest

from gatekeeper.vllm.flags import flag_table
from tests.cli.test_settings_errors import assert_clean_error, gatekeeper

MODEL = "Qwen/Qwen3-0.6B"


@pytest.mark.parametrize(
    ("typed", "hint"),
    [
        ("--tp", "did you mean -tp (--tensor-parallel-size)?"),
        ("--tp=2", "did you mean -tp (--tensor-parallel-size)?"),
        ("--pp", "did you mean -pp (--pipeline-parallel-size)?"),
        ("-pd", "did you mean -dp (--data-parallel-size) or "),
        ("--max-modle-len", "did you mean --max-model-len or "),  # long ones as before
    ],
)
def test_an_unknown_flag_is_answered_with_the_alias_it_resembles(typed: str, hint: str):
    out = gatekeeper("estimate", MODEL, typed, "2")
    named = typed.partition("=")[0]
    assert_clean_error(out, f"{named!r} is not a flag of vllm serve", hint)
    assert "--dtype" not in out.stderr


@pytest.mark.parametrize("release", ["0.32.0", "0.34.0"])
def test_every_alias_typed_with_two_dashes_names_itself_and_its_long_form(release: str):
    table = flag_table(release)
    for option, flag in table.by_option.items():
        typed = "-" + option
        if option.startswith("--") or table.matches(typed):
            continue  # a long spelling, or `--q`: a prefix of --quantization...
        assert table.nearest(typed) == [f"{option} ({flag.name})"], option
