"""``gatekeeper serve`` with its port already taken, as an operator meets it: the installed
command in a subprocess, a model set to preload, another socket holding the port. It ends
with exit code 2 and one line naming the address and what to do, and no worker is left
running (before the fix, uvicorn bound the port only after the lifespan had launched the
preloaded worker, and the failed bind left it running)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.sidecar_harness import free_port_block

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"


def simulators_for(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "gatekeeper.simulator" in cmdline and (marker in cmdline or marker in environ):
            found.append(int(entry.name))
    return found


def test_a_taken_port_ends_serve_before_any_worker_is_launched(tmp_path: Path):
    base = free_port_block()
    config = tmp_path / "gatekeeper.toml"
    config.write_text(
        f"worker_port_min = {base + 1}\nworker_port_max = {base + 19}\n"
        'worker_env = { GATEKEEPER_SIM_STARTUP_SECONDS = "0.2" }\n'
        '[[models]]\nname = "tiny"\nmodel = "Qwen/Qwen3-0.6B"\npreload = true\n'
        "options = { max_model_len = 4096 }\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env = {**clean, "GATEKEEPER_STATE_DIR": str(tmp_path / "state")}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base))
        holder.listen(1)
        out = subprocess.run(
            [
                str(GATEKEEPER),
                "--config",
                str(config),
                "serve",
                "--rehearsal",
                "--host",
                "127.0.0.1",
                "--port",
                str(base),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    assert f"cannot listen on 127.0.0.1:{base}" in out.stderr, out.stderr
    assert "--port" in out.stderr, out.stderr
    time.sleep(0.5)  # a worker launched just before the exit would show by now
    assert simulators_for(str(tmp_path)) == [], "a worker was left running"
    assert simulators_for(f"--port {base + 1}") == []
