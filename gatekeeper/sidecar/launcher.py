"""Start, watch and stop vLLM worker processes.

A worker is started from an argument list (never a shell string) in its own session
and process group (``posix_spawn`` with ``setsid``), with ``CUDA_VISIBLE_DEVICES`` set to its GPUs, a port from
the configured range, its own temporary and cache directories, and stdout and stderr
written straight to a log file in the state directory. Writing to a file rather than a
pipe lets a worker outlive a sidecar restart; the log is rotated at each launch (the
last ``LOG_GENERATIONS`` are kept).

Readiness follows vLLM: connections are refused while the engine loads, then
``/health`` answers 200. The wait is bounded and fails with the reason: the exit code
and vLLM's own memory error (free-memory check, max_model_len check, out of memory)
with the last log lines, or "did not become ready in T s".

Exit is detected at once through a pidfd, for an own child (reaped, with its exit
code) as for a worker adopted after a sidecar restart. Stopping sends SIGTERM (and SIGCONT) to the
process group, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from gatekeeper.errors import GatekeeperError
from gatekeeper.gpus.visible_devices import worker_cuda_env
from gatekeeper.vllm.log import StartupLog

__all__ = [
    "LOG_GENERATIONS",
    "WORKER_MARKER_ENV",
    "LaunchSpec",
    "WorkerProcess",
    "WorkerStartError",
    "marked_workers",
    "process_group_alive",
    "rotate_logs",
    "scratch_dir",
    "spawn",
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


SIDECAR_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
SETTINGS_ENV_PREFIX = "GATEKEEPER_"
"""The sidecar's settings (the admin token among them) come from these variables, in any
case (the settings read them case-insensitively); a worker never sees them."""


def worker_environment(spec: LaunchSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The sidecar's environment without its own variables (the Python ones and every
    ``GATEKEEPER_*`` setting, the admin token included), then the worker's own: scratch
    and cache directories, GPUs, and ``worker_env`` from the settings last."""
    env = {
        k: v
        for k, v in base.items()
        if k not in SIDECAR_ONLY_ENV and not k.upper().startswith(SETTINGS_ENV_PREFIX)
    }
    env.update(
        {
            "TMPDIR": str(scratch_dir(spec.worker_id)),
            "VLLM_CACHE_ROOT": str(spec.work_dir / "cache"),
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_HOST_IP": spec.host if spec.host not in ("0.0.0.0", "::") else "127.0.0.1",
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(worker_cuda_env(spec.gpu_indices))
    env.update(spec.env)
    env[WORKER_MARKER_ENV] = str(spec.work_dir)
    return env


WORKER_MARKER_ENV = "GK_WORKER"
"""Set in every worker's environment (last, so ``worker_env`` cannot override it) to the
worker's work directory, ``STATE_DIR/work/ID``: a restarted sidecar finds by it a worker
whose record was never written (killed between spawn and record) and stops it."""


def marked_workers(work_root: Path, proc: Path = Path("/proc")) -> dict[int, str]:
    """Process-group leaders carrying the worker marker of a directory under
    ``work_root``: pid -> worker id. Processes of other users are not readable and skipped."""
    root = str(work_root)
    found: dict[int, str] = {}
    for entry in proc.glob("[0-9]*"):
        try:
            pid = int(entry.name)
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != pid:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        prefix = f"{WORKER_MARKER_ENV}=".encode()
        for item in environ:
            if item.startswith(prefix):
                work_dir = Path(item[len(prefix) :].decode("utf-8", "replace"))
                if str(work_dir.parent) == root:
                    found[pid] = work_dir.name
                break
    return found


def rotate_logs(path: Path, generations: int = LOG_GENERATIONS) -> None:
    """``worker.log`` -> ``worker.log.1`` -> … keeping ``generations`` old files."""
    for n in range(generations, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        newer = path if n == 1 else path.with_name(f"{path.name}.{n - 1}")
        if newer.exists():
            os.replace(newer, older)


class WorkerProcess:
    """A running worker: its pid, its log, and an event set when it exits."""

    def __init__(self, spec: LaunchSpec, pid: int, *, child: bool) -> None:
        self.spec = spec
        self.pid = pid
        self.child = child
        """True for a worker this process spawned (its exit code can be read)."""
        self.returncode: int | None = None
        self.exited = asyncio.Event()
        self._log_offset = 0
        self._startup = StartupLog()
        self._watch = asyncio.get_running_loop().create_task(self._watch_exit())

    @classmethod
    async def start(cls, spec: LaunchSpec, base_env: Mapping[str, str]) -> WorkerProcess:
        (spec.work_dir / "cache").mkdir(parents=True, exist_ok=True)
        scratch_dir(spec.worker_id).mkdir(parents=True, exist_ok=True)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        rotate_logs(spec.log_path)
        try:
            pid = spawn(worker_argv(spec), worker_environment(spec, base_env), spec.log_path)
        except OSError as e:
            raise WorkerStartError(
                f"worker {spec.worker_id}: cannot run {spec.command[0]!r} ({e.strerror}); "
                "install vLLM or set GATEKEEPER_WORKER_COMMAND",
                field="worker_command",
                value=" ".join(spec.command),
            ) from e
        return cls(spec, pid, child=True)

    @classmethod
    def adopt(cls, spec: LaunchSpec, pid: int) -> WorkerProcess:
        """Watch a worker an earlier sidecar started (it is not our child)."""
        return cls(spec, pid, child=False)

    async def _watch_exit(self) -> None:
        self.returncode = await _wait_pid(self.pid, reap=self.child)
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
        """SIGTERM to the process group, then SIGKILL after ``grace_seconds``. SIGCONT
        follows the SIGTERM (as systemd sends it): a worker stopped with SIGSTOP (a frozen
        one taken out by the liveness probes) handles its SIGTERM now instead of sitting
        out the whole grace period holding its GPU memory; a running one ignores it."""
        if self.alive:
            _signal_group(self.pid, signal.SIGTERM)
            _signal_group(self.pid, signal.SIGCONT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited.wait(), grace_seconds)
        # Children (engine core, TP workers) may outlive the leader: kill what is left of
        # the group (checked first, so a reused group id is never signalled).
        if process_group_alive(self.pid):
            _signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.exited.wait(), grace_seconds)
        # SIGKILL is delivered, not yet done: return only once the group is gone (bounded),
        # so "stopped" means no process of the worker is left holding its GPU memory
        deadline = asyncio.get_running_loop().time() + grace_seconds
        while process_group_alive(self.pid) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.gather(self._watch, return_exceptions=True)
        shutil.rmtree(scratch_dir(self.spec.worker_id), ignore_errors=True)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def scratch_dir(worker_id: str) -> Path:
    """The worker's TMPDIR: short (vLLM puts IPC sockets there, and a socket path is
    limited to 107 bytes), derived from the worker id so an adopting sidecar finds it,
    and removed when the worker stops."""
    tag = "".join(c for c in worker_id if c.isalnum())[-12:]
    return Path(tempfile.gettempdir()) / f"gk-{tag}"


def spawn(argv: list[str], env: Mapping[str, str], log_path: Path) -> int:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``.

    ``posix_spawn`` rather than ``subprocess``: the worker must be able to outlive this
    process (adoption), and no Python object should own it.
    """
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, log, 1),
            (os.POSIX_SPAWN_DUP2, log, 2),
            (os.POSIX_SPAWN_CLOSE, log),
        ]
        return os.posix_spawnp(argv[0], argv, dict(env), file_actions=actions, setsid=True)
    finally:
        os.close(log)


async def _wait_pid(pid: int, *, reap: bool) -> int | None:
    """Return when ``pid`` exits (a pidfd, so no polling), with its exit code when it is
    our child (negative: killed by that signal)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
        if not reap:
            return None
        try:
            info = os.waitid(os.P_PIDFD, fd, os.WEXITED)
        except ChildProcessError:
            return None
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def process_group_alive(pgid: int, proc: Path = Path("/proc")) -> bool:
    """True while a live (not zombie) process belongs to process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False
