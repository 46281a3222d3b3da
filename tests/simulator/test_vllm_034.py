"""The simulator playing a vLLM 0.34 worker (``GATEKEEPER_SIM_VLLM_VERSION=0.34.0``): the
extensible KV cache sized after warm-up from the GPU's free memory, its lines read back
by gatekeeper's log reader, 64-token blocks, no start-up free-memory refusal with the
cache on (kept with it off), and ``max_model_len`` checked against the measured cache.

The expected figures are written out from vLLM 0.34.0's source
(``v1/worker/extensible_kv_cache.py:592-618``); the simulator's own arithmetic
(``gatekeeper.simulator.extensible``) is checked against them and against its log."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from gatekeeper.gpus.stand_in import h100, write_state
from gatekeeper.simulator.cli import parse_args
from gatekeeper.simulator.env import SimEnv, played_release
from gatekeeper.simulator.extensible import plan_extensible
from gatekeeper.units import GIB, MIB
from gatekeeper.vllm.log import StartupLog
from tests.simulator.test_simulator import Sim, _command, _env, _gpu_used, _lines

V034 = {"GATEKEEPER_SIM_VLLM_VERSION": "0.34.0"}
PARTS = {  # no GATEKEEPER_SIM_KV_BYTES: the worker measures its KV cache
    "GATEKEEPER_SIM_WEIGHTS_BYTES": "16GiB",
    "GATEKEEPER_SIM_ACTIVATION_BYTES": "2GiB",
    "GATEKEEPER_SIM_NON_TORCH_BYTES": "1GiB",
    "GATEKEEPER_SIM_CUDA_GRAPH_BYTES": "512MiB",
}
BLOCK = 64 * 128 * 1024  # 64-token blocks (config/cache.py:185) of 128 KiB a token: 8 MiB


def read_log(text: str) -> StartupLog:
    log = StartupLog()
    for line in text.splitlines():
        log = log.feed(line)
    return log


def messages(log: str) -> list[str]:
    return [m["message"] for m in _lines(log)]


def position(log: str, start: str) -> int:
    return next(i for i, m in enumerate(messages(log)) if m.startswith(start))


@pytest.mark.parametrize(
    ("given", "played"),
    [
        (None, "0.33.0"),
        ("", "0.33.0"),
        ("0.32.0", "0.33.0"),
        ("0.33.1", "0.33.0"),
        ("0.34.0", "0.34.0"),
        ("v0.34.1", "0.34.0"),
        ("0.35.0", "0.34.0"),
    ],
)
def test_the_release_played(given: str | None, played: str) -> None:
    assert played_release(given) == played


def test_a_release_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="GATEKEEPER_SIM_VLLM_VERSION='latest'"):
        SimEnv.from_environ({"GATEKEEPER_SIM_VLLM_VERSION": "latest"})
    result = subprocess.run(
        _command("m"), env=_env(GATEKEEPER_SIM_VLLM_VERSION="latest"), capture_output=True
    )
    assert result.returncode == 2


def test_a_0_34_worker_sizes_its_kv_cache_after_warmup_and_the_log_says_so(tmp_path: Path):
    env = V034 | PARTS | {"GATEKEEPER_SIM_GPU_TOTAL_BYTES": "80GiB"}
    with Sim(tmp_path, "m", "--max-model-len", "4096", **env) as s:
        s.wait_ready()
        log = s.log()
        version = httpx.get(f"{s.url}/version").json()["version"]
        metrics = httpx.get(f"{s.url}/metrics").text
        assert s.stop() == 0
    # vLLM 0.34 on a GPU of 80 GiB, all free, --gpu-memory-utilization unset (a 1.0 cap):
    # used = 16 + 1 + 0.5 GiB, margin = max(1 GiB, 0.75 x 2 GiB) = 1.5 GiB,
    # KV = min(80 - 17.5, 80 - 17.5 - 1.5) - 2 = 59 GiB = 7,552 blocks of 8 MiB;
    # reserved before warm-up: 80 - 16 - 1 - 2 = 61 GiB; 4,096 tokens are 64 blocks; free
    # after warm-up 80 - 17.5 GiB less the null block, torch capped at its 16.5 GiB plus
    # what stays free less 0.5 GiB (extensible_kv_cache.py:683-692).
    assert version.startswith("0.34.0+gatekeeper.simulator")
    text = messages(log)
    assert "Available KV cache memory: 61.0 GiB" in text
    assert (
        "Memory after warmup: 62.49 GiB free, 0.01 GiB committed to the KV cache, 2.0 GiB kept "
        "for transient activations (2.0 GiB allocated at peak, 0.0 GiB of torch reservation "
        "growth); 7552 KV cache blocks (59.0 GiB) fit within the requested 80.0 GiB. Torch "
        "may reserve up to 19.5 GiB."
    ) in text
    assert (
        "GPU KV cache size: 483,328 tokens, Maximum concurrency for 4,096 tokens per request: 118.00x"
        in text
    )
    assert "Extended KV cache to 7552 blocks (59.00 GiB)." in text
    order = [
        "Model loading took",
        "Available KV cache memory",
        "Graph capturing finished",
        "Free memory on device",
        "Memory after warmup",
        "GPU KV cache size",
        "Extended KV cache to",
        "init engine",
        "Starting vLLM server",
    ]
    assert [position(log, o) for o in order] == sorted(position(log, o) for o in order)
    assert "Estimated CUDA graph memory" not in log and "CUDA graph pool memory" not in log
    assert "Desired GPU memory utilization is (1.0, 80.0 GiB)" in log
    assert 'block_size="64"' in metrics and 'num_gpu_blocks="7552"' in metrics

    # gatekeeper's log reader gets the simulator's own arithmetic back
    args, _ = parse_args(["m", "--max-model-len", "4096"], "0.34.0")
    plan, sizing = plan_extensible(SimEnv.from_environ(env), args, BLOCK)
    assert sizing.num_blocks == 7552 and plan.kv_bytes == 59 * GIB
    assert plan.capacity_bytes == 61 * GIB and sizing.margin_bytes == 1536 * MIB
    m = read_log(log).memory
    assert m.extensible_kv_cache is True
    assert m.kv_cache == plan.kv_bytes and m.kv_cache_blocks == sizing.num_blocks
    assert m.kv_cache_capacity == plan.capacity_bytes
    assert m.kv_cache_tokens == 7552 * 64
    assert m.free_after_warmup == round(62.49 * GIB) and m.requested_memory == 80 * GIB
    assert m.components() == {
        "weights": 16 * GIB,
        "kv_cache": 59 * GIB,
        "activation_peak": 2 * GIB,
        "non_torch": 1 * GIB,
        "cuda_graph": 512 * MIB,
    }


def test_with_a_byte_budget_the_cache_is_off_and_the_blocks_are_64_tokens(tmp_path: Path):
    args = ["m", "--kv-cache-memory-bytes", "4G", "--enforce-eager"]
    with Sim(tmp_path, *args, **V034) as s:
        s.wait_ready()
        log = s.log()
        assert s.stop() == 0
    assert "reserved 4.0 GiB memory for KV Cache" in log
    for line in ("Available KV cache memory", "Memory after warmup", "Extended KV cache"):
        assert line not in log
    # 4 GiB / 8 MiB = 512 blocks; 8,192 tokens take 128 of them
    assert (
        "GPU KV cache size: 32,768 tokens, Maximum concurrency for 8,192 tokens per request: 4.00x"
        in messages(log)
    )
    m = read_log(log).memory
    assert m.kv_cache == 4 * GIB and m.extensible_kv_cache is None


def test_the_cache_off_by_its_flag_keeps_0_33_s_profile_with_0_34_s_lines(tmp_path: Path):
    with Sim(tmp_path, "m", "--no-enable-extensible-kv-cache", **V034 | PARTS) as s:
        s.wait_ready()
        log = s.log()
        assert s.stop() == 0
    assert "Memory after warmup" not in log and "Estimated CUDA graph memory" not in log
    assert "CUDA graph memory profiling is enabled (default since v0.21.0)." in log
    assert "Desired GPU memory utilization is (0.92, 73.6 GiB)" in log  # the default fraction
    m = read_log(log).memory
    # the profile's KV cache: 0.92 x 80 GiB less what the others take
    assert m.kv_cache == round(round((0.92 * 80 * GIB - (16 + 1 + 2 + 0.5) * GIB) / GIB, 2) * GIB)
    assert m.cuda_graph_estimate == 512 * MIB
    assert m.components()["activation_peak"] == 2 * GIB


def test_the_0_34_flags_are_0_34_s_table() -> None:
    result = subprocess.run(
        _command("m", "--no-enable-extensible-kv-cache"), env=_env(), capture_output=True, text=True
    )
    assert result.returncode == 2, "vLLM 0.33 has no such flag"
    both = _command("m", "--enable-extensible-kv-cache", "--kv-cache-memory-bytes", "4G")
    result = subprocess.run(both, env=_env(**V034), capture_output=True, text=True)
    assert result.returncode == 1
    assert (
        "ValueError: enable_extensible_kv_cache: it sizes the KV cache from measured memory, "
        "which kv_cache_memory_bytes overrides." in result.stderr
    )


def _busy_gpu(tmp_path: Path) -> Path:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0, used_bytes=60 * GIB)])  # 19.19 of 79.19 GiB free
    return state


SMALL = {  # a model that loads in what a busy GPU has free
    "GATEKEEPER_SIM_WEIGHTS_BYTES": "8GiB",
    "GATEKEEPER_SIM_ACTIVATION_BYTES": "1GiB",
    "GATEKEEPER_SIM_NON_TORCH_BYTES": "512MiB",
    "GATEKEEPER_SIM_CUDA_GRAPH_BYTES": "512MiB",
}


def test_on_a_busy_gpu_the_cache_off_refuses_and_the_cache_on_takes_what_is_free(
    tmp_path: Path,
) -> None:
    state = _busy_gpu(tmp_path)
    original = state.read_text()
    off = subprocess.run(
        _command("m", "--no-enable-extensible-kv-cache", "--gpu-memory-utilization", "0.5"),
        env=_env(GATEKEEPER_SIM_NVML_STATE=str(state), **V034 | SMALL),
        capture_output=True,
        text=True,
    )
    assert off.returncode == 1
    assert "Free memory on device cuda:0 (19.19/79.19 GiB) on startup is less than desired" in (
        off.stdout
    )
    assert state.read_text() == original

    env = {"GATEKEEPER_SIM_NVML_STATE": str(state), **V034, **SMALL}
    with Sim(tmp_path, "m", "--gpu-memory-utilization", "0.5", **env) as s:
        s.wait_ready()
        log = s.log()
        held = _gpu_used(state)[0] - 60 * GIB
        assert s.stop() == 0
    assert "is less than desired GPU memory utilization" not in log
    free = 79.19 * GIB - 60 * GIB
    # used = 8 + 0.5 + 0.5 GiB, margin 1 GiB (the floor): the free memory binds, not the cap
    kv_budget = min(math.ceil(0.5 * 79.19 * GIB) - 9 * GIB, free - 9 * GIB - GIB) - GIB
    blocks = int(kv_budget) // BLOCK
    m = read_log(log).memory
    assert m.kv_cache_blocks == blocks and m.kv_cache == round(round(blocks * BLOCK / GIB, 2) * GIB)
    assert held == 9 * GIB + GIB + blocks * BLOCK  # what the stand-in driver shows it holding
    assert held <= free - GIB  # the margin stays free
    assert _gpu_used(state)[0] == 60 * GIB  # released on exit


def test_max_model_len_is_checked_against_the_measured_cache_after_warmup(tmp_path: Path) -> None:
    state = _busy_gpu(tmp_path)
    env = {
        "GATEKEEPER_SIM_NVML_STATE": str(state),
        "GATEKEEPER_SIM_KV_BYTES_PER_TOKEN": "1MiB",  # 64 MiB blocks: 16,384 tokens need 16 GiB
        **V034,
        **SMALL,
    }
    result = subprocess.run(
        _command("m", "--max-model-len", "16384"), env=_env(**env), capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout
    log = result.stdout
    # the reservation (79.19 - 9.5 GiB) passes the check before warm-up; the measured
    # cache (about 8.19 GiB) does not
    assert position(log, "Available KV cache memory") < position(log, "Memory after warmup")
    assert "GPU KV cache size" not in log and "Extended KV cache" not in log
    assert re.search(
        r"ValueError: To serve at least one request with the model's max seq len \(16384\), "
        r"\(16\.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        r"\([\d.]+ GiB\)\. Based on the available memory, the estimated maximum model length "
        r"is \d+\. The extensible KV cache already takes all device memory left after the "
        r"model, its activations, CUDA graphs and warmup; decrease `max_model_len` or "
        r"`max_num_seqs`, or the model needs a device with more memory\.",
        log,
    ), log
    failure = read_log(log).failure
    assert failure is not None and failure.startswith("max_model_len check: ")
    assert _gpu_used(state)[0] == 60 * GIB


@pytest.mark.parametrize(
    ("mode", "expected", "kind"),
    [
        (
            "free-memory",
            "ValueError: No available memory for the cache blocks. The extensible",
            "no KV cache memory",
        ),
        (
            "max-model-len",
            "ValueError: To serve at least one request with the model's max seq len",
            "max_model_len check",
        ),
    ],
)
def test_forced_failures_of_a_0_34_worker_come_after_warmup(
    mode: str, expected: str, kind: str
) -> None:
    # with the cache on, 0.34 has no start-up refusal: a GPU short of memory shows as no
    # KV cache after warm-up
    result = subprocess.run(
        _command("m"), env=_env(GATEKEEPER_SIM_FAIL=mode, **V034), capture_output=True, text=True
    )
    assert result.returncode == 1
    assert expected in result.stdout
    failure = read_log(result.stdout).failure
    assert failure is not None and failure.startswith(kind + ": ")
    assert position(result.stdout, "Memory after warmup") >= 0
