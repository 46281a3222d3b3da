"""One simulated ``vllm serve`` process: start-up, serving, signals and clean-up.

Part of the gatekeeper simulator; ``gatekeeper.simulator`` documents the command line
and the ``GATEKEEPER_SIM_*`` variables and builds the ``Simulator`` run here. The
start-up prints the log lines of the vLLM release played (0.33's, or 0.34's with
``GATEKEEPER_SIM_VLLM_VERSION``: ``extensible``) in its order, from ``APIServer``, ``EngineCore``
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
from gatekeeper.simulator import extensible as ext
from gatekeeper.simulator import nvml_claims as nvml
from gatekeeper.simulator.http import (
    SIMULATOR_NOTE,
    HangApp,
    ServingConfig,
    ServingCounters,
    build_app,
)
from gatekeeper.simulator.memory import (
    KV_BYTES_PER_TOKEN,
    KvCapacity,
    MemoryPlan,
    StartupFailure,
    fmt,
    free_memory_failure,
    kv_capacity,
    max_model_len_failure,
    oom_load_failure,
    oom_sampler_failure,
    plan_memory,
)
from gatekeeper.simulator.sleep import SleepMode
from gatekeeper.units import GIB, cdiv

if TYPE_CHECKING:
    from gatekeeper.simulator.env import SimEnv

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "SIMULATED_FLAGS",
    "VLLM_VERSION",
    "Simulator",
    "simulated_flags",
]

VLLM_VERSION = "0.33.0"
"""The vLLM release whose log lines and HTTP shapes the simulator copies by default
(``GATEKEEPER_SIM_VLLM_VERSION`` picks another of ``env.RELEASES``)."""
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


def simulated_flags(release: str) -> frozenset[str]:
    """``SIMULATED_FLAGS`` of the release played: 0.34's adds
    ``--[no-]enable-extensible-kv-cache``."""
    if release == ext.FIRST_RELEASE:
        return SIMULATED_FLAGS | {"enable_extensible_kv_cache"}
    return SIMULATED_FLAGS


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
        self.release = env.vllm_version
        self.v034 = self.release == ext.FIRST_RELEASE
        self.extensible = self.v034 and ext.extensible_kv_cache(args)
        self.block_size = ext.BLOCK_SIZE if self.v034 else 16
        self.sizing: ext.ExtensibleSizing | None = None
        self.stop = asyncio.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.claimed = False
        self.server: uvicorn.Server | None = None
        self.held: tuple[list[int], int, int] | None = None
        """What it claims: (NVML positions, bytes per GPU, the pid's share), for sleep."""
        self.awake_held: tuple[int, int] | None = None
        """Asleep: (bytes per GPU, the pid's share) it held awake."""

    def worker_names(self) -> list[str]:
        if self.world == 1:
            return ["EngineCore"]
        tp, pp = self.args.tensor_parallel_size, self.args.pipeline_parallel_size
        if pp == 1:
            return [f"Worker_TP{k}" for k in range(tp)]
        return [f"Worker_PP{p}_TP{k}" for p in range(pp) for k in range(tp)]

    def block_bytes(self) -> int:
        per_token = self.env.kv_bytes_per_token or cdiv(KV_BYTES_PER_TOKEN, self.world)
        return (self.args.block_size or self.block_size) * per_token

    def plan(self, total_bytes: int | None = None, free_bytes: int | None = None) -> MemoryPlan:
        """The figures on a GPU of ``total_bytes`` with ``free_bytes`` free, as the release
        played sizes them (``self.sizing``: the extensible KV cache's sizing)."""
        if self.extensible:
            plan, self.sizing = ext.plan_extensible(
                self.env, self.args, self.block_bytes(), total_bytes, free_bytes
            )
            return plan
        u = ext.resolved_utilization(self.args) if self.v034 else 0.92
        return plan_memory(self.env, self.args, total_bytes, free_bytes, u)

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
            f"{SIMULATOR_NOTE}: simulating `vllm serve {self.model}` (vLLM {self.release} "
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
            if forced and not self.extensible:
                raise free_memory_failure(plan, 0, forced=True)
            return plan
        positions = nvml.visible_positions(
            self.env.visible_devices, self.world, nvml.gpu_uuids(state)
        )
        seen: list[tuple[MemoryPlan, ext.ExtensibleSizing | None]] = []

        def check(devices: list[nvml.DeviceMemory]) -> None:
            for rank, position in enumerate(positions):
                device = devices[position]
                checked = self.plan(device.total_bytes, device.free_bytes)
                # v1/worker/utils.py:783-797: no refusal with 0.34's extensible KV cache
                refused = forced or device.free_bytes < checked.requested_bytes
                if refused and not self.extensible:
                    raise free_memory_failure(checked, rank, forced=forced)
                held = checked.weights_bytes if self.extensible else checked.actual_bytes
                if device.free_bytes < held:
                    raise oom_load_failure(checked, self.args)
                seen.append((checked, self.sizing))
            # every rank commits the fewest blocks (gpu_worker.py:1230, _min_across_ranks)
            fewest = min(seen, key=lambda p: p[0].kv_bytes)
            seen[:] = [fewest]

        def claims(devices: list[nvml.DeviceMemory]) -> list[nvml.Claim]:
            actual = seen[0][0].actual_bytes
            own = actual * 9 // 10
            self.held = (positions, actual, own)
            out = [nvml.Claim(p, self.pid, own) for p in positions]
            return out + [nvml.Claim(p, child.pid, actual - own) for p in positions]

        nvml.claim(state, claims, check)
        self.claimed = True
        plan, self.sizing = seen[0]
        return plan

    async def start_up(self, started: float) -> MemoryPlan | None:
        """vLLM's start-up, in its order; None when stopped, StartupFailure on failure."""
        args, fail = self.args, self.env.fail
        self.log("APIServer", "startup.py:93", f"non-default args: {self.non_default}")
        simulated = simulated_flags(self.release) | {"model_tag"}
        ignored = [k for k in self.non_default if k not in simulated]
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
            f"Initializing a V1 LLM engine (v{self.release}, {SIMULATOR_NOTE}) with config: "
            f"model={self.model!r}, max_seq_len={self.max_model_len}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, "
            f"pipeline_parallel_size={args.pipeline_parallel_size}, "
            f"enforce_eager={args.enforce_eager}",
        )
        plan = self.plan()
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
        self.log_graphs(plan)
        if fail == "oom-sampler":
            raise oom_sampler_failure(args)
        if args.kv_cache_memory_bytes is None:
            self.worker_log("gpu_worker.py:455", plan.summary_line())
        if self.extensible:
            self.size_kv_cache(plan)
        if not await self.pause(0.1):
            return None
        self.log(
            "EngineCore",
            "core.py:248",
            "init engine (profile, create kv cache, warmup model) took "
            f"{time.monotonic() - started:.2f} s",
        )
        return plan

    def log_graphs(self, plan: MemoryPlan) -> None:
        """The CUDA-graph capture's lines (none with ``--enforce-eager``)."""
        args = self.args
        if not plan.cuda_graph_bytes or args.enforce_eager:
            return
        self.worker_log(
            "gpu_model_runner.py:3810",
            f"Graph capturing finished in {self.env.startup_seconds * 0.25:.0f} secs, "
            f"took {plan.cuda_graph_bytes / GIB:.2f} GiB",
        )
        if not self.v034 or (not self.extensible and args.kv_cache_memory_bytes is None):
            self.worker_log(  # 0.34: only where the estimate was made (gpu_worker.py:1112)
                "gpu_worker.py:437",
                f"CUDA graph pool memory: {plan.gib('cuda_graph')} GiB (actual), "
                f"{plan.gib('cuda_graph')} GiB (estimated), difference: 0.0 GiB (0.0%).",
            )

    def log_kv_cache(self, plan: MemoryPlan) -> None:
        if self.v034:
            self.log_kv_cache_034(plan)
            return
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

    def log_kv_cache_034(self, plan: MemoryPlan) -> None:
        """vLLM 0.34's ``determine_available_memory`` and, with the cache off, its KV cache
        check and capacity (with it on, both wait for ``size_kv_cache``)."""
        args, fail = self.args, self.env.fail
        if args.kv_cache_memory_bytes is not None:
            self.worker_log("gpu_worker.py:708", plan.kv_bytes_line())
        reserved = plan.kv_bytes if plan.capacity_bytes is None else plan.capacity_bytes
        if args.kv_cache_memory_bytes is None:
            self.worker_log("gpu_worker.py:795", f"Available KV cache memory: {fmt(reserved)} GiB")
            if plan.cuda_graph_bytes and not self.extensible:
                self.worker_log("gpu_worker.py:809", ext.graph_profiling_line(plan))
        failure = ext.kv_memory_failure(
            plan,
            args,
            self.max_model_len,
            reserved,
            self.env.kv_bytes_per_token,
            extensible=self.extensible,
            forced=fail == "max-model-len" and not self.extensible,
        )
        if failure is not None:
            raise failure
        if not self.extensible:
            self.log_capacity(plan)

    def size_kv_cache(self, plan: MemoryPlan) -> None:
        """The extensible KV cache sized after warm-up (``extensible``): its line, the late
        ``max_model_len`` check, the capacity and the committed blocks."""
        sizing = self.sizing
        assert sizing is not None
        self.worker_log(
            "extensible_kv_cache.py:693", sizing.after_warmup_line(plan.requested_bytes)
        )
        fail = self.env.fail
        kv = 0 if fail == "free-memory" else plan.kv_bytes  # a GPU with nothing left
        failure = ext.kv_memory_failure(
            plan,
            self.args,
            self.max_model_len,
            kv,
            self.env.kv_bytes_per_token,
            extensible=True,
            after_warmup=True,
            forced=fail == "max-model-len",
        )
        if failure is not None:
            raise failure
        self.log_capacity(plan)
        self.worker_log("extensible_kv_cache.py:536", sizing.extended_line())

    def capacity(self, plan: MemoryPlan) -> KvCapacity:
        return kv_capacity(
            plan,
            self.max_model_len,
            self.args,
            self.env.kv_bytes_per_token,
            default_block_size=self.block_size,
        )

    def log_capacity(self, plan: MemoryPlan) -> None:
        self.log(
            "EngineCore", "kv_cache_utils.py:1168", self.capacity(plan).line(self.max_model_len)
        )

    def sleep_mode(self, plan: MemoryPlan) -> SleepMode:
        """vLLM's sleep mode over this worker's claims (``sleep``)."""
        return SleepMode(
            enabled=bool(getattr(self.args, "enable_sleep_mode", False)),
            release=self.release,
            kept_bytes=max(1, plan.actual_bytes - plan.weights_bytes - plan.kv_bytes),
            shrink=self.shrink_claims,
            restore=self.restore_claims,
            log=lambda message: self.log("Worker", "gpu_worker.py:330", message),
            fail=self.env.fail,
        )

    def shrink_claims(self, kept: int) -> None:
        """Asleep: hold only ``kept`` bytes per GPU (split as the claims were)."""
        state, child = self.env.nvml_state, self.child
        if state is None or child is None or self.held is None:
            return
        positions, actual, own = self.held
        nvml.release(state, {self.pid, child.pid})
        mine = kept * own // actual
        nvml.claim(
            state,
            [nvml.Claim(p, self.pid, mine) for p in positions]
            + [nvml.Claim(p, child.pid, kept - mine) for p in positions],
        )
        self.held = (positions, kept, mine)
        self.awake_held = (actual, own)

    def restore_claims(self) -> None:
        """Awake again: claim back what sleep gave up, or CUDA's out-of-memory error."""
        state, child = self.env.nvml_state, self.child
        if state is None or child is None or self.held is None or self.awake_held is None:
            return
        positions, kept, mine = self.held
        actual, own = self.awake_held

        def check(devices: list[nvml.DeviceMemory]) -> None:
            for p in positions:
                if devices[p].free_bytes < actual - kept:
                    raise MemoryError(
                        f"CUDA out of memory. Tried to allocate {fmt(actual - kept)} GiB. GPU "
                        f"{p} has a total capacity of {fmt(devices[p].total_bytes)} GiB of "
                        f"which {fmt(devices[p].free_bytes)} GiB is free."
                    )

        nvml.claim(
            state,
            [nvml.Claim(p, self.pid, own - mine) for p in positions]
            + [nvml.Claim(p, child.pid, actual - own - (kept - mine)) for p in positions],
            check,
        )
        self.held, self.awake_held = (positions, actual, own), None

    async def serve(self, sock: socket.socket, plan: MemoryPlan) -> int:
        capacity = self.capacity(plan)
        sleeping = self.sleep_mode(plan)
        counters = ServingCounters()
        config = ServingConfig(
            model=self.model,
            served_model_names=self.names,
            max_model_len=self.max_model_len,
            token_seconds=self.env.token_seconds,
            simulated_version=f"{self.release}+gatekeeper.simulator.{__version__}",
            log=lambda message: self.log("APIServer", "serving.py:226", message),
            crash=self.crash,
            stopping=lambda: self.server is not None and self.server.should_exit,
            crash_after_requests=self.env.crash_after_requests,
            kv_cache_tokens=capacity.tokens,
            cache_config=plan.cache_config(self.args, capacity),
            until_awake=sleeping.awake.wait,
            routes=tuple(sleeping.routes()) if self.env.dev_mode else (),
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
