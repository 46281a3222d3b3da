"""``gatekeeper undeploy`` and ``forget`` of a deployment the sidecar does not have
(#39, CLI habits): the 404 says to run ``gatekeeper ps`` (not the admin API's GET), names
the deployments when there are few, and for a deployment's name the ID it stands for.
The real CLI against a real sidecar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_rehearsal_output import gatekeeper
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with running_sidecar(settings_for(Path(tmp_path_factory.mktemp("undeploy")))) as sc:
        yield sc


def test_an_unknown_deployment_is_answered_with_ps(sidecar: Sidecar):
    out = gatekeeper(sidecar, "undeploy", "nope")
    assert out.returncode == 2, out.stderr
    assert "gatekeeper: error: 404: deployment 'nope' does not exist; run" in out.stderr
    assert "`gatekeeper ps`" in out.stderr and "GET /admin" not in out.stderr
    assert out.stderr.rstrip().endswith("; the sidecar has none"), out.stderr
    r = gatekeeper(sidecar, "deploy", "tiny", "--name", "hinted", "--max-model-len", "2k")
    assert r.returncode == 0, r.stderr
    deployment_id = r.stdout.split(" as ")[1].split()[0]
    for command in ("undeploy", "forget"):
        out = gatekeeper(sidecar, command, "nope", "--json")
        assert out.returncode == 2, out.stderr
        message = json.loads(out.stdout)["error"]["message"]
        assert "run `gatekeeper ps` to list what is deployed" in message
        assert f"{deployment_id} (hinted, " in message  # one deployment: named


def test_a_name_given_for_an_id_gets_the_id(sidecar: Sidecar):
    listed = sidecar.admin.get("/admin/deployments").json()["deployments"]
    (deployment_id,) = [d["id"] for d in listed if d["name"] == "hinted"]
    out = gatekeeper(sidecar, "undeploy", "hinted")
    assert out.returncode == 2, out.stderr
    assert f"it is the name of {deployment_id}: give the ID" in out.stderr, out.stderr
    assert gatekeeper(sidecar, "undeploy", deployment_id).returncode == 0
