"""The same exit codes on every command, and ``--json`` errors as one JSON object (#14).

The installed ``gatekeeper`` command runs in a subprocess against a real sidecar on
127.0.0.1 (the simulator as its worker), against a closed port and a server that never
answers (exit code 3), and offline for the commands that need no sidecar. Every
``--json`` run is read with ``json.loads``; an error's object carries the same exit code
the process ended with."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.sidecar_harness import TOKEN, Sidecar, running_sidecar, settings_for

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"


def gatekeeper(*args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    if state is not None:
        env["GATEKEEPER_STATE_DIR"] = str(state)
    return subprocess.run(
        [str(GATEKEEPER), *args], capture_output=True, text=True, timeout=120, env=env
    )


def json_error(out: subprocess.CompletedProcess[str], code: str, exit_code: int) -> dict[str, Any]:
    """The one JSON object an error printed, checked against the process's exit code."""
    assert out.returncode == exit_code, (out.returncode, out.stdout, out.stderr)
    payload: dict[str, Any] = json.loads(out.stdout)
    assert payload["exit_code"] == exit_code
    assert payload["error"]["code"] == code, payload
    assert payload["error"]["message"] and "Traceback" not in out.stdout + out.stderr
    return payload


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    state = tmp_path_factory.mktemp("sidecar")
    with running_sidecar(settings_for(state)) as sidecar:
        yield sidecar


@pytest.fixture(scope="module")
def client(sc: Sidecar) -> tuple[str, ...]:
    return ("--url", sc.url, "--token", TOKEN)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- 0 and 1 ---------------------------------------------------------------------------


def test_deploy_ps_undeploy_exit_0_and_print_json(sc: Sidecar, client: tuple[str, ...]):
    out = gatekeeper("deploy", "tiny", "--name", "zero", "--max-model-len", "2k", *client, "--json")
    assert out.returncode == 0, out.stderr
    deployed = json.loads(out.stdout)
    assert deployed["deployment"]["name"] == "zero" and deployed["decision"]["admitted"]
    listed = gatekeeper("ps", *client, "--json")
    assert listed.returncode == 0, listed.stderr
    ids = [d["id"] for d in json.loads(listed.stdout)["deployments"]]
    assert deployed["deployment"]["id"] in ids
    stopped = gatekeeper("undeploy", deployed["deployment"]["id"], *client, "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["deployment"]["id"] == deployed["deployment"]["id"]


def test_a_deployment_that_does_not_fit_exits_1_with_the_decision(client: tuple[str, ...]):
    args = ("deploy", "meta-llama/Llama-3.3-70B-Instruct", "--max-model-len", "131072", *client)
    human = gatekeeper(*args)
    assert human.returncode == 1 and "507" in human.stderr and human.stdout.strip() == ""
    payload = json_error(gatekeeper(*args, "--json"), "does_not_fit", 1)
    assert payload["decision"]["admitted"] is False and payload["decision"]["reasons"]


def test_a_name_already_deployed_is_refused_with_1(sc: Sidecar, client: tuple[str, ...]):
    first = gatekeeper("deploy", "tiny", "--name", "taken", "--max-model-len", "2k", *client)
    assert first.returncode == 0, first.stderr
    again = gatekeeper("deploy", "tiny", "--name", "taken", "--max-model-len", "2k", *client)
    json_again = gatekeeper(
        "deploy", "tiny", "--name", "taken", "--max-model-len", "2k", *client, "--json"
    )
    for d in sc.admin.get("/admin/deployments").json()["deployments"]:
        sc.admin.delete(f"/admin/deployments/{d['id']}")
    assert again.returncode == 1 and "409" in again.stderr
    json_error(json_again, "deployment_error", 1)


def test_a_model_the_node_does_not_allow_is_refused_with_1(client: tuple[str, ...]):
    json_error(gatekeeper("deploy", "mistralai/Nope-7B", *client, "--json"), "model_not_allowed", 1)


def test_estimate_check_and_plan_exit_1_when_it_does_not_fit(tmp_path: Path):
    big = "meta-llama/Llama-3.1-70B-Instruct"
    assert gatekeeper("estimate", big, "--gpu", "L4").returncode == 1
    simple = gatekeeper("estimate", big, "--gpu", "L4", "--method", "simple")
    assert simple.returncode == 1 and "DOES NOT FIT" in simple.stdout
    check = gatekeeper("check", big, "--node", "1xL4", "--json", state=tmp_path)
    assert check.returncode == 1 and json.loads(check.stdout)["admitted"] is False
    fits = gatekeeper("check", "Qwen/Qwen3-0.6B", "--node", "1xL4", "--json", state=tmp_path)
    assert fits.returncode == 0 and json.loads(fits.stdout)["admitted"] is True


# -- 2 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["estimate"], "usage"),  # argparse: the model is missing
        (["ps", "--no-such-option"], "usage"),
        (["estimate", "nosuch/model"], "model"),
        (["estimate", "Qwen/Qwen3-8B", "--max-modle-len", "4096"], "serve_options"),
        (["estimate", "Qwen/Qwen3-8B", "--gpu", "TPU-v5"], "unknown_gpu"),
        (["check", "Qwen/Qwen3-8B", "--node", "3xNOPE"], "bad_input"),
        (["gpus", "--node", "3xNOPE"], "bad_input"),
        (["plan", "/nonexistent/plan.toml"], "bad_input"),
        (["webhook", "--cert", "/nonexistent.crt", "--key", "/nonexistent.key"], "bad_input"),
    ],
)
def test_bad_input_exits_2_on_every_command(tmp_path: Path, args: list[str], code: str):
    human = gatekeeper(*args, state=tmp_path)
    assert human.returncode == 2, (human.stdout, human.stderr)
    assert human.stderr.startswith("gatekeeper: error: ") and human.stdout == ""
    assert len(human.stderr.strip().splitlines()) == 1, human.stderr
    payload = json_error(gatekeeper(*args, "--json", state=tmp_path), code, 2)
    assert payload["error"]["message"] in human.stderr


def test_serve_on_a_port_already_taken_exits_2(tmp_path: Path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = str(holder.getsockname()[1])
        human = gatekeeper("serve", "--rehearsal", "--port", port, state=tmp_path)
        as_json = gatekeeper("serve", "--rehearsal", "--port", port, "--json", state=tmp_path)
    assert human.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in human.stderr
    assert json_error(as_json, "bad_input", 2)["error"]["field"] == "port"


def test_bad_settings_exit_2_with_json(tmp_path: Path):
    config = tmp_path / "gatekeeper.toml"
    config.write_text("prot = 18123\n")
    out = gatekeeper("--config", str(config), "ps", "--json", state=tmp_path)
    payload = json_error(out, "settings", 2)
    assert "did you mean 'port'?" in payload["error"]["message"]


@pytest.mark.parametrize(
    ("args", "status", "code"),
    [
        (["deploy", "Qwen/Nosuch-1B"], 400, "bad_request"),  # allowed by pattern, found nowhere
        (
            ["deploy", "tiny", "--name", "t", "--kv-offloading-backend", "lmcache"],
            400,
            "bad_request",
        ),
        (["undeploy", "no-such-deployment"], 404, "deployment_error"),
    ],
)
def test_what_the_sidecar_finds_wrong_exits_2(
    client: tuple[str, ...], args: list[str], status: int, code: str
):
    human = gatekeeper(*args, *client)
    assert human.returncode == 2 and f"gatekeeper: error: {status}: " in human.stderr
    payload = json_error(gatekeeper(*args, *client, "--json"), code, 2)
    assert payload["error"]["field"] in ("model", "kv_offloading_backend", "id"), payload


def test_a_wrong_token_exits_2(sc: Sidecar):
    out = gatekeeper("ps", "--url", sc.url, "--token", "wrong", "--json")
    json_error(out, "unauthorized", 2)


def test_no_token_at_all_exits_2(sc: Sidecar, tmp_path: Path):
    out = gatekeeper("ps", "--url", sc.url, "--json", state=tmp_path)
    assert json_error(out, "bad_input", 2)["error"]["field"] == "token"


def test_a_url_that_is_not_http_exits_2(tmp_path: Path):
    out = gatekeeper("ps", "--url", "ftp://127.0.0.1", "--token", "x", "--json", state=tmp_path)
    assert json_error(out, "bad_input", 2)["error"]["field"] == "url"


# -- 3 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["ps"], ["deploy", "tiny"], ["undeploy", "some-id"], ["deploy", "tiny", "--wait"]]
)
def test_a_closed_port_exits_3(tmp_path: Path, command: list[str]):
    url = f"http://127.0.0.1:{closed_port()}"
    human = gatekeeper(*command, "--url", url, "--token", "x", state=tmp_path)
    assert human.returncode == 3, human.stderr
    assert f"cannot reach {url}" in human.stderr and "gatekeeper serve" in human.stderr
    payload = json_error(
        gatekeeper(*command, "--url", url, "--token", "x", "--json", state=tmp_path),
        "sidecar_unreachable",
        3,
    )
    assert payload["error"]["value"] == url


def test_a_sidecar_that_never_answers_exits_3_after_the_timeout(tmp_path: Path):
    with socket.socket() as listener:  # accepts connections (backlog), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        out = gatekeeper("ps", "--url", url, "--token", "x", "--timeout", "0.5", "--json")
    payload = json_error(out, "sidecar_unreachable", 3)
    assert "Timeout" in payload["error"]["message"]


def test_a_name_that_does_not_resolve_exits_3(tmp_path: Path):
    out = gatekeeper("ps", "--url", "http://nosuch.invalid:8080", "--token", "x", "--json")
    json_error(out, "sidecar_unreachable", 3)


def test_a_reader_that_leaves_early_is_not_an_internal_error():
    out = subprocess.run(
        ["bash", "-c", f"'{GATEKEEPER}' models | head -1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 1
    assert "internal error" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_a_worker_that_fails_to_start_ends_deploy_wait_with_1(tmp_path: Path):
    settings = settings_for(
        tmp_path,
        restart_limit=0,
        worker_env={"GATEKEEPER_SIM_STARTUP_SECONDS": "0.2", "GATEKEEPER_SIM_FAIL": "oom-load"},
    )
    with running_sidecar(settings) as failing:
        args = ("deploy", "tiny", "--wait", "--url", failing.url, "--token", TOKEN)
        human = gatekeeper(*args)
        as_json = gatekeeper(*args, "--name", "again", "--json")
    assert human.returncode == 1 and "gatekeeper: error: deployment tiny-" in human.stderr
    assert "ready" not in human.stdout.splitlines()[-1]
    # the message quotes the worker's log (vLLM's own traceback there), so not json_error
    payload = json.loads(as_json.stdout)
    assert as_json.returncode == 1 == payload["exit_code"]
    assert payload["error"]["code"] == "worker_failed" and payload["error"]["field"] == "deployment"
    assert "out of memory while loading" in payload["error"]["message"]
