"""vLLM's sleep mode, as its source has it, and gatekeeper's idle policy that uses it.

What vLLM does (read from ``vllm/entrypoints/serve/dev/sleep/api_router.py``,
``vllm/v1/engine/core.py``, ``vllm/v1/worker/gpu_worker.py`` and
``vllm/device_allocator/{sleep_mode_backend,cumem}.py`` of 0.32, 0.33 and 0.34):

- ``--enable-sleep-mode`` (every shipped flag table has it) turns on the CuMemAllocator:
  the weights (tag ``weights``), the KV cache (``kv_cache``) and the KV set-up state
  (``runtime``) are allocated in its pool. A platform without it (the CPU build:
  ``Platform.is_sleep_mode_available`` is CUDA, ROCm and XPU only) refuses the flag at
  start-up: "Sleep mode is not supported on current platform." (``config/model.py``).
- The routes exist only with ``VLLM_SERVER_DEV_MODE=1`` in the worker's environment
  (``launchers/api_server/routers.py`` registers the dev routers then):
  ``POST /sleep?level=0|1|2&mode=abort|wait|keep`` (FastAPI ``Query(ge=0, le=2)``: 422
  outside; 0.33 adds ``reset_connector``) answers ``{"status": "sleeping", "level": N}``;
  ``POST /wake_up[?tags=weights&tags=kv_cache]`` answers ``{"status": "awake" | "sleeping",
  "tags": [...] | null}`` ("sleeping" while tags are left asleep); ``GET /is_sleeping``
  answers ``{"is_sleeping": bool}`` (true while paused at level 0 as well);
  ``POST /release_kv_cache_memory`` answers ``{"status": "kv_cache_released"}``. An
  engine error is a 500.
- Level 0 pauses the scheduler only (no memory moves). Level 1 and 2 unmap every
  allocation of the pool: at level 1 the weights (and the ``runtime``/``cudagraph``
  tags) are first copied to pinned host memory, at level 2 the weights are dropped
  (the buffers are saved to host memory) and must be reloaded by the caller. Without
  ``--enable-sleep-mode`` the pool is empty: ``/sleep`` answers "sleeping" and frees
  nothing.
- What stays on the GPU while asleep is everything outside the pool: the CUDA context
  and the libraries' workspaces (the estimate's non-torch bytes), the CUDA graph pool
  (unless ``--sleep-mode-offload-cudagraph``), NCCL buffers (unless
  ``--enable-nccl-comm-suspend``), and what PyTorch's caching allocator keeps reserved
  after the profile run (the activation peak). ``asleep_bytes`` is that residue.

Imports nothing of the sidecar: the sidecar, the settings and the admin API read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gatekeeper.estimator.host import sleeping_weights_bytes
from gatekeeper.vllm.table import flag_table

__all__ = [
    "DEV_MODE_ENV",
    "SLEEP_FLAG",
    "SLEEP_LEVELS",
    "IdleAction",
    "IdlePolicy",
    "asleep_bytes",
    "asleep_host_bytes",
    "release_sleep_problem",
    "sleep_level_problem",
]

IdleAction = Literal["stop", "sleep"]
"""What an idle worker becomes: ``stop`` (its process ends, a request launches it again)
or ``sleep`` (vLLM's sleep mode: its GPU memory released, a request wakes it)."""

SLEEP_FLAG = "--enable-sleep-mode"
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""The worker environment that makes vLLM serve ``/sleep``, ``/wake_up``, ``/is_sleeping``."""
SLEEP_LEVELS = (1, 2)
"""The levels gatekeeper puts a worker to sleep at (level 0 frees nothing)."""


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """A deployment's idle policy: the action, and the sleep level when it sleeps."""

    action: IdleAction = "stop"
    sleep_level: int = 1

    def to_json(self) -> dict[str, object]:
        return {"idle_action": self.action, "sleep_level": self.sleep_level}


def sleep_level_problem(level: object) -> str | None:
    """Why ``level`` is not a sleep level gatekeeper uses (None when it is 1 or 2)."""
    if isinstance(level, bool) or not isinstance(level, int):
        return "give a whole number: 1 (weights kept in host memory) or 2 (weights dropped)"
    if level == 0:
        return (
            "level 0 only pauses vLLM's scheduler and frees no GPU memory; give 1 (weights "
            "kept in host memory, KV cache dropped) or 2 (both dropped)"
        )
    if level not in SLEEP_LEVELS:
        return (
            "vLLM's /sleep takes level 0-2 (0 frees nothing); give 1 (weights kept in host "
            "memory, KV cache dropped) or 2 (both dropped)"
        )
    return None


def release_sleep_problem(release: str | None) -> str | None:
    """Why a worker of vLLM ``release`` cannot sleep (its flag table lacks
    ``--enable-sleep-mode``), or None when it can."""
    table = flag_table(release)
    if table.find("enable_sleep_mode") is None:
        return (
            f"vLLM {table.vllm} has no {SLEEP_FLAG}; use idle_action = 'stop' or a release "
            "that has sleep mode"
        )
    return None


def asleep_bytes(promise_bytes: int, weights_bytes: int, kv_cache_bytes: int) -> int:
    """GPU bytes a worker keeps while asleep (level 1 or 2): its promise less the
    CuMemAllocator pool (weights and KV cache), at least 1 (the CUDA context)."""
    return max(1, promise_bytes - weights_bytes - kv_cache_bytes)


def asleep_host_bytes(level: int, weights_bytes: int, gpus: int) -> int:
    """Host bytes a sleeping worker's weights take (pinned, per GPU they were on): the
    weights at level 1, nothing at level 2 (dropped)."""
    return sleeping_weights_bytes(level, weights_bytes * gpus)
