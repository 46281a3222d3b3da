"""Placement on vLLM 0.34, whose extensible KV cache is on by default (#37): what a worker
launched with placement's flags takes is what was promised for it.

- Sharing a GPU: a byte budget (``--kv-cache-memory-bytes``), which turns the extensible
  cache off (``config/vllm.py:3203-3207`` of 0.34.0): its KV cache is the bytes given, not
  what the neighbours leave free while it warms up (the extensible cache counts every
  allocation on the device since its snapshot as its own use, ``extensible_kv_cache.py:613``).
- Alone on its GPUs: ``--gpu-memory-utilization u`` as a cap on the extensible cache, which
  sizes the KV cache after warm-up within ``min(u x total, free - margin)``.
- The kubelet plugin reads a 0.34 container without either flag as taking the whole device
  (the 1.0 cap), and 0.92 of it with the extensible cache off.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from gatekeeper.cluster.claims import size_ranks
from gatekeeper.cluster.reserves import vllm_takes
from gatekeeper.estimator import GpuTarget, estimate
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import resolve_model
from gatekeeper.placement import PlacementPolicy, PlacementRequest, decide
from gatekeeper.placement.types import Placement
from gatekeeper.vllm.command import parse_vllm_command
from gatekeeper.vllm.flags import serve_options
from gatekeeper.vllm.serve_args import parse_serve_args
from gatekeeper.vllm.table import flag_table

RELEASE = "0.34.0"
LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")


def _placed(policy: PlacementPolicy, **extra: object) -> tuple[Placement, int, int]:
    snap = parse_declared_node("1xH100-80GB")
    options = ServeOptions(max_model_len=8192, vllm_version=RELEASE, **extra)  # type: ignore[arg-type]
    d = decide(PlacementRequest(LLAMA8, options, auto_parallel=False), snap, policy=policy)
    assert d.placement is not None, d.reasons
    g = snap.gpus[0]
    return d.placement, g.total_bytes, g.free_bytes


def _launched(p: Placement, total: int, free: int):
    """The estimate of the worker vLLM 0.34 starts from placement's argument list."""
    read = parse_serve_args(p.args, flag_table(RELEASE))
    options = dataclasses.replace(serve_options(read.values), vllm_version=RELEASE)
    return estimate(LLAMA8, options, GpuTarget(total_bytes=total, free_bytes=free))


def test_a_shared_worker_gets_a_byte_budget_and_takes_exactly_its_promise() -> None:
    p, total, free = _placed(PlacementPolicy(share_gpus=True))
    assert p.flags.kv_cache_memory_bytes == p.kv_cache_bytes
    assert "--kv-cache-memory-bytes" in p.args and "--enable-extensible-kv-cache" not in p.args
    launched = _launched(p, total, free)
    assert launched.extensible_kv_cache is False  # the byte budget turned it off
    assert launched.block_size == 64  # 0.34's default block, extensible or not
    assert launched.fits, launched.reasons
    assert launched.worst.kv_cache_bytes == p.kv_cache_bytes
    assert launched.worst.nvml_bytes == p.promise_bytes[0]
    # the fraction written beside it passes vLLM's start-up check on the idle GPU
    assert math.ceil(p.flags.gpu_memory_utilization * total) <= free


@pytest.mark.parametrize(
    "policy",
    # gatekeeper's default margin, and none: vLLM's own margin (max(1 GiB, 0.75 x the
    # transient peak), kept free when it sizes the cache) then binds before the cap
    [PlacementPolicy(), PlacementPolicy(margin_bytes=0, margin_fraction=0.0)],
)
def test_a_worker_alone_gets_a_cap_and_the_kv_cache_the_extensible_cache_sizes(
    policy: PlacementPolicy,
) -> None:
    p, total, free = _placed(policy)
    assert p.flags.kv_cache_memory_bytes is None and "--kv-cache-memory-bytes" not in p.args
    launched = _launched(p, total, free)
    assert launched.extensible_kv_cache is True
    assert launched.gpu_memory_utilization == p.flags.gpu_memory_utilization
    # what placement predicts is what the measured sizing leaves, and it is held
    assert launched.worst.kv_cache_bytes == p.kv_cache_bytes
    assert launched.worst.nvml_bytes <= p.promise_bytes[0]


def test_an_operators_fraction_on_0_34_is_a_cap_with_the_kv_cache_it_leaves() -> None:
    p, total, free = _placed(PlacementPolicy(share_gpus=True), gpu_memory_utilization=0.5)
    launched = _launched(p, total, free)
    assert launched.extensible_kv_cache is True
    assert p.flags.gpu_memory_utilization == 0.5
    assert launched.worst.kv_cache_bytes == p.kv_cache_bytes
    assert launched.worst.nvml_bytes <= p.promise_bytes[0]


def test_the_kubelet_plugin_reads_a_0_34_container_without_flags_as_the_whole_device() -> None:
    total = 80 * 2**30
    image = f"vllm/vllm-openai:v{RELEASE}"
    bare = parse_vllm_command(["vllm", "serve", "m"], [], image, {})
    off = parse_vllm_command(
        ["vllm", "serve", "m", "--no-enable-extensible-kv-cache"], [], image, {}
    )
    older = parse_vllm_command(["vllm", "serve", "m"], [], "vllm/vllm-openai:v0.33.0", {})
    assert bare is not None and off is not None and older is not None
    assert vllm_takes(bare, total, None).bytes == total
    assert vllm_takes(off, total, None).bytes == math.ceil(0.92 * total)
    assert vllm_takes(older, total, None).bytes == math.ceil(0.92 * total)


def test_an_asked_extensible_cache_on_a_shared_gpu_gets_a_cap_not_a_byte_budget() -> None:
    """vLLM refuses --enable-extensible-kv-cache beside --kv-cache-memory-bytes
    (config/vllm.py:3262): the operator's choice is kept, with the smallest fraction that
    covers the worker's need as the cap."""
    policy = PlacementPolicy(share_gpus=True)
    p, total, free = _placed(policy, enable_extensible_kv_cache=True)
    assert p.flags.kv_cache_memory_bytes is None
    assert "--enable-extensible-kv-cache" in p.args and "--kv-cache-memory-bytes" not in p.args
    launched = _launched(p, total, free)
    assert launched.extensible_kv_cache is True and launched.fits, launched.reasons
    assert launched.worst.kv_cache_bytes == p.kv_cache_bytes
    assert launched.worst.nvml_bytes <= p.promise_bytes[0]
    shared, _, _ = _placed(policy)
    assert p.kv_cache_bytes >= shared.kv_cache_bytes  # at least the KV cache asked for


def test_a_cluster_claim_for_0_34_holds_the_worker_its_flags_launch() -> None:
    """The mutating webhook's sizing (``claims.size_ranks``) for a ``vllm-openai:v0.34``
    container: a byte budget (the extensible cache off), and the kubelet plugin's reading
    of the patched flags (``reserves.vllm_takes``) within the claim."""
    snap = parse_declared_node("1xH100-80GB")
    g = snap.gpus[0]
    options = ServeOptions(max_model_len=8192, vllm_version=RELEASE)
    sizing = size_ranks(LLAMA8, options, g.total_bytes, g.name, PlacementPolicy())
    flags = ["--kv-cache-memory-bytes", str(sizing.kv_cache_memory_bytes),
             "--gpu-memory-utilization", str(sizing.gpu_memory_utilization)]  # fmt: skip
    command = parse_vllm_command(
        ["vllm", "serve", LLAMA8.serve_reference, "--max-model-len", "8192", *flags],
        [], f"vllm/vllm-openai:v{RELEASE}", {},
    )  # fmt: skip
    assert command is not None and command.vllm_version == RELEASE
    launched = estimate(
        LLAMA8,
        dataclasses.replace(command.options, vllm_version=RELEASE),
        GpuTarget(total_bytes=g.total_bytes, free_bytes=g.free_bytes),
    )
    assert launched.extensible_kv_cache is False and launched.fits, launched.reasons
    assert launched.worst.nvml_bytes == sizing.rank_bytes <= sizing.request_bytes
    takes = vllm_takes(command, g.total_bytes, launched.worst.nvml_bytes)
    assert takes.bytes <= sizing.request_bytes
