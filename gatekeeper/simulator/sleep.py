"""vLLM's sleep mode as the simulator plays it: the routes, their parameters, answers and
status codes, and the memory a sleeping worker gives back.

Written from vLLM's source (0.32-0.34): ``entrypoints/serve/dev/sleep/api_router.py``
(the routes, served only with ``VLLM_SERVER_DEV_MODE=1``), ``v1/engine/core.py`` (level
0 pauses the scheduler; 1 and 2 also hand the executor's memory back), ``v1/executor/
abstract.py`` (a second ``/sleep`` is a no-op; ``/wake_up`` of an awake engine too) and
``device_allocator/{sleep_mode_backend,cumem}.py`` (the CuMemAllocator's pool, the
weights and the KV cache, is unmapped; everything outside it stays):

- ``POST /sleep?level=0|1|2&mode=abort|wait|keep`` (0.33 and later also
  ``reset_connector``): 200 ``{"status": "sleeping", "level": N}``; a level outside 0-2
  or an unknown mode is FastAPI's 422 ``{"detail": [...]}``;
- ``POST /wake_up[?tags=...]``: 200 ``{"status": "awake", "tags": null}`` (or the tags
  given, ``"sleeping"`` while some of ``weights``/``kv_cache`` stay asleep);
- ``GET /is_sleeping``: 200 ``{"is_sleeping": bool}``;
- ``POST /release_kv_cache_memory``: 200 ``{"status": "kv_cache_released"}``.

Without ``--enable-sleep-mode`` the pool is empty: ``/sleep`` answers as always and
frees nothing. Asleep (level >= 1, sleep mode on), the simulator's claims in the
stand-in NVML driver shrink to what vLLM keeps (its bytes less the weights and the KV
cache) and are claimed back at wake, where a GPU that has meanwhile filled up gives
vLLM's CUDA out-of-memory error (500). Requests that arrive while it sleeps wait for the
wake (vLLM's paused scheduler keeps them). ``GATEKEEPER_SIM_FAIL=wake-error`` makes
``/wake_up`` answer 500, ``wake-hang`` never answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["SLEEP_TAGS", "SleepMode"]

SLEEP_TAGS = ("weights", "kv_cache")
"""``v1/executor/abstract.py``'s ``SLEEP_TAGS``: what level 1 and 2 put to sleep."""
PAUSE_MODES = ("abort", "wait", "keep")
"""``v1/engine/__init__.py``'s ``PauseMode``."""


def _unprocessable(loc: str, value: str, message: str, kind: str) -> JSONResponse:
    """FastAPI's request-validation answer for one query parameter."""
    detail = [{"type": kind, "loc": ["query", loc], "msg": message, "input": value}]
    return JSONResponse({"detail": detail}, status_code=422)


@dataclass(eq=False)
class SleepMode:
    """One worker's sleep state and routes. ``shrink(kept)`` and ``restore()`` move its
    claims in the stand-in driver (no-ops without one); ``restore`` raises
    ``MemoryError`` with vLLM's text when the GPU has no room left."""

    enabled: bool
    """``--enable-sleep-mode`` (the CuMemAllocator's pool)."""
    release: str
    kept_bytes: int
    """Per GPU, what stays while asleep (outside the pool)."""
    shrink: Callable[[int], None]
    restore: Callable[[], None]
    log: Callable[[str], None]
    fail: str | None = None
    level: int | None = None
    """The level it sleeps at, None awake."""
    sleeping_tags: set[str] = field(default_factory=set)
    awake: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.awake.set()

    def routes(self) -> list[Route]:
        return [
            Route("/sleep", self.sleep, methods=["POST"]),
            Route("/wake_up", self.wake_up, methods=["POST"]),
            Route("/is_sleeping", self.is_sleeping, methods=["GET"]),
            Route("/release_kv_cache_memory", self.release_kv_cache, methods=["POST"]),
        ]

    async def sleep(self, request: Request) -> Response:
        text = request.query_params.get("level", "1")
        try:
            level = int(text)
        except ValueError:
            return _unprocessable(
                "level", text, "Input should be a valid integer, unable to parse string as an "
                "integer", "int_parsing",
            )  # fmt: skip
        if not 0 <= level <= 2:
            bound = "greater than or equal to 0" if level < 0 else "less than or equal to 2"
            kind = "greater_than_equal" if level < 0 else "less_than_equal"
            return _unprocessable("level", text, f"Input should be {bound}", kind)
        mode = request.query_params.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return _unprocessable(
                "mode", mode, "Input should be 'abort', 'wait' or 'keep'", "literal_error"
            )
        self.awake.clear()
        if self.level is None:
            self.level = level
        if level >= 1 and not self.sleeping_tags:
            self.sleeping_tags = set(SLEEP_TAGS)
            if self.enabled:
                self.shrink(self.kept_bytes)
            self.log(f"Sleep mode freed memory at level {level} (gatekeeper simulator).")
        return JSONResponse({"status": "sleeping", "level": level})

    async def wake_up(self, request: Request) -> Response:
        tags: list[str] | None = request.query_params.getlist("tags") or None
        if self.fail == "wake-hang":
            await asyncio.Event().wait()
        if self.fail == "wake-error":
            return JSONResponse(
                {"error": {"message": "CUDA error: an illegal memory access was encountered",
                           "type": "InternalServerError", "param": None, "code": 500}},
                status_code=500,
            )  # fmt: skip
        waking = set(SLEEP_TAGS) if tags is None else {t for t in tags if t != "scheduling"}
        if self.sleeping_tags and waking <= self.sleeping_tags:
            if self.enabled and waking == self.sleeping_tags:
                try:
                    self.restore()
                except MemoryError as e:
                    return _engine_error(str(e))
            self.sleeping_tags -= waking
        fully_awake = not self.sleeping_tags
        if fully_awake:
            self.level = None
            self.awake.set()
        return JSONResponse({"status": "awake" if fully_awake else "sleeping", "tags": tags})

    async def is_sleeping(self, request: Request) -> Response:
        return JSONResponse({"is_sleeping": not self.awake.is_set()})

    async def release_kv_cache(self, request: Request) -> Response:
        if self.awake.is_set() or self.sleeping_tags:
            return _engine_error("release_kv_cache_memory() requires a completed pause first")
        return JSONResponse({"status": "kv_cache_released"})


def _engine_error(message: str) -> Response:
    body: dict[str, Any] = {
        "error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}
    }
    return JSONResponse(body, status_code=500)
