"""The gatekeeper simulator: a stand-in for ``vllm serve`` in rehearsals and tests.

It is **not vLLM** and loads no model: it accepts ``vllm serve``'s memory and serving
flags, prints vLLM 0.33's start-up log lines with made-up but consistent memory
figures, refuses connections while "loading", then serves vLLM's HTTP surface with
deterministic text (``gatekeeper.simulator_http``), and can hold memory in the
stand-in NVML driver (``gatekeeper.simulator_nvml``). Its first log line and
``/version`` say "gatekeeper simulator, not vLLM".

Command line, as ``vllm serve`` (exit 2 and a message on stderr for an unknown flag)::

    python -m gatekeeper.simulator [serve] MODEL [--host H] [--port P]
        [--served-model-name NAME ...] [--max-model-len N] [--tensor-parallel-size N]
        [--pipeline-parallel-size N] [--data-parallel-size N]
        [--gpu-memory-utilization U] [--kv-cache-memory-bytes N] [--max-num-seqs N]
        [--max-num-batched-tokens N] [--dtype D] [--quantization Q] [--kv-cache-dtype D]
        [--block-size N] [--enforce-eager] [--trust-remote-code] [--download-dir DIR]
        [--load-format F] [--seed N] [--enable-prefix-caching]

Sizes take vLLM's human-readable forms (``32k`` = 32000, ``32K`` = 32768, ``20G``).
Without ``--max-model-len`` the simulator uses 8192 (vLLM derives it from the model's
config); ``--data-parallel-size``, ``--dtype``, ``--quantization`` and the like are
accepted and shown in ``non-default args`` but change nothing else.

Start-up log on stdout, one flushed line each, in vLLM's format
``(APIServer|EngineCore|Worker_TP<k> pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] text``
and order: the simulator banner (WARNING), ``non-default args: {...}``, ``Using max
model len N``, ``Model loading took X GiB memory and S seconds``, ``Available KV cache
memory: X GiB`` (or, with ``--kv-cache-memory-bytes``, ``Initial free memory X GiB,
reserved Y GiB memory for KV Cache ...``), ``GPU KV cache size: N tokens, Maximum
concurrency for L tokens per request: C.CCx``, ``Graph capturing finished in N secs,
took X GiB`` (not with ``--enforce-eager``), ``Free memory on device (F/T GiB) on
startup. ...`` (not with a KV byte budget), ``init engine (profile, create kv cache,
warmup model) took S s``, ``Starting vLLM server on http://HOST:PORT``, then uvicorn's
lines. Worker lines repeat per rank when TP x PP > 1.

Environment (sizes in bytes, or with a unit such as ``20GiB``):

- ``GATEKEEPER_SIM_STARTUP_SECONDS`` (0.5): time from start to serving; the port is
  bound at once but listens only then, so connections are refused until ready.
- ``GATEKEEPER_SIM_TOKEN_SECONDS`` (0.005): delay before each generated token.
- ``GATEKEEPER_SIM_FAIL``: ``free-memory``, ``max-model-len``, ``oom-load`` or
  ``oom-sampler`` print vLLM's error text for that failure at the step where vLLM
  raises it and exit 1; ``crash-after-requests:N`` makes the N-th chat or completion
  request kill the process with SIGKILL after half its tokens (exit status -9, "137"
  in a shell); ``hang`` accepts connections once ready and never answers;
  ``die-after-ready:S`` logs vLLM's engine-death error and exits 1 S seconds after ready.
- ``GATEKEEPER_SIM_GPU_TOTAL_BYTES``: the GPU's total (80 GiB; with an NVML state file,
  that GPU's total minus its reserved memory).
- ``GATEKEEPER_SIM_ACTUAL_BYTES``: bytes held per GPU (default ``gpu_memory_utilization
  x total``, or ``--kv-cache-memory-bytes`` + 2 GiB).
- ``GATEKEEPER_SIM_WEIGHTS_BYTES``, ``_KV_BYTES``, ``_ACTIVATION_BYTES``,
  ``_NON_TORCH_BYTES``, ``_CUDA_GRAPH_BYTES``: the per-GPU figures the log reports;
  unset ones are split from the actual bytes (weights 40%, non-torch 2%, activation
  3%, CUDA graphs 1% or 0 with ``--enforce-eager``, KV cache the rest; with
  ``--kv-cache-memory-bytes`` the KV cache is that and the rest is split 70/10/15/5).
- ``GATEKEEPER_SIM_KV_BYTES_PER_TOKEN``: KV bytes per token per GPU for the token
  count (128 KiB / (TP x PP)); when set, vLLM's fit check runs for real.
- ``GATEKEEPER_SIM_NVML_STATE``: the stand-in NVML driver's state file. When set, the
  simulator checks vLLM's start-up condition (free >= ceil(u x total), else the
  free-memory error; free >= actual bytes, else CUDA out of memory) and holds the
  actual bytes on the first TP x PP GPUs of ``CUDA_VISIBLE_DEVICES`` (NVML indices or
  UUIDs; all GPUs when unset): 90% under its own pid, 10% under its child's. The
  claims go on SIGTERM, SIGINT, normal exit and start-up failure; after a SIGKILL the
  child releases them, as a driver frees a dead process's memory.

The child process (``python -m gatekeeper.simulator_nvml``, vLLM's "engine core")
runs in every mode and exits with the simulator. SIGTERM or SIGINT stops the
simulator within about a second (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatekeeper.simulator_http import SIMULATOR_NOTE
from gatekeeper.simulator_process import Simulator
from gatekeeper.units import parse_size

__all__ = ["SimEnv", "build_parser", "human_readable_int", "main"]

FAIL_MODES = ("free-memory", "max-model-len", "oom-load", "oom-sampler", "hang")
TIMED_MODES = ("crash-after-requests", "die-after-ready")
PREFIX_ENV = "GATEKEEPER_SIM_"


def human_readable_int(text: str) -> int:
    """vLLM's sizes: ``32k`` = 32000, ``32K`` = 32768, decimals only with lowercase."""
    multipliers = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    if text and text[-1].lower() in multipliers:
        number, suffix = text[:-1], text[-1]
        if suffix.islower():
            return int(float(number) * multipliers[suffix])
        return int(number) * int(1024 ** (list(multipliers).index(suffix.lower()) + 1))
    return int(text)


def max_model_len_arg(text: str) -> int:
    return -1 if text in ("-1", "auto") else human_readable_int(text)


def build_parser() -> argparse.ArgumentParser:
    """The subset of ``vllm serve``'s parser that gatekeeper generates, same names."""
    p = argparse.ArgumentParser(prog="vllm serve", description=f"{SIMULATOR_NOTE}.")
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default="Qwen/Qwen3-0.6B")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--max-model-len", type=max_model_len_arg, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument(
        "--gpu-memory-utilization", "--device-memory-utilization", type=float, default=0.92
    )
    p.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None)
    p.add_argument("--max-num-seqs", type=human_readable_int, default=None)
    p.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--download-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    for flag in ("--enforce-eager", "--trust-remote-code"):
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    return p


def _size_env(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(PREFIX_ENV + name)
    if not text:
        return None
    return 0 if text.strip() == "0" else parse_size(text, field=PREFIX_ENV + name)


def _float_env(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(PREFIX_ENV + name)
    try:
        return default if not text else float(text)
    except ValueError as e:
        raise ValueError(f"{PREFIX_ENV}{name}={text!r} is not a number of seconds") from e


@dataclass(frozen=True, slots=True)
class SimEnv:
    """The simulator's behaviour, from ``GATEKEEPER_SIM_*`` variables (module docstring)."""

    startup_seconds: float = 0.5
    token_seconds: float = 0.005
    fail: str | None = None
    crash_after_requests: int | None = None
    die_after_ready_seconds: float | None = None
    gpu_total_bytes: int | None = None
    actual_bytes: int | None = None
    components: tuple[tuple[str, int], ...] = ()
    kv_bytes_per_token: int | None = None
    nvml_state: Path | None = None
    visible_devices: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SimEnv:
        """Read the environment; ``ValueError`` names the bad variable."""
        fail = environ.get(PREFIX_ENV + "FAIL") or None
        mode, _, value = (fail or "").partition(":")
        if fail is not None and fail not in FAIL_MODES and mode not in TIMED_MODES:
            raise ValueError(
                f"{PREFIX_ENV}FAIL={fail!r} is not one of {', '.join(FAIL_MODES)}, "
                "crash-after-requests:N, die-after-ready:S"
            )
        try:
            crash = int(value) if mode == "crash-after-requests" else None
            die = float(value) if mode == "die-after-ready" else None
        except ValueError as e:
            raise ValueError(f"{PREFIX_ENV}FAIL={fail!r}: {e}") from e
        names = ("WEIGHTS", "KV", "ACTIVATION", "NON_TORCH", "CUDA_GRAPH")
        components = ((n.lower(), _size_env(environ, f"{n}_BYTES")) for n in names)
        state = environ.get(PREFIX_ENV + "NVML_STATE")
        return cls(
            startup_seconds=_float_env(environ, "STARTUP_SECONDS", 0.5),
            token_seconds=_float_env(environ, "TOKEN_SECONDS", 0.005),
            fail=None if crash is not None or die is not None else fail,
            crash_after_requests=crash,
            die_after_ready_seconds=die,
            gpu_total_bytes=_size_env(environ, "GPU_TOTAL_BYTES"),
            actual_bytes=_size_env(environ, "ACTUAL_BYTES"),
            components=tuple((n, b) for n, b in components if b is not None),
            kv_bytes_per_token=_size_env(environ, "KV_BYTES_PER_TOKEN"),
            nvml_state=Path(state) if state else None,
            visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
        )


def _non_default(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if v != parser.get_default(k)}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gatekeeper.simulator [serve] MODEL [flags]``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        env = SimEnv.from_environ(os.environ)
    except ValueError as e:
        parser.error(str(e))
    return asyncio.run(Simulator(args, _non_default(parser, args), env).run())


if __name__ == "__main__":
    sys.exit(main())
