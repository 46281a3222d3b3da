"""A shared worker's default KV cache on a real sidecar (#31 item 4): ``deploy`` of
Qwen2.5-0.5B (max_model_len 32768) with ``share_gpus`` gets a byte budget of
``shared_kv_sequences`` sequences, and deploy, ps, ps --json and the admin API all name
the warning that max_num_seqs cannot run at full length."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.decision import decide
from gatekeeper.placement.policy import PlacementPolicy
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.settings import placement_policy
from tests.cli.test_rehearsal_output import gatekeeper
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    settings = settings_for(tmp_path_factory.mktemp("shared"), share_gpus=True)
    assert settings.shared_kv_sequences == 8
    with running_sidecar(settings) as sc:
        yield sc


def expected_budget(policy: PlacementPolicy, max_num_seqs: int) -> int:
    request = PlacementRequest(resolve_model(MODEL), ServeOptions(max_num_seqs=max_num_seqs))
    d = decide(request, parse_declared_node("2xH100-80GB"), policy=policy)
    assert d.placement is not None and d.placement.estimate.max_model_len == 32768
    return d.placement.estimate.kv_bytes_for(8)


def deployed_id(stdout: str) -> str:
    return stdout.split(" as ")[1].split()[0]


def test_deploy_ps_and_admin_api_name_the_warning(sidecar: Sidecar):
    r = gatekeeper(sidecar, "deploy", MODEL, "--name", "wide", "--max-num-seqs", "1024")
    assert r.returncode == 0, r.stderr
    did = deployed_id(r.stdout)
    budget = expected_budget(placement_policy(sidecar.settings), 1024)
    assert f"--kv-cache-memory-bytes {budget}" in r.stdout
    # placement's words for the sizing, as check and plan say it
    assert f"KV cache {budget / 2**30:.2f} GiB sized for 8 sequences of 32768 tokens" in r.stdout
    [warning] = [line.strip() for line in r.stdout.splitlines() if "warning:" in line]
    assert "is sized for 8 sequences of 32768 tokens at once" in warning
    assert "max_num_seqs 1024" in warning
    sidecar.wait_state(did, ("ready",))
    table = gatekeeper(sidecar, "ps").stdout
    assert f"warning: {did}: " in table and "sized for 8 sequences" in table
    listed = json.loads(gatekeeper(sidecar, "ps", "--json").stdout)["deployments"]
    [d] = [d for d in listed if d["id"] == did]
    assert len(d["warnings"]) == 1 and "sized for 8 sequences" in d["warnings"][0]
    api = sidecar.admin.get(f"/admin/deployments/{did}").json()
    assert api["warnings"] == d["warnings"]


def test_the_admin_apis_decision_carries_the_warning(sidecar: Sidecar):
    body = {"model": MODEL, "name": "api", "options": {"max_num_seqs": 512}}
    answer = sidecar.admin.post("/admin/deployments", json=body)
    assert answer.status_code == 201, answer.text
    data = answer.json()
    [warning] = data["decision"]["warnings"]
    assert "sized for 8 sequences" in warning and "max_num_seqs 512" in warning
    assert data["deployment"]["warnings"] == [warning]


def test_max_num_seqs_the_budget_holds_is_not_warned_of(sidecar: Sidecar):
    r = gatekeeper(sidecar, "deploy", MODEL, "--name", "narrow", "--max-num-seqs", "4")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stdout
    did = deployed_id(r.stdout)
    listed = json.loads(gatekeeper(sidecar, "ps", "--json").stdout)["deployments"]
    assert [d["warnings"] for d in listed if d["id"] == did] == [[]]
