"""Command-line flags shared by ``estimate``, ``check`` and ``deploy``: vLLM's serving
flags, parsed into ``ServeOptions``."""

from __future__ import annotations

import argparse
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimate.options import ServeOptions
from gatekeeper.units import parse_size

__all__ = ["add_serving_flags", "options_from_args", "positive_int"]


def positive_int(flag: str) -> Any:
    """An argparse type: a positive integer (underscores and commas allowed)."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} must be a positive integer")
        return value

    return parse


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """The ``vllm serve`` flags that change memory, under vLLM's names."""
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-model-len", type=positive_int("--max-model-len"))
    p.add_argument("--max-num-seqs", type=positive_int("--max-num-seqs"))
    p.add_argument("--max-num-batched-tokens", type=positive_int("--max-num-batched-tokens"))
    p.add_argument("--tensor-parallel-size", "-tp", type=positive_int("--tensor-parallel-size"))
    p.add_argument("--pipeline-parallel-size", "-pp", type=positive_int("--pipeline-parallel-size"))
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--kv-cache-memory-bytes", default=None, help="a size: 20GiB or bytes")
    p.add_argument("--block-size", type=positive_int("--block-size"))
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--vllm-version", default=None, help="accounting to follow (default: settings)")
    p.add_argument(
        "--embedded",
        action="store_true",
        help="vLLM's LLM class inside a process that already used CUDA (a notebook)",
    )


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    kv_bytes = None
    if args.kv_cache_memory_bytes:
        try:
            kv_bytes = parse_size(args.kv_cache_memory_bytes, field="--kv-cache-memory-bytes")
        except ValueError as e:
            raise ServeOptionsError(str(e), field="kv_cache_memory_bytes") from e
    return ServeOptions(
        dtype=args.dtype,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        tensor_parallel_size=args.tensor_parallel_size or 1,
        pipeline_parallel_size=args.pipeline_parallel_size or 1,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_bytes,
        enforce_eager=args.enforce_eager,
        block_size=args.block_size,
        vllm_version=args.vllm_version,
        embedded=args.embedded,
    )
