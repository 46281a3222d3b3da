"""REHEARSAL on everything the operator commands print about a rehearsal sidecar (#14).

A sidecar whose workers are the gatekeeper simulator says so in every admin answer
(``"rehearsal": true``); ``deploy``, ``ps`` and ``undeploy`` then print a REHEARSAL
line first (``"rehearsal": true`` with ``--json``) and label the measured memory
"actual (simulated)", since the simulator reports the prediction back. The same
commands against a sidecar whose worker is not the simulator print neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gatekeeper.cli.output import REHEARSAL_BANNER
from tests.support.sidecar_harness import TOKEN, Sidecar, running_sidecar, settings_for

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"
NOT_THE_SIMULATOR = [sys.executable, "-X", "utf8", "-m", "gatekeeper.simulator", "serve"]
"""The simulator, started so that the sidecar does not take it for one (is_simulator)."""


def gatekeeper(sc: Sidecar, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    return subprocess.run(
        [str(GATEKEEPER), *args, "--url", sc.url, "--token", TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def stop_all(sc: Sidecar) -> None:
    for d in sc.admin.get("/admin/deployments").json()["deployments"]:
        sc.admin.delete(f"/admin/deployments/{d['id']}")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with running_sidecar(settings_for(tmp_path_factory.mktemp("rehearsal"))) as sc:
        yield sc


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    state = tmp_path_factory.mktemp("real")
    with running_sidecar(settings_for(state, worker_command=NOT_THE_SIMULATOR)) as sc:
        yield sc


def test_deploy_wait_ps_and_undeploy_say_rehearsal(rehearsal: Sidecar):
    deploy = gatekeeper(rehearsal, "deploy", "tiny", "--max-model-len", "2k", "--wait")
    assert deploy.returncode == 0, deploy.stderr
    lines = deploy.stdout.splitlines()
    assert lines[0] == REHEARSAL_BANNER
    assert "simulator (as vllm serve Qwen/Qwen3-0.6B" in deploy.stdout
    assert "actual (simulated)" in deploy.stdout and "vLLM log" not in deploy.stdout
    ps = gatekeeper(rehearsal, "ps")
    assert ps.returncode == 0, ps.stderr
    header = ps.stdout.splitlines()[1]
    assert ps.stdout.splitlines()[0] == REHEARSAL_BANNER and "ACTUAL (SIMULATED)" in header
    row = ps.stdout.splitlines()[2]
    assert "ready" in row and row.count("GiB") == 2  # predicted and simulated totals
    deployment_id = row.split()[0]
    undeploy = gatekeeper(rehearsal, "undeploy", deployment_id)
    assert undeploy.stdout.splitlines() == [REHEARSAL_BANNER, f"stopped {deployment_id}"]


def test_json_says_rehearsal_true(rehearsal: Sidecar):
    deploy = gatekeeper(rehearsal, "deploy", "tiny", "--max-model-len", "2k", "--wait", "--json")
    assert deploy.returncode == 0, deploy.stderr
    payload = json.loads(deploy.stdout)  # one object; the progress went to stderr
    assert payload["rehearsal"] is True and payload["deployment"]["state"] == "ready"
    assert payload["deployment"]["actual"]["weights_bytes"] > 0
    assert REHEARSAL_BANNER in deploy.stderr and "ready" in deploy.stderr
    ps = json.loads(gatekeeper(rehearsal, "ps", "--json").stdout)
    assert ps["rehearsal"] is True
    assert payload["deployment"]["id"] in [d["id"] for d in ps["deployments"]]
    undeploy = gatekeeper(rehearsal, "undeploy", payload["deployment"]["id"], "--json")
    assert json.loads(undeploy.stdout)["rehearsal"] is True


def test_a_rejection_in_a_rehearsal_says_rehearsal(rehearsal: Sidecar):
    args = ("deploy", "meta-llama/Llama-3.3-70B-Instruct", "--max-model-len", "131072")
    human = gatekeeper(rehearsal, *args)
    assert human.returncode == 1
    assert human.stderr.splitlines()[0] == REHEARSAL_BANNER and "507" in human.stderr
    as_json = json.loads(gatekeeper(rehearsal, *args, "--json").stdout)
    assert as_json["rehearsal"] is True and as_json["exit_code"] == 1


def test_a_sidecar_with_real_workers_prints_no_rehearsal(real: Sidecar):
    deploy = gatekeeper(real, "deploy", "tiny", "--max-model-len", "2k", "--wait")
    assert deploy.returncode == 0, deploy.stderr
    assert "REHEARSAL" not in deploy.stdout + deploy.stderr
    assert "actual (vLLM log)" in deploy.stdout and "simulator" not in deploy.stdout
    ps = gatekeeper(real, "ps")
    assert "REHEARSAL" not in ps.stdout and "ACTUAL (VLLM LOG)" in ps.stdout.splitlines()[0]
    assert json.loads(gatekeeper(real, "ps", "--json").stdout)["rehearsal"] is False
    stop_all(real)


def test_the_admin_api_says_whether_it_is_a_rehearsal(rehearsal: Sidecar, real: Sidecar):
    assert rehearsal.admin.get("/admin/deployments").json()["rehearsal"] is True
    assert real.admin.get("/admin/deployments").json()["rehearsal"] is False
    assert rehearsal.admin.get("/admin/gpus").json()["rehearsal"] is True
    missing = rehearsal.admin.get("/admin/deployments/nope").json()
    assert missing["rehearsal"] is True and missing["error"]["param"] == "id"
    assert rehearsal.admin.get("/healthz").json()["rehearsal"] is True
    assert real.admin.get("/healthz").json()["rehearsal"] is False
