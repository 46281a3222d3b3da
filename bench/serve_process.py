"""``gatekeeper serve`` as operators run it, for the benches: the installed command in a
subprocess on a declared node (``2xH100-80GB``), the simulator as its worker, one model
``tiny`` (Qwen/Qwen3-0.6B), a state directory of its own."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from gatekeeper.sidecar import ledger_path

TOKEN = "bench-token"
SIMULATOR = [sys.executable, "-m", "gatekeeper.simulator", "serve"]


def gatekeeper_command() -> list[str]:
    found = shutil.which("gatekeeper") or str(Path(sys.executable).parent / "gatekeeper")
    return [found] if Path(found).exists() else [sys.executable, "-m", "gatekeeper"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=base, timeout=5) as probe:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"gatekeeper serve exited {proc.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if probe.get("/healthz").status_code == 200:
                    return
            time.sleep(0.1)
    raise SystemExit(f"gatekeeper serve did not answer /healthz in 60 s:\n{log.read_text()}")


@contextlib.contextmanager
def sidecar(
    work: Path,
    port: int,
    *,
    preload: bool,
    worker_env: str,
    gpus: str = "2xH100-80GB",
    extra: str = "",
    rehearsal: bool = False,
    http_server: str = "gatekeeper",
    keep_workers: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run it, once its ``/healthz`` answers, until the block ends (SIGTERM, so it stops
    its workers, unless ``keep_workers``); ``worker_env`` is
    a TOML inline table of the simulator's ``GATEKEEPER_SIM_*`` variables, ``extra`` more
    top-level TOML settings lines; ``rehearsal`` adds ``--rehearsal`` (state under
    ``state/rehearsal``, the settings' node, token and models kept); ``http_server`` is
    the setting of that name."""
    config = work / "gatekeeper.toml"
    config.write_text(
        f"worker_port_min = {port + 1}\nworker_port_max = {port + 99}\n"
        f"worker_command = {json.dumps(SIMULATOR)}\n"
        f'gpus = "{gpus}"\nallowed_models = ["Qwen/*"]\n'
        f"stop_workers_on_exit = {'false' if keep_workers else 'true'}\n"
        f'http_server = "{http_server}"\n'
        f"worker_env = {worker_env}\n{extra}"
        '[[models]]\nname = "tiny"\nmodel = "Qwen/Qwen3-0.6B"\n'
        f"preload = {'true' if preload else 'false'}\n"
        "options = { max_model_len = 4096 }\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env = {**clean, "GATEKEEPER_STATE_DIR": str(work / "state"), "GATEKEEPER_ADMIN_TOKEN": TOKEN}
    argv = [*gatekeeper_command(), "--config", str(config), "serve", "--port", str(port)]
    argv += ["--rehearsal"] if rehearsal else []
    with (work / "sidecar.log").open("ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", work / "sidecar.log")
        yield proc
    finally:
        stop(proc, 60)


def adopting_state(leader: Path, follower: Path) -> None:
    """Give the state directory ``follower`` the deployment records and the ledger of the
    rehearsal under ``leader``, so that a sidecar started on it adopts the leader's
    workers (as a restarted sidecar does) and proxies to the same processes."""
    source, target = leader / "rehearsal", follower / "rehearsal"
    # the records' directory, as the deployment manager names it
    shutil.copytree(source / "deployments", target / "deployments")
    with (
        contextlib.closing(sqlite3.connect(ledger_path(source))) as given,
        contextlib.closing(sqlite3.connect(ledger_path(target))) as taken,
    ):
        given.backup(taken)


def stop(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """SIGTERM, and SIGKILL if it is still running ``seconds`` later."""
    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
