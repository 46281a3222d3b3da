"""``gatekeeper serve``'s banner names where the admin token really came from (#14): the
environment variable, the settings file, a rehearsal's earlier file, or a token it
generated and wrote; never the token itself. The installed command runs in a
subprocess with ``--json`` (the banner as one JSON object) and is stopped after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import ctrl_c_reaches_children, end_group

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"
SECRET = "banner-test-token-1234"


def _serving(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/healthz", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.05)


def banner(*args: str, env: dict[str, str]) -> dict[str, Any]:
    """The JSON banner of ``gatekeeper serve ARGS --json``, the sidecar then stopped."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    with ctrl_c_reaches_children():
        process = subprocess.Popen(
            [str(GATEKEEPER), *args, "--port", "0", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**clean, **env},
            process_group=0,
        )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.rstrip() == "}":
                break
        # Ctrl-C once the server answers: a SIGINT that lands while the main thread is
        # still importing can be swallowed by Python's import machinery ("Exception
        # ignored in _get_module_lock.cb"), and the process then never sees it
        _serving(json.loads("".join(lines))["url"], process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            end_group(process)  # and its pipes closed, not left to a later test's collection
            _, stderr = process.communicate()
            raise AssertionError(f"serve did not stop on SIGINT within 30 s: {stderr}") from None
    text = "".join(lines)
    assert text, stderr
    assert SECRET not in text + stderr
    payload: dict[str, Any] = json.loads(text)
    return payload


def test_the_token_from_the_environment(tmp_path: Path):
    env = {
        "GATEKEEPER_STATE_DIR": str(tmp_path),
        "GATEKEEPER_GPUS": "1xL4",
        "GATEKEEPER_ADMIN_TOKEN": SECRET,
    }
    shown = banner("serve", env=env)
    assert shown["admin_token_source"] == "environment variable GATEKEEPER_ADMIN_TOKEN"
    assert "admin token: environment variable GATEKEEPER_ADMIN_TOKEN" in shown["lines"]
    assert shown["rehearsal"] is False and shown["declared_node"] == "1xL4"


def test_the_token_from_the_settings_file(tmp_path: Path):
    config = tmp_path / "gatekeeper.toml"
    config.write_text(f'admin_token = "{SECRET}"\ngpus = "1xL4"\n')
    shown = banner("--config", str(config), "serve", env={"GATEKEEPER_STATE_DIR": str(tmp_path)})
    assert shown["admin_token_source"] == f"settings file {str(config)!r} (admin_token)"
    assert "GATEKEEPER_ADMIN_TOKEN" not in " ".join(shown["lines"])


def test_the_environment_wins_over_the_file_and_the_banner_says_so(tmp_path: Path):
    config = tmp_path / "gatekeeper.toml"
    config.write_text('admin_token = "from-the-file"\ngpus = "1xL4"\n')
    env = {"GATEKEEPER_STATE_DIR": str(tmp_path), "GATEKEEPER_ADMIN_TOKEN": SECRET}
    shown = banner("--config", str(config), "serve", env=env)
    assert shown["admin_token_source"] == "environment variable GATEKEEPER_ADMIN_TOKEN"


def test_a_rehearsal_generates_a_token_then_keeps_it(tmp_path: Path):
    env = {"GATEKEEPER_STATE_DIR": str(tmp_path)}
    token_file = tmp_path / "rehearsal" / "admin-token"
    first = banner("serve", "--rehearsal", env=env)
    assert first["admin_token_source"] == f"generated and written to {token_file}"
    assert first["rehearsal"] is True and any(
        line.startswith("REHEARSAL") for line in first["lines"]
    )
    token = token_file.read_text()
    second = banner("serve", "--rehearsal", env=env)
    assert second["admin_token_source"] == f"kept from an earlier rehearsal in {token_file}"
    assert token_file.read_text() == token
    given = banner("serve", "--rehearsal", env={**env, "GATEKEEPER_ADMIN_TOKEN": SECRET})
    assert given["admin_token_source"] == (
        f"environment variable GATEKEEPER_ADMIN_TOKEN, written to {token_file}"
    )
    assert token_file.read_text() == SECRET


def test_without_a_token_the_admin_api_is_off(tmp_path: Path):
    shown = banner("serve", env={"GATEKEEPER_STATE_DIR": str(tmp_path), "GATEKEEPER_GPUS": "1xL4"})
    assert shown["admin_api"] is False and shown["admin_token_source"] is None
    assert "admin API off: set GATEKEEPER_ADMIN_TOKEN to turn it on" in shown["lines"]
