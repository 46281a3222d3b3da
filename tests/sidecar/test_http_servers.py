"""``http_server`` on the real ``gatekeeper serve --rehearsal``: under each server it binds
``--port 0`` and says the port, proxies a chat completion (launching the model), names
the limits it lacks in one warning line at start, and on Ctrl-C runs the app's lifespan
down (its simulator stopped); granian's own head bound answers 431; a server that is not
one is refused with the choices."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gatekeeper.settings import Settings
from gatekeeper.sidecar.http_servers import missing_limits
from gatekeeper.sidecar.launcher import process_group_alive
from tests.support.processes import ctrl_c_reaches_children, end_group, interrupt

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"
CHAT = {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}]}


def _env(tmp_path: Path, server: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    return {**clean, "GATEKEEPER_STATE_DIR": str(tmp_path), "GATEKEEPER_HTTP_SERVER": server}


def _start(tmp_path: Path, server: str) -> tuple[subprocess.Popen[str], str, Path]:
    log = tmp_path / "serve.log"
    with log.open("w") as out, ctrl_c_reaches_children():
        process = subprocess.Popen(
            [str(GATEKEEPER), "serve", "--rehearsal", "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(tmp_path, server),
            process_group=0,
        )
    try:
        return (process, _wait_serving(process, log), log)
    except BaseException:
        end_group(process)  # a start that failed or timed out leaves nothing running
        raise


def _wait_serving(process: subprocess.Popen[str], log: Path) -> str:
    deadline = time.monotonic() + 60
    while not (found := re.search(r"sidecar on (http://127\.0\.0\.1:\d+)", log.read_text())):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    url = found.group(1)
    assert not url.endswith(":0"), "the banner names the port bound, not 0"
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def _stop(process: subprocess.Popen[str]) -> int:
    return interrupt(process, timeout=60)


@pytest.mark.parametrize(
    ("server", "missing"),
    [
        ("gatekeeper", None),
        ("uvicorn", ["max_request_head_bytes", "request_header_timeout_seconds"]),
        ("granian", ["request_body_timeout_seconds", "request_body_total_seconds"]),
    ],
)
def test_serve_proxies_under_each_server_and_names_what_it_lacks(
    tmp_path: Path, server: str, missing: list[str] | None
) -> None:
    process, url, log = _start(tmp_path, server)
    pid = None
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 4}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        token = (tmp_path / "rehearsal" / "admin-token").read_text().strip()
        listed = httpx.get(
            f"{url}/admin/deployments", headers={"Authorization": f"Bearer {token}"}
        ).json()["deployments"]
        pid = int(listed[0]["pid"])
        assert _stop(process) == 130, log.read_text()  # Ctrl-C, as uvicorn ends on it
        assert not process_group_alive(pid), "the app's lifespan did not stop its worker"
        warnings = [line for line in log.read_text().splitlines() if "http_server = " in line]
        if missing is None:
            assert warnings == [], warnings
        else:
            assert len(warnings) == 1, log.read_text()
            assert all(name in warnings[0] for name in missing), warnings[0]
            assert "set http_server = gatekeeper" in warnings[0]
    finally:
        _stop(process)
        if pid is not None and process_group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_granian_answers_an_endless_head_431_at_its_buffer(tmp_path: Path) -> None:
    process, url, log = _start(tmp_path, "granian")
    try:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            line = b"X-Filler: " + b"a" * 1000 + b"\r\n"
            try:
                for _ in range(1000):  # 1 MB, far past max_request_head_bytes (32768)
                    s.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before all of it was sent
            answer = s.recv(200)
        assert answer.startswith(b"HTTP/1.1 431 "), answer
    finally:
        assert _stop(process) == 130, log.read_text()


def test_a_server_that_is_not_one_is_refused_with_the_choices(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(GATEKEEPER), "serve", "--rehearsal", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path, "nginx"),
    )
    assert done.returncode == 2, done.stderr
    assert "GATEKEEPER_HTTP_SERVER='nginx'" in done.stderr
    assert "'gatekeeper', 'uvicorn' or 'granian'" in done.stderr
    assert "Traceback" not in done.stderr


def test_granians_own_range_is_said_where_it_moves_a_setting() -> None:
    moved = Settings(
        http_server="granian", request_header_timeout_seconds=120, max_request_head_bytes=4096
    )
    line = missing_limits(moved)
    assert line is not None
    assert "request_header_timeout_seconds is its most, 60" in line
    assert "max_request_head_bytes is its least, 8192" in line
    kept = missing_limits(Settings(http_server="granian"))
    assert kept is not None and "its most" not in kept and "its least" not in kept
    assert missing_limits(Settings(http_server="gatekeeper")) is None
