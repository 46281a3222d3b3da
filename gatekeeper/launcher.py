"""Start, watch and stop vLLM worker processes.

A worker is started from an argument list (never a shell string) in its own process
group (``start_new_session``), with ``CUDA_VISIBLE_DEVICES`` set to its GPUs, a port from
the configured range, its own temporary and cache directories, and stdout and stderr
written straight to a log file in the state directory. Writing to a file rather than a
pipe lets a worker outlive a sidecar restart; the log is rotated at each launch (the
last ``LOG_GENERATIONS`` are kept).

Readiness follows vLLM: connections are refused while the engine loads, then
``/health`` answers 200. The wait is bounded and fails with the reason: the exit code
and vLLM's own memory error (free-memory check, max_model_len check, out of memory)
with the last log lines, or "did not become ready in T s".

Exit is detected at once: an own child through its asyncio process, an adopted worker
(after a sidecar restart) through a pidfd. Stopping sends SIGTERM to the process group,
then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from gatekeeper.cuda_devices import worker_cuda_env
from gatekeeper.errors import GatekeeperError
from gatekeeper.vllm_log import StartupLog

__all__ = [
    "LOG_GENERATIONS",
    "LaunchSpec",
    "WorkerProcess",
    "WorkerStartError",
    "process_group_alive",
    "rotate_logs",
    "worker_argv",
    "worker_environment",
]

LOG_GENERATIONS = 3


class WorkerStartError(GatekeeperError):
    """A worker did not become ready: why, with the last lines of its log."""


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    worker_id: str
    command: tuple[str, ...]
    """The worker program, e.g. ``("vllm", "serve")``."""
    args: tuple[str, ...]
    """Arguments from the placement: the model first, then the flags."""
    host: str
    port: int
    gpu_indices: tuple[int, ...]
    log_path: Path
    work_dir: Path
    env: Mapping[str, str]
    """Extra environment from the settings."""


def worker_argv(spec: LaunchSpec) -> list[str]:
    return [*spec.command, *spec.args, "--host", spec.host, "--port", str(spec.port)]


def worker_environment(spec: LaunchSpec, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    tmp = spec.work_dir / "tmp"
    env.update(
        {
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(spec.work_dir / "cache"),
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_HOST_IP": spec.host if spec.host not in ("0.0.0.0", "::") else "127.0.0.1",
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(worker_cuda_env(spec.gpu_indices))
    env.update(spec.env)
    return env


def rotate_logs(path: Path, generations: int = LOG_GENERATIONS) -> None:
    """``worker.log`` -> ``worker.log.1`` -> … keeping ``generations`` old files."""
    for n in range(generations, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        newer = path if n == 1 else path.with_name(f"{path.name}.{n - 1}")
        if newer.exists():
            os.replace(newer, older)


class WorkerProcess:
    """A running worker: its pid, its log, and an event set when it exits."""

    def __init__(
        self, spec: LaunchSpec, pid: int, *, process: asyncio.subprocess.Process | None
    ) -> None:
        self.spec = spec
        self.pid = pid
        self.started_at = time.time()
        self.returncode: int | None = None
        self.exited = asyncio.Event()
        self._process = process
        self._log_offset = 0
        self._startup = StartupLog()
        self._watch = asyncio.get_running_loop().create_task(self._watch_exit())

    @classmethod
    async def start(cls, spec: LaunchSpec, base_env: Mapping[str, str]) -> WorkerProcess:
        for sub in ("tmp", "cache"):
            (spec.work_dir / sub).mkdir(parents=True, exist_ok=True)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_logs(spec.log_path)
        with spec.log_path.open("ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *worker_argv(spec),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=worker_environment(spec, base_env),
                    cwd=str(spec.work_dir),
                    start_new_session=True,
                )
            except OSError as e:
                raise WorkerStartError(
                    f"worker {spec.worker_id}: cannot run {spec.command[0]!r} ({e.strerror}); "
                    "install vLLM or set GATEKEEPER_WORKER_COMMAND",
                    field="worker_command",
                    value=" ".join(spec.command),
                ) from e
        return cls(spec, process.pid, process=process)

    @classmethod
    def adopt(cls, spec: LaunchSpec, pid: int) -> WorkerProcess:
        """Watch a worker an earlier sidecar started (it is not our child)."""
        return cls(spec, pid, process=None)

    async def _watch_exit(self) -> None:
        if self._process is not None:
            self.returncode = await self._process.wait()
        else:
            await _wait_pid(self.pid)
        self.exited.set()

    @property
    def alive(self) -> bool:
        return not self.exited.is_set()

    def startup(self) -> StartupLog:
        """What the log says so far (read incrementally)."""
        try:
            with self.spec.log_path.open("rb") as f:
                f.seek(self._log_offset)
                data = f.read()
        except OSError:
            return self._startup
        cut = data.rfind(b"\n") + 1
        self._log_offset += cut
        for line in data[:cut].decode("utf-8", "replace").splitlines():
            self._startup = self._startup.feed(line)
        return self._startup

    def tail(self, lines: int = 20) -> list[str]:
        try:
            text = self.spec.log_path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
        except OSError:
            return []
        return text.splitlines()[-lines:]

    async def wait_ready(
        self, client: httpx.AsyncClient, timeout_seconds: float, poll_seconds: float = 0.2
    ) -> StartupLog:
        """Wait for ``/health`` 200; raise ``WorkerStartError`` with the reason otherwise."""
        url = f"http://{self.spec.host}:{self.spec.port}/health"
        deadline = time.monotonic() + timeout_seconds
        while True:
            if not self.alive:
                raise self._exit_error()
            with contextlib.suppress(httpx.TransportError):
                response = await client.get(url, timeout=min(5.0, timeout_seconds))
                if response.status_code == 200:
                    return self.startup()
            if time.monotonic() > deadline:
                raise WorkerStartError(
                    f"worker {self.spec.worker_id} did not become ready in {timeout_seconds:.0f} s "
                    f"(last phase: {self.startup().phase}); last log lines:\n"
                    + "\n".join(self.tail()),
                    field="startup_timeout_seconds",
                    value=timeout_seconds,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), poll_seconds)

    def _exit_error(self) -> WorkerStartError:
        log = self.startup()
        reason = f" ({log.failure})" if log.failure else ""
        return WorkerStartError(
            f"worker {self.spec.worker_id} exited with code {self.returncode}{reason}; "
            "last log lines:\n" + "\n".join(self.tail()),
            field="worker",
            value=self.returncode,
        )

    async def stop(self, grace_seconds: float) -> None:
        """SIGTERM to the process group, then SIGKILL after ``grace_seconds``."""
        if self.alive:
            _signal_group(self.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), grace_seconds)
        # Children (engine core, TP workers) may outlive the leader: kill the group.
        _signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited.wait(), grace_seconds)
        await asyncio.gather(self._watch, return_exceptions=True)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _wait_pid(pid: int) -> None:
    """Return when ``pid`` exits (a pidfd, so it needs no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def process_group_alive(pid: int) -> bool:
    """True while any process of the group ``pid`` leads is alive."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
