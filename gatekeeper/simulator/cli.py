"""The simulator's command line: ``vllm serve``'s flags that gatekeeper generates, the
same names and value forms; ``gatekeeper.simulator`` documents it."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

from gatekeeper.simulator.env import SimEnv
from gatekeeper.simulator.http import SIMULATOR_NOTE
from gatekeeper.simulator.process import Simulator

__all__ = ["build_parser", "human_readable_int", "main"]


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
