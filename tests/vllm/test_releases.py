"""Which vLLM release a door reads flags with, and how a release's argparse reads a
spelling: the image tag a container names, abbreviations per release, and the errors
for a flag a release lacks (tests/vllm/test_flags.py holds the same reading to vLLM's
own parser)."""

from __future__ import annotations

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.vllm.command import image_release, parse_vllm_command
from gatekeeper.vllm.flags import flag_table, options_from_mapping
from gatekeeper.vllm.serve_args import parse_serve_args


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("vllm/vllm-openai:v0.8.5", "0.8.5"),
        ("docker.io/vllm/vllm-openai:v0.11.0", "0.11.0"),
        ("registry.local:5000/mirror/vllm-openai:0.10.1rc1", "0.10.1"),
        ("vllm/vllm-openai:v0.9.0.1", "0.9.0.1"),
        ("vllm/vllm-openai:v0.8.5-cu126@sha256:" + "0" * 64, "0.8.5"),
        ("rocm/vllm:rocm6.3.1_vllm_0.8.5_20250513", "0.8.5"),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai:nightly", None),
        ("vllm/vllm-openai@sha256:" + "0" * 64, None),
        ("vllm/vllm-openai", None),
        ("registry.local:5000/vllm-openai", None),
        ("myorg/llm-server:1.2.3", None),  # a version, but not vLLM's
        ("", None),
    ],
)
def test_the_release_an_image_names(image, release):
    assert image_release(image) == release


def test_a_container_is_read_with_its_images_release():
    argv = ["--model", "m", "--kv-cache-memory-bytes", "4G"]
    old = parse_vllm_command([], argv, "vllm/vllm-openai:v0.8.5", {})
    assert old is not None and old.vllm_version == "0.8.5" and old.version_note == ""
    assert old.options.vllm_version == "0.8.5" and old.options.kv_cache_memory_bytes is None
    assert old.unknown[0].startswith("'--kv-cache-memory-bytes' is not a flag of vllm serve 0.8.5")
    new = parse_vllm_command([], argv, "vllm/vllm-openai:v0.11.0", {})
    assert new is not None and new.options.kv_cache_memory_bytes == 4 << 30 and not new.unknown
    untagged = parse_vllm_command([], argv, "vllm/vllm-openai:latest", {}, default_release="0.9.2")
    assert untagged is not None and untagged.vllm_version == "0.9.2"
    assert "names no vLLM release: read as vLLM 0.9.2 (the configured default)" in (
        untagged.version_note
    )


def test_an_abbreviation_is_read_by_its_releases_flags():
    """--kv-cache is --kv-cache-dtype in 0.8.5; 0.32 has four flags it could be."""
    assert parse_serve_args(["m", "--kv-cache", "fp8"], flag_table("0.8.5")).values == {
        "kv_cache_dtype": "fp8"
    }
    with pytest.raises(ServeOptionsError) as raised:
        parse_serve_args(["m", "--kv-cache", "fp8"], flag_table("0.32.0"))
    assert str(raised.value) == (
        "vllm serve: ambiguous option: --kv-cache could match --kv-cache-dtype, "
        "--kv-cache-dtype-skip-layers, --kv-cache-memory-bytes, --kv-cache-metrics, "
        "--kv-cache-metrics-sample; "
        "give the whole flag"
    )
    assert raised.value.field == "--kv-cache"
    # an exact spelling wins over the longer flags it is a prefix of
    assert parse_serve_args(["m", "--max-loras", "2"]).values == {"max_loras": 2}
    # after `--` nothing is a flag, as in argparse
    with pytest.raises(ServeOptionsError, match="unexpected argument '--max'"):
        parse_serve_args(["m", "--", "--max"])


def test_mapping_keys_abbreviate_as_a_config_files_keys_do():
    options, given = options_from_mapping(
        {"max-num-seq": 8, "--gpu-memory-util": 0.8, "no_enable_prefix_caching": True},
        where="options",
    )
    assert (options.max_num_seqs, options.gpu_memory_utilization) == (8, 0.8)
    assert options.enable_prefix_caching is False
    assert given == {"max_num_seqs", "gpu_memory_utilization", "enable_prefix_caching"}
    with pytest.raises(ServeOptionsError, match="ambiguous option: --max-lora could match"):
        options_from_mapping({"max_lora": 2}, where="options")


@pytest.mark.parametrize(
    ("release", "flag", "said"),
    [
        ("0.8.5", "--kv-cache-memory-bytes",
         "(it came in vLLM 0.10.2; name that release or a later one as the vLLM version, or "
         "leave the flag out)"),
        ("0.11.0", "--max-cudagraph-capture-size", "(it came in vLLM 0.11.2;"),
        ("0.32.0", "--swap-space", "(vLLM had it up to 0.17.0 at least; leave it out)"),
        ("0.32.0", "--frobnicate", "0.32.0"),
    ],
)  # fmt: skip
def test_a_flag_the_release_lacks_names_the_release_and_where_it_is(release, flag, said):
    with pytest.raises(ServeOptionsError) as raised:
        parse_serve_args(["m", flag, "1"], flag_table(release))
    message = str(raised.value)
    assert f"'{flag}' is not a flag of vllm serve {release}" in message
    assert message.endswith(said) or said in message, message
    with pytest.raises(ServeOptionsError, match=r"'banana' is not a version"):
        flag_table("banana")
