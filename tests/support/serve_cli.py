"""The installed ``gatekeeper serve`` in a subprocess, as operators run it, for tests of
its HTTP edge: a declared node, the simulator as the worker, settings from a TOML file
of the test's, and a state directory of its own, in a process group of its own. SIGTERM
to the group at the end (it stops its workers), SIGKILL 30 s later, even when the test
failed or was cut short by its timeout; the log is kept for assertion messages."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from gatekeeper.sidecar.rehearsal import SIMULATOR
from tests.support.processes import end_group
from tests.support.sidecar_harness import free_port_block

__all__ = ["ServeProcess", "serve_process"]

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"
TOKEN = "serve-cli-token"


@dataclass(frozen=True)
class ServeProcess:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _toml(value: object) -> str:
    return json.dumps(value)  # strings, numbers, lists and booleans read the same in TOML


@contextlib.contextmanager
def serve_process(work: Path, **settings: object) -> Iterator[ServeProcess]:
    """``gatekeeper --config FILE serve`` on a free port, once ``/healthz`` answers; the
    keyword arguments are more top-level settings (``api_keys=["k"]``, ...)."""
    base = free_port_block()
    lines = {
        "worker_port_min": base + 1,
        "worker_port_max": base + 19,
        "worker_command": list(SIMULATOR),
        "gpus": "2xH100-80GB",
        "allowed_models": ["Qwen/*"],
        "stop_workers_on_exit": True,
        "startup_timeout_seconds": 30.0,
        **settings,
    }
    config = work / "gatekeeper.toml"
    config.write_text(
        "".join(f"{k} = {_toml(v)}\n" for k, v in lines.items())
        + '[[models]]\nname = "tiny"\nmodel = "Qwen/Qwen3-0.6B"\n'
        + "options = { max_model_len = 4096 }\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env = {**clean, "GATEKEEPER_STATE_DIR": str(work / "state"), "GATEKEEPER_ADMIN_TOKEN": TOKEN}
    log = work / "serve.log"
    argv = [str(GATEKEEPER), "--config", str(config), "serve", "--port", str(base)]
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0
        )
    served = ServeProcess(process, f"http://127.0.0.1:{base}", base, log)
    try:
        _wait_healthy(served)
        yield served
    finally:
        end_group(process, 30)


def _wait_healthy(served: ServeProcess) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert served.process.poll() is None, served.log_text()
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{served.url}/healthz", timeout=1).status_code == 200:
                return
        assert time.monotonic() < deadline, f"gatekeeper serve did not answer:\n{served.log_text()}"
        time.sleep(0.1)
