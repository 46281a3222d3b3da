"""The leftovers of #27 (item 8), each on the real thing: Ctrl-C on a real ``gatekeeper
serve --rehearsal`` stops its simulator workers (or its banner says they keep running and
how to stop them); a log offset past any file is a 400; a ``block_size`` vLLM refuses is
refused at the admin door; names that are not names are refused with what a name may
hold; an unknown preloaded model ends ``serve`` with one line and exit code 2."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import serve_process
from gatekeeper.sidecar.launcher import process_group_alive
from tests.support.processes import ctrl_c_reaches_children, interrupt
from tests.support.sidecar_harness import free_port_block, running_sidecar, settings_for


@contextlib.contextmanager
def _serve(tmp_path: Path, *, keep: bool) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The installed ``gatekeeper serve --rehearsal`` (``bench.serve_process.sidecar``),
    its simulator workers kept when it exits if ``keep``; its log is ``sidecar.log``."""
    port = free_port_block(100)  # and its workers' ports after it
    with (
        ctrl_c_reaches_children(),  # the Ctrl-C below reaches it in a suite that ignores it
        serve_process.sidecar(
            tmp_path, port, preload=False, worker_env="{}", rehearsal=True, keep_workers=keep
        ) as process,
    ):
        yield process, f"http://127.0.0.1:{port}"


def _deploy_ready(url: str) -> int:
    headers = {"Authorization": f"Bearer {serve_process.TOKEN}"}
    body = {"model": "Qwen/Qwen3-0.6B", "options": {"max_model_len": 4096}}
    r = httpx.post(f"{url}/admin/deployments", json=body, headers=headers, timeout=60)
    assert r.status_code == 201, r.text
    deployment_id = r.json()["deployment"]["id"]
    deadline = time.monotonic() + 60
    while True:
        d = httpx.get(f"{url}/admin/deployments/{deployment_id}", headers=headers).json()
        if d["state"] == "ready":
            return int(d["pid"])
        assert time.monotonic() < deadline, d
        time.sleep(0.1)


@pytest.mark.parametrize("keep", [False, True], ids=["stops", "keeps-and-says-so"])
def test_ctrl_c_on_a_rehearsal_stops_its_simulators_or_says_they_keep_running(
    tmp_path: Path, keep: bool
) -> None:
    pid = None
    try:
        with _serve(tmp_path, keep=keep) as (process, url):
            pid = _deploy_ready(url)
            interrupt(process, timeout=60)  # exited: the block's end has nothing to stop
        out = (tmp_path / "sidecar.log").read_text()
        if keep:
            assert "workers keep running when the sidecar exits" in out, out
            assert "gatekeeper undeploy ID" in out
            assert process_group_alive(pid), "kept, as the banner said"
        else:
            assert "workers are stopped when the sidecar exits (Ctrl-C)" in out, out
            assert not process_group_alive(pid), "Ctrl-C left the simulator running"
    finally:
        if pid is not None and process_group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_an_unknown_preloaded_model_ends_serve_with_one_line_and_exit_code_2(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gatekeeper.toml"
    config.write_text(
        '[[models]]\nname = "ghost"\nmodel = "nobody/no-such-model-xyz"\npreload = true\n'
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env = {**clean, "GATEKEEPER_CONFIG_FILE": str(config), "GATEKEEPER_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [
            *serve_process.gatekeeper_command(),
            "serve",
            "--rehearsal",
            "--port",
            str(free_port_block()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "preloaded model 'ghost'" in lines[0] and "nobody/no-such-model-xyz" in lines[0]
    assert "preload = false" in lines[0]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_sidecar(settings_for(tmp_path_factory.mktemp("leftovers"))) as sc:
        yield sc


def test_a_log_offset_past_any_file_is_a_400_that_says_what_to_send(sidecar: Any) -> None:
    r = sidecar.admin.post("/admin/deployments", json={"model": "tiny"})
    assert r.status_code == 201, r.text
    deployment_id = r.json()["deployment"]["id"]
    for offset in (str(10**23), str(2**63), "9" * 5000, "x"):
        bad = sidecar.admin.get(f"/admin/deployments/{deployment_id}/log?offset={offset}")
        assert bad.status_code == 400, (offset[:30], bad.text)
        error = bad.json()["error"]
        assert error["field"] == "offset" and "send ?offset=0 first" in error["message"]
    for offset in ("0", str(2**63 - 1), "-5"):
        ok = sidecar.admin.get(f"/admin/deployments/{deployment_id}/log?offset={offset}")
        assert ok.status_code == 200, ok.text
    assert sidecar.admin.delete(f"/admin/deployments/{deployment_id}").status_code == 200


@pytest.mark.parametrize("block_size", [7, 8, 24, 100])
def test_a_block_size_no_vllm_attention_backend_takes_is_refused(
    sidecar: Any, block_size: int
) -> None:
    body = {"model": "tiny", "name": "blocks", "options": {"block_size": block_size}}
    r = sidecar.admin.post("/admin/deployments", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["field"] == "block_size" and error["value"] == block_size
    assert "multiple of 16" in error["message"] and "16, 32, 64 or 128" in error["message"]


@pytest.mark.parametrize(
    "name", ["--x", "-x", "a\u0000b", "a\r\nX-Evil: 1", "a b", "", "x" * 257, "é"]
)
def test_a_name_that_is_not_a_name_is_refused_with_what_a_name_may_hold(
    sidecar: Any, name: str
) -> None:
    r = sidecar.admin.post("/admin/deployments", json={"model": "tiny", "name": name})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["field"] == "name", error
    if name and len(name) <= 256:
        assert "letters A-Z and a-z, digits and . _ / : @ + -" in error["message"], error
    listed = sidecar.admin.get("/admin/deployments").json()["deployments"]
    assert all(d["name"] != name for d in listed), "nothing was deployed under it"


def test_names_of_the_usual_shapes_are_deployed(sidecar: Any) -> None:
    for name in ("llama-8b", "Qwen/Qwen3-0.6B:v2", "team@a.b+c_1"):
        r = sidecar.admin.post("/admin/deployments", json={"model": "tiny", "name": name})
        assert r.status_code == 201, r.text
        assert sidecar.admin.delete(f"/admin/deployments/{r.json()['deployment']['id']}")
