"""A worker's predicted host memory (pure): the second resource beside its GPU bytes.

A vLLM deployment takes host RAM for (``HostEstimate``'s parts):

- ``process_bytes``: its processes themselves (Python, torch, vLLM, the tokenizer): one
  API server, and per engine replica (``-dp``) one process per rank (``tp x pp``) plus,
  when there are several ranks, the engine core that drives them (V1's
  ``MultiprocExecutor``; a single rank runs inside the engine core on a GPU,
  ``UniProcExecutor``). The figures are the CPU build's (vLLM 0.32, measured by
  ``tests/support/host_baseline.py``, docs/host-memory.md): ``FRONTEND_BYTES`` the API
  server's PSS, ``ENGINE_CORE_BYTES`` the engine core's without a model, ``RANK_BYTES``
  the worker's less its KV cache (the tiny model's weights are 0.3 MB). They are a
  **floor**: a GPU build's rank also maps the CUDA libraries (CUDA runtime, cuBLAS,
  cuDNN, NCCL and their kernels) and keeps pinned staging buffers, which the CPU build
  has none of, and a model's tokenizer and processor grow the API server.
- ``cpu_offload_bytes``: ``--cpu-offload-gb``, per GPU rank: the weights the estimator
  moved off each rank's GPU (``StageEstimate.cpu_offloaded_bytes``, at most the flag's
  GiB) sit in pinned host memory, once per GPU.
- ``kv_offload_bytes``: ``--kv-offloading-size`` GiB, which vLLM defines as the
  buffer's total across the TP ranks (``CacheConfig.kv_offloading_size``;
  ``VllmConfig._post_init_kv_transfer_config`` hands ``size x 2^30`` to the connector as
  ``cpu_bytes_to_use``, which ``CPUOffloadingSpec`` divides into chunks covering every
  rank of the world): one buffer per engine replica.
- ``swap_space_bytes``: V0's ``--swap-space`` GiB per GPU (vLLM's default 4), pinned
  by each V0 worker's cache engine. V1 keeps no CPU swap (it preempts by recomputing),
  so the flag costs nothing there; it is gone from vLLM's flags from 0.18.
- ``sleeping_weights_bytes``: a worker asleep at level 1 keeps its weights in pinned
  host memory (vLLM's ``CuMemAllocator`` backs up the ``weights`` tag); level 2 drops
  them (only the model's buffers, a few MiB, are copied to the host), and an awake
  worker holds none. ``at_sleep_level`` gives the figure for a level.

Example: Llama-3.1-8B at TP 2 with ``--cpu-offload-gb 4`` and ``--kv-offloading-size
16`` on a V1 release: process FRONTEND + ENGINE_CORE + 2 x RANK (2.41 GiB), offload
2 x 4 GiB (8.02: vLLM moves whole parameters until it passes the figure), KV offload
16 GiB; asleep at level 1, plus the 2 ranks' weights (about 15 GiB).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gatekeeper.units import GIB, MIB

__all__ = [
    "ENGINE_CORE_BYTES",
    "FRONTEND_BYTES",
    "RANK_BYTES",
    "V0_DEFAULT_SWAP_GIB",
    "HostEstimate",
    "host_estimate",
    "process_bytes",
    "sleeping_weights_bytes",
]


def sleeping_weights_bytes(level: int, weights_bytes: int) -> int:
    """Host bytes ``weights_bytes`` of GPU weights take asleep at ``level``: all of them at
    level 1 (pinned backup), none at level 2 (dropped) or awake (0)."""
    return weights_bytes if level == 1 else 0


FRONTEND_BYTES = 614 * MIB
"""vLLM's API server (PSS), CPU build 0.32: 614.8 and 636.1 MiB measured."""
ENGINE_CORE_BYTES = 594 * MIB
"""The engine core without a model (PSS), CPU build 0.32: 594.3 and 619.9 MiB measured."""
RANK_BYTES = 629 * MIB
"""A worker holding one rank, less its KV cache (PSS), CPU build 0.32: 629.2 and
650.6 MiB measured."""
V0_DEFAULT_SWAP_GIB = 4.0
"""V0's ``--swap-space`` default (``CacheConfig.swap_space``), GiB per GPU."""


@dataclass(frozen=True, slots=True)
class HostEstimate:
    """A deployment's predicted host bytes, by part (all its processes together)."""

    process_bytes: int = 0
    cpu_offload_bytes: int = 0
    kv_offload_bytes: int = 0
    swap_space_bytes: int = 0
    sleeping_weights_bytes: int = 0
    """Held only while asleep at level 1 (``at_sleep_level``)."""
    weights_bytes: int = 0
    """The GPU weights of every rank: what level-1 sleep moves to the host."""
    sleep_level: Literal[0, 1, 2] = 0
    """0: awake (or not sleeping at all)."""

    @property
    def host_bytes(self) -> int:
        return (
            self.process_bytes
            + self.cpu_offload_bytes
            + self.kv_offload_bytes
            + self.swap_space_bytes
            + self.sleeping_weights_bytes
        )

    def at_sleep_level(self, level: Literal[0, 1, 2]) -> HostEstimate:
        """The same deployment awake (0) or asleep at ``level``."""
        held = sleeping_weights_bytes(level, self.weights_bytes)
        return replace(self, sleep_level=level, sleeping_weights_bytes=held)

    def parts(self) -> dict[str, int]:
        """The parts by JSON key (they add up to ``host_bytes``)."""
        return {
            "process_bytes": self.process_bytes,
            "cpu_offload_bytes": self.cpu_offload_bytes,
            "kv_offload_bytes": self.kv_offload_bytes,
            "swap_space_bytes": self.swap_space_bytes,
            "sleeping_weights_bytes": self.sleeping_weights_bytes,
        }

    def to_json(self) -> dict[str, int]:
        return {**self.parts(), "sleep_level": self.sleep_level}


def process_bytes(ranks: int, replicas: int = 1) -> int:
    """The processes' own bytes: one API server, and per replica ``ranks`` rank
    processes plus an engine core of its own when there are several ranks."""
    core = ENGINE_CORE_BYTES if ranks > 1 else 0
    return FRONTEND_BYTES + replicas * (ranks * RANK_BYTES + core)


def host_estimate(
    *,
    ranks: int,
    replicas: int,
    weights_bytes: int,
    cpu_offloaded_bytes: int,
    kv_offloading_gib: float | None,
    swap_space_gib: float | None,
    engine: Literal["v0", "v1"],
    sleep_level: Literal[0, 1, 2] = 0,
) -> HostEstimate:
    """A deployment's host bytes. ``ranks`` = tp x pp of one replica, ``replicas`` = dp;
    ``weights_bytes`` and ``cpu_offloaded_bytes`` are summed over one replica's ranks
    (per-rank figures x TP, per stage); each replica holds its own."""
    gpus = ranks * replicas
    swap = 0
    if engine == "v0":
        swap = round((V0_DEFAULT_SWAP_GIB if swap_space_gib is None else swap_space_gib) * GIB)
    awake = HostEstimate(
        process_bytes=process_bytes(ranks, replicas),
        cpu_offload_bytes=cpu_offloaded_bytes * replicas,
        kv_offload_bytes=round((kv_offloading_gib or 0.0) * GIB) * replicas,
        swap_space_bytes=swap * gpus,
        weights_bytes=weights_bytes * replicas,
    )
    return awake.at_sleep_level(sleep_level)
