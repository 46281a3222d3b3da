"""``gatekeeper serve --log-format json`` (``GATEKEEPER_LOG_FORMAT=json``) writes one JSON
object a line, with time, level, logger and message, and a deployment's id and model on
its lines (#31 item 10). A real ``gatekeeper serve --rehearsal`` process, driven by the
real operator commands, its output read back line by line."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import ctrl_c_reaches_children, interrupt

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"
MODEL = "Qwen/Qwen3-0.6B"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "gatekeeper serve exited"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("gatekeeper serve did not answer /healthz")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GATEKEEPER), *args], capture_output=True, text=True, timeout=120, env=env
    )


def parsed(path: Path) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # each line one object, or this fails


def test_every_line_is_json_and_a_deploys_lines_carry_its_id_and_model(tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    port = free_port()
    env = {
        **clean,
        "GATEKEEPER_STATE_DIR": str(tmp_path),
        "GATEKEEPER_LOG_FORMAT": "json",
        "GATEKEEPER_NO_SUCH_SETTING": "1",  # its warning comes before logging starts
    }
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as o, err.open("w") as e, ctrl_c_reaches_children():
        serve = subprocess.Popen(
            [str(GATEKEEPER), "serve", "--rehearsal", "--port", str(port)],
            stdout=o,
            stderr=e,
            text=True,
            env=env,
            process_group=0,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, serve)
            operator = {**clean, "GATEKEEPER_STATE_DIR": str(tmp_path)}
            deploy = run(operator, "deploy", MODEL, "--max-model-len", "2k", "--wait", "--json",
                         "--url", url)  # fmt: skip
            assert deploy.returncode == 0, deploy.stderr
            deployment_id = json.loads(deploy.stdout)["deployment"]["id"]
            assert run(operator, "undeploy", deployment_id, "--url", url).returncode == 0
        finally:
            interrupt(serve, timeout=60)
    records = parsed(out) + parsed(err)
    for r in records:
        assert {"time", "level", "logger", "message"} <= set(r), r
        assert datetime.fromisoformat(r["time"]).utcoffset() is not None
    assert any(r["level"] == "WARNING" and "GATEKEEPER_NO_SUCH_SETTING" in r["message"]
               for r in records)  # fmt: skip
    assert any(r["message"].startswith("gatekeeper sidecar on") for r in records)  # the banner
    mine = [r for r in records if r.get("deployment_id") == deployment_id]
    assert all(r["model"] == MODEL for r in mine)
    said = " ".join(r["message"] for r in mine)
    for state in ("admitted", "launching", "ready", "stopped"):
        assert state in said, said


def test_text_stays_the_default(tmp_path: Path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    with ctrl_c_reaches_children():
        serve = subprocess.Popen(
            [str(GATEKEEPER), "serve", "--rehearsal", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**clean, "GATEKEEPER_STATE_DIR": str(tmp_path)},
            process_group=0,
        )
    assert serve.stdout is not None
    try:
        first = serve.stdout.readline()
    finally:
        interrupt(serve, timeout=60)
        serve.stdout.close()
    assert first.startswith("gatekeeper sidecar on http://")


def test_the_webhook_logs_json_too_uvicorns_lines_included(tmp_path: Path):
    from tests.support.tls_certs import issue, make_ca

    ca = make_ca(tmp_path)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    issue(ca, cert, key)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    port = free_port()
    out = tmp_path / "output"
    with out.open("w") as o, ctrl_c_reaches_children():
        webhook = subprocess.Popen(
            [str(GATEKEEPER), "webhook", "--cert", str(cert), "--key", str(key),
             "--host", "127.0.0.1", "--port", str(port), "--log-format", "json"],
            stdout=o, stderr=subprocess.STDOUT, text=True, process_group=0,
            env={**clean, "GATEKEEPER_STATE_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            url = f"https://127.0.0.1:{port}"
            context = ssl.create_default_context(cafile=str(ca.path))
            client = httpx.Client(base_url=url, verify=context, timeout=5)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            client.close()
            # a request line uvicorn cannot parse: its own warning (uvicorn.error)
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                tls.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                with contextlib.suppress(OSError):
                    tls.recv(1024)
            time.sleep(0.5)
        finally:
            interrupt(webhook, timeout=30)
    records = parsed(out)
    assert any(r["message"].startswith("gatekeeper admission webhook on https://") for r in records)
    assert any(r["logger"].startswith("uvicorn") for r in records), records
