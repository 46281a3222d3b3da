"""``gatekeeper ps`` lists live deployments (``--all``: the stopped and failed ones too),
``gatekeeper forget`` drops finished ones, and ``ps --json`` names predicted and actual
figures alike (#31 item 3): the real CLI against a real sidecar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cli.test_rehearsal_output import gatekeeper
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

FIELDS = (
    "weights_bytes",
    "kv_cache_bytes",
    "activation_peak_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
)
DEPRECATED = ("weights", "kv_cache", "activation_peak", "non_torch", "cuda_graph")
"""``actual``'s bare keys before it took predicted's names (one release more)."""


def listed(sc: Sidecar, *flags: str) -> dict[str, Any]:
    result = gatekeeper(sc, "ps", "--json", *flags)
    assert result.returncode == 0, result.stderr
    return {d["id"]: d for d in json.loads(result.stdout)["deployments"]}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with running_sidecar(settings_for(tmp_path_factory.mktemp("ps"))) as sc:
        yield sc


@pytest.fixture(scope="module")
def two(sidecar: Sidecar) -> tuple[str, str]:
    """One deployment ready, one stopped."""
    ids = []
    for name in ("live-one", "gone-one"):
        r = gatekeeper(sidecar, "deploy", "tiny", "--name", name, "--max-model-len", "2k")
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.split(" as ")[1].split()[0])
    for i in ids:
        sidecar.wait_state(i, ("ready",))
    assert gatekeeper(sidecar, "undeploy", ids[1]).returncode == 0
    return ids[0], ids[1]


def test_ps_shows_live_deployments_and_all_adds_stopped(sidecar: Sidecar, two: tuple[str, str]):
    live, stopped = two
    assert set(listed(sidecar)) == {live}
    everything = listed(sidecar, "--all")
    assert set(everything) == {live, stopped} and everything[stopped]["state"] == "stopped"
    table = gatekeeper(sidecar, "ps").stdout
    assert live in table and stopped not in table
    assert table.splitlines()[-1].startswith("(1 stopped or failed not shown: ps --all")
    assert stopped in gatekeeper(sidecar, "ps", "--all").stdout


def test_predicted_and_actual_share_one_naming_scheme(sidecar: Sidecar, two: tuple[str, str]):
    d = listed(sidecar)[two[0]]
    assert [k for k in d["predicted"] if k in FIELDS] == list(d["predicted"])
    for field, old in zip(FIELDS, DEPRECATED, strict=True):
        assert isinstance(d["predicted"][field], int)
        assert isinstance(d["actual"][field], int)
        assert d["actual"][old] == d["actual"][field]  # deprecated, one release
        assert d["deprecated"][f"actual.{old}"] == f"actual.{field}"  # and marked so
    row = gatekeeper(sidecar, "ps").stdout.splitlines()[2]
    assert row.count("GiB") == 2  # predicted and actual totals, both from the _bytes keys


def test_forget_drops_a_stopped_deployment_and_refuses_a_live_one(
    sidecar: Sidecar, two: tuple[str, str]
):
    live, stopped = two
    refused = gatekeeper(sidecar, "forget", live, "--json")
    assert refused.returncode == 1
    error = json.loads(refused.stdout)["error"]
    assert "409" in error["message"] and "undeploy" in error["message"]
    forgot = gatekeeper(sidecar, "forget", stopped)
    assert forgot.returncode == 0, forgot.stderr
    assert f"forgot {stopped} (stopped)" in forgot.stdout
    assert set(listed(sidecar, "--all")) == {live}
    again = gatekeeper(sidecar, "forget", stopped, "--json")
    assert (
        again.returncode == 2 and "does not exist" in json.loads(again.stdout)["error"]["message"]
    )
    assert gatekeeper(sidecar, "forget").returncode == 2  # nothing named


def test_forget_all_drops_every_finished_one(sidecar: Sidecar, two: tuple[str, str]):
    r = gatekeeper(sidecar, "deploy", "tiny", "--name", "third", "--max-model-len", "2k")
    third = r.stdout.split(" as ")[1].split()[0]
    sidecar.wait_state(third, ("ready",))
    assert gatekeeper(sidecar, "undeploy", third).returncode == 0
    result = gatekeeper(sidecar, "forget", "--all", "--json")
    assert result.returncode == 0, result.stderr
    assert [d["id"] for d in json.loads(result.stdout)["forgotten"]] == [third]
    assert set(listed(sidecar, "--all")) == {two[0]}
