"""A deployment's forms kept in one place (#28 item 1): a field added to the deploy body
(here by extending ``DeployBody``, with no other edit) is taken, kept with the
deployment, recorded, read back by a restarted sidecar that adopts the worker, and shown
in its summary; its description is the help of the 400 that names it. A record in the
shape the previous version wrote (no ``body``) is still adopted."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from gatekeeper.sidecar.admin_api import DeployBody, field_help
from tests.support.sidecar_harness import running_sidecar, settings_for


class TeamBody(DeployBody):
    """The deploy body with one more field."""

    team: str = Field(default="nobody", min_length=1, description="the owning team's name")


def test_a_field_added_to_the_body_survives_deploy_restart_and_adoption(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, stop_workers_on_exit=False, share_gpus=True)
    with running_sidecar(settings, deploy_body=TeamBody) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny", "team": "search"})
        assert r.status_code == 201, r.text
        asked = r.json()["deployment"]
        assert asked["body"]["team"] == "search"
        old = sc.admin.post("/admin/deployments", json={"model": "tiny", "name": "old"})
        assert old.status_code == 201, old.text
        ids = asked["id"], old.json()["deployment"]["id"]
        pids = [sc.wait_state(i, ("ready",))["pid"] for i in ids]
        typo = sc.admin.post("/admin/deployments", json={"model": "tiny", "teem": "x"})
        assert typo.status_code == 400
        assert "did you mean 'team'?" in typo.json()["error"]["message"]
        assert "team" in typo.json()["error"]["message"].split("the fields are")[1]
        schema = sc.admin.get("/openapi.json").json()["components"]["schemas"]["DeployBody"]
        assert schema["properties"]["team"]["description"] == "the owning team's name"
    records = tmp_path / "deployments"
    assert json.loads((records / f"{ids[0]}.json").read_text())["body"]["team"] == "search"
    # the second record as the previous version wrote it: record, request, decision
    path = records / f"{ids[1]}.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({k: data[k] for k in ("record", "request", "decision")}))
    with running_sidecar(settings.model_copy(update={"stop_workers_on_exit": True})) as sc:
        adopted = [sc.wait_state(i, ("ready",)) for i in ids]
        assert [d["pid"] for d in adopted] == pids, "adopted, not relaunched"
        assert adopted[0]["body"] == asked["body"]
        assert adopted[1]["body"] == {}, "a record without a body reads as none"
        assert adopted[1]["name"] == "old" and adopted[1]["vllm_args"] == data["record"]["args"]
        listed = sc.admin.get("/admin/deployments").json()["deployments"]
        assert {d["id"]: d["body"].get("team") for d in listed}[ids[0]] == "search"


def test_the_help_of_each_field_is_its_description() -> None:
    help_text = field_help(TeamBody)
    assert list(help_text) == [*DeployBody.model_fields, "team"]
    assert help_text["team"] == "the owning team's name"
    assert help_text["model"].startswith("a configured model name or a hub repo id")
    assert "\n" not in help_text["model"], "a wrapped docstring reads as one line"
