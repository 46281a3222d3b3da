"""One simulated ``vllm serve`` process: start-up, serving, signals and clean-up.

Part of the gatekeeper simulator; ``gatekeeper.simulator`` documents the command line
and the ``GATEKEEPER_SIM_*`` variables and builds the ``Simulator`` run here. The
start-up prints vLLM 0.33's log lines in its order, from ``APIServer``, ``EngineCore``
and, with TP x PP > 1, ``Worker_TP<k>`` (all with this process's pid), pausing for a
share of the start-up time between steps; the port is bound at once and listens only
when ready. The HTTP app is ``gatekeeper.simulator.http``'s, under uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import uvicorn

from gatekeeper._version import __version__
from gatekeeper.simulator import nvml_claims as nvml
from gatekeeper.simulator.http import (
    SIMULATOR_NOTE,
    HangApp,
    ServingConfig,
    ServingCounters,
    build_app,
)
from gatekeeper.simulator.memory import (
    MemoryPlan,
    StartupFailure,
    free_memory_failure,
    kv_capacity,
    max_model_len_failure,
    oom_load_failure,
    oom_sampler_failure,
    plan_memory,
)
from gatekeeper.units import GIB

if TYPE_CHECKING:
    from gatekeeper.simulator.env import SimEnv

__all__ = ["DEFAULT_MAX_MODEL_LEN", "SIMULATED_FLAGS", "VLLM_VERSION", "Simulator"]

VLLM_VERSION = "0.33.0"
"""The vLLM release whose log lines and HTTP shapes the simulator copies."""
DEFAULT_MAX_MODEL_LEN = 8192
"""``--max-model-len`` when not given (vLLM would derive it from the model's config)."""
SIMULATED_FLAGS = frozenset(
    {
        "model",
        "host",
        "port",
        "served_model_name",
        "max_model_len",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "kv_cache_dtype",
        "enable_prefix_caching",
        "enforce_eager",
    }
)
"""The flags whose values the simulator reads (here and in ``memory``); every other flag
of vLLM's table is accepted, checked with its grammar, logged among the non-default args
and changes nothing."""


class _Log:
    """vLLM's log lines: ``(NAME pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __call__(self, proc: str, where: str, message: str, level: str = "INFO") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        for line in message.splitlines() or [""]:
            sys.stdout.write(f"({proc} pid={self.pid}) {level} {stamp} [{where}] {line}\n")
        sys.stdout.flush()


class _UvicornHandler(logging.Handler):
    """Uvicorn's own lines as vLLM shows them: ``(APIServer pid=N) INFO:     ...``."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def emit(self, record: logging.LogRecord) -> None:
        sys.stdout.write(
            f"(APIServer pid={self.pid}) {record.levelname}:     {record.getMessage()}\n"
        )
        sys.stdout.flush()


class Simulator:
    """One simulated ``vllm serve`` process."""

    def __init__(self, args: argparse.Namespace, non_default: dict[str, Any], env: SimEnv) -> None:
        self.args, self.non_default, self.env = args, non_default, env
        self.pid = os.getpid()
        self.log = _Log(self.pid)
        self.model: str = args.model_tag or args.model
        self.names = tuple(args.served_model_name or [self.model])
        self.max_model_len = (
            args.max_model_len
            if args.max_model_len and args.max_model_len > 0
            else DEFAULT_MAX_MODEL_LEN
        )
        self.world = args.tensor_parallel_size * args.pipeline_parallel_size
        self.stop = asyncio.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.claimed = False
        self.server: uvicorn.Server | None = None

    def worker_names(self) -> list[str]:
        if self.world == 1:
            return ["EngineCore"]
        tp, pp = self.args.tensor_parallel_size, self.args.pipeline_parallel_size
        if pp == 1:
            return [f"Worker_TP{k}" for k in range(tp)]
        return [f"Worker_PP{p}_TP{k}" for p in range(pp) for k in range(tp)]

    def worker_log(self, where: str, message: str) -> None:
        for name in self.worker_names():
            self.log(name, where, message)

    async def pause(self, fraction: float) -> bool:
        """Sleep a share of the start-up time; False when asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), self.env.startup_seconds * fraction)
        return not self.stop.is_set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        started = time.monotonic()
        self.log(
            "APIServer",
            "simulator.py:1",
            f"{SIMULATOR_NOTE}: simulating `vllm serve {self.model}` (vLLM {VLLM_VERSION} "
            "log formats); no model is loaded and no GPU is used",
            "WARNING",
        )
        try:
            sock = self.bind()
        except OSError as e:
            print(f"Traceback (most recent call last):\nOSError: {e}", file=sys.stderr)
            return 1
        try:
            self.child = self.spawn_child()
            try:
                plan = await self.start_up(started)
            except StartupFailure as failure:
                failure.print(self.log)
                return 1
            if plan is None:
                return 0
            return await self.serve(sock, plan)
        finally:
            sock.close()
            self.cleanup()

    def bind(self) -> socket.socket:
        """Bind now, listen when ready: connections are refused while loading. The protocol
        is named (``IPPROTO_TCP``, not 0) because asyncio sets ``TCP_NODELAY`` only on
        accepted sockets whose protocol says TCP: without it, a response written in two
        pieces (headers, then body; or one SSE event after another) waits for the
        client's delayed ACK, about 40 ms a request."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.args.host or "", self.args.port))
        except OSError:
            sock.close()
            raise
        return sock

    def spawn_child(self) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "gatekeeper.simulator.nvml_claims", str(self.pid)]
        if self.env.nvml_state is not None:
            command.append(str(self.env.nvml_state))
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)

    def cleanup(self) -> None:
        """Release the claims and end the child (idempotent)."""
        if self.claimed and self.env.nvml_state is not None and self.child is not None:
            nvml.release(self.env.nvml_state, {self.pid, self.child.pid})
            self.claimed = False
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            if self.child.stdin is not None:
                self.child.stdin.close()
            self.child = None
        sys.stdout.flush()

    def claim(self, plan: MemoryPlan) -> MemoryPlan:
        """Check vLLM's start-up condition on each GPU and hold the memory there."""
        state, child = self.env.nvml_state, self.child
        forced = self.env.fail == "free-memory"
        if state is None or child is None:
            if forced:
                raise free_memory_failure(plan, 0, forced=True)
            return plan
        positions = nvml.visible_positions(
            self.env.visible_devices, self.world, nvml.gpu_uuids(state)
        )
        own = plan.actual_bytes * 9 // 10
        claims = [nvml.Claim(p, self.pid, own) for p in positions]
        claims += [nvml.Claim(p, child.pid, plan.actual_bytes - own) for p in positions]
        seen: list[MemoryPlan] = []

        def check(devices: list[nvml.DeviceMemory]) -> None:
            for rank, position in enumerate(positions):
                device = devices[position]
                checked = plan_memory(self.env, self.args, device.total_bytes, device.free_bytes)
                if forced or device.free_bytes < checked.requested_bytes:
                    raise free_memory_failure(checked, rank, forced=forced)
                if device.free_bytes < checked.actual_bytes:
                    raise oom_load_failure(checked, self.args)
                seen.append(checked)

        nvml.claim(state, claims, check)
        self.claimed = True
        return seen[0]

    async def start_up(self, started: float) -> MemoryPlan | None:
        """vLLM's start-up, in its order; None when stopped, StartupFailure on failure."""
        args, fail = self.args, self.env.fail
        self.log("APIServer", "startup.py:93", f"non-default args: {self.non_default}")
        ignored = [k for k in self.non_default if k not in SIMULATED_FLAGS | {"model_tag"}]
        if ignored:
            self.log(
                "APIServer",
                "simulator.py:2",
                f"{SIMULATOR_NOTE}: accepted as vLLM accepts them, not simulated: "
                f"{', '.join(ignored)}",
                "WARNING",
            )
        self.log("APIServer", "model.py:1679", f"Using max model len {self.max_model_len}")
        batched = args.max_num_batched_tokens or 2048
        self.log(
            "APIServer",
            "scheduler.py:230",
            f"Chunked prefill is enabled with max_num_batched_tokens={batched}.",
        )
        self.log(
            "EngineCore",
            "core.py:97",
            f"Initializing a V1 LLM engine (v{VLLM_VERSION}, {SIMULATOR_NOTE}) with config: "
            f"model={self.model!r}, max_seq_len={self.max_model_len}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, "
            f"pipeline_parallel_size={args.pipeline_parallel_size}, "
            f"enforce_eager={args.enforce_eager}",
        )
        plan = plan_memory(self.env, args)
        try:
            plan = self.claim(plan)
        except (ValueError, OSError) as e:
            raise StartupFailure(f"{type(e).__name__}: {e}") from e
        if not await self.pause(0.1) or not await self.pause(0.4):
            return None
        if fail == "oom-load":
            raise oom_load_failure(plan, args)
        self.worker_log(
            "gpu_model_runner.py:2862",
            f"Model loading took {plan.gib('weights')} GiB memory and "
            f"{self.env.startup_seconds * 0.4:.6f} seconds",
        )
        if not await self.pause(0.15):
            return None
        self.log_kv_cache(plan)
        if not await self.pause(0.25):
            return None
        if plan.cuda_graph_bytes and not args.enforce_eager:
            self.worker_log(
                "gpu_model_runner.py:3810",
                f"Graph capturing finished in {self.env.startup_seconds * 0.25:.0f} secs, "
                f"took {plan.cuda_graph_bytes / GIB:.2f} GiB",
            )
            self.worker_log(
                "gpu_worker.py:437",
                f"CUDA graph pool memory: {plan.gib('cuda_graph')} GiB (actual), "
                f"{plan.gib('cuda_graph')} GiB (estimated), difference: 0.0 GiB (0.0%).",
            )
        if fail == "oom-sampler":
            raise oom_sampler_failure(args)
        if args.kv_cache_memory_bytes is None:
            self.worker_log("gpu_worker.py:455", plan.summary_line())
        if not await self.pause(0.1):
            return None
        self.log(
            "EngineCore",
            "core.py:248",
            "init engine (profile, create kv cache, warmup model) took "
            f"{time.monotonic() - started:.2f} s",
        )
        return plan

    def log_kv_cache(self, plan: MemoryPlan) -> None:
        args = self.args
        if args.kv_cache_memory_bytes is not None:
            self.worker_log("gpu_worker.py:318", plan.kv_bytes_line())
        else:
            if plan.cuda_graph_bytes:
                self.worker_log(
                    "gpu_model_runner.py:4610",
                    f"Estimated CUDA graph memory: {plan.cuda_graph_bytes / GIB:.2f} GiB total",
                )
            self.worker_log("gpu_worker.py:347", f"Available KV cache memory: {plan.gib('kv')} GiB")
        capacity = kv_capacity(plan, self.max_model_len, args, self.env.kv_bytes_per_token)
        if self.env.fail == "max-model-len" or not capacity.fits:
            raise max_model_len_failure(plan, self.max_model_len, capacity)
        self.log("EngineCore", "kv_cache_utils.py:1324", capacity.line(self.max_model_len))

    async def serve(self, sock: socket.socket, plan: MemoryPlan) -> int:
        capacity = kv_capacity(plan, self.max_model_len, self.args, self.env.kv_bytes_per_token)
        counters = ServingCounters()
        config = ServingConfig(
            model=self.model,
            served_model_names=self.names,
            max_model_len=self.max_model_len,
            token_seconds=self.env.token_seconds,
            simulated_version=f"{VLLM_VERSION}+gatekeeper.simulator.{__version__}",
            log=lambda message: self.log("APIServer", "serving.py:226", message),
            crash=self.crash,
            stopping=lambda: self.server is not None and self.server.should_exit,
            crash_after_requests=self.env.crash_after_requests,
            kv_cache_tokens=capacity.tokens,
            cache_config=plan.cache_config(self.args, capacity),
        )
        app: Any = HangApp() if self.env.fail == "hang" else build_app(config, counters)
        handler = _UvicornHandler(self.pid)
        for name in ("uvicorn", "uvicorn.error"):
            logging.getLogger(name).handlers = [handler]
            logging.getLogger(name).setLevel(logging.INFO)
            logging.getLogger(name).propagate = False
        uv = uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(uv)
        host, port = sock.getsockname()[:2]
        self.log(
            "APIServer",
            "api_server.py:1964",
            f"Starting vLLM server on http://{host or '0.0.0.0'}:{port}",
        )
        for route in getattr(app, "routes", []):
            self.log(
                "APIServer",
                "launcher.py:46",
                f"Route: {route.path}, Methods: {', '.join(sorted(route.methods or []))}",
            )
        if self.stop.is_set():
            return 0
        dying = None
        if self.env.die_after_ready_seconds is not None:
            dying = asyncio.create_task(self.die_after(self.env.die_after_ready_seconds))
        await self.server.serve(sockets=[sock])
        if dying is not None:
            dying.cancel()
        return 0

    async def die_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.log(
            "APIServer",
            "core_client.py:564",
            "Engine core proc EngineCore died unexpectedly, shutting down client.",
            "ERROR",
        )
        self.log(
            "APIServer",
            "async_llm.py:480",
            "AsyncLLM output_handler failed.\nvllm.v1.engine.exceptions.EngineDeadError: "
            "EngineCore encountered an issue. See stack trace (above) for the root cause.",
            "ERROR",
        )
        self.cleanup()
        os._exit(1)

    def crash(self) -> None:
        """Die at once, as the OOM killer does: no clean-up (the child releases)."""
        sys.stdout.flush()
        os.kill(self.pid, signal.SIGKILL)
