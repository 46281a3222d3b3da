"""Host memory in admission, through the real sidecar (simulator workers, a declared
node) whose host memory is the stand-in's files: a deployment the host cannot hold is
refused with the numbers and what would fit, a running worker's promise counts against
the next (also after the ledger file is lost and rebuilt), a reading that fails refuses, and ``/metrics`` shows the host series. One
sidecar for the module; the CLI's ``deploy`` too."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gatekeeper.gpus.host_memory import write_host_files
from gatekeeper.sidecar.ledger import Ledger, ledger_path
from tests.support.sidecar_harness import TOKEN, Sidecar, running_sidecar, settings_for

GiB = 1 << 30


@pytest.fixture(scope="module")
def host_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("host")


@pytest.fixture(scope="module")
def sc(tmp_path_factory: pytest.TempPathFactory, host_root: Path) -> Iterator[Sidecar]:
    write_host_files(host_root, total_bytes=16 * GiB, available_bytes=4 * GiB)
    state = tmp_path_factory.mktemp("state")
    settings = settings_for(state, host_memory_root=host_root, host_margin_bytes=GiB)
    with running_sidecar(settings) as sidecar:
        yield sidecar


def deploy(sc: Sidecar, name: str, **options: Any) -> Any:
    body = {"model": "tiny", "name": name, "options": {"max_model_len": 4096, **options}}
    return sc.admin.post("/admin/deployments", json=body)


def samples(sc: Sidecar, family: str) -> dict[str, float]:
    text = sc.admin.get("/metrics").text
    out = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == family:
                out[s.labels.get("worker", "")] = s.value
    return out


def test_over_committing_the_host_is_refused_with_what_would_fit(sc: Sidecar) -> None:
    r = deploy(sc, "big", kv_offloading_size=4)
    assert r.status_code == 507, r.text
    decision = r.json()["decision"]
    assert decision["admitted"] is False and decision["placement"] is None
    reason = decision["reasons"][0]
    assert "of host memory" in reason and "kv_offload 4.00 GiB" in reason
    assert "3.00 GiB usable" in reason and "margin 1.00 GiB" in reason
    fix = [s for s in decision["suggestions"] if s["kind"] == "host"]
    assert fix and 0 < fix[0]["options"]["kv_offloading_size"] < 3
    assert sc.admin.get("/admin/deployments").json()["deployments"] == []


def test_a_running_workers_promise_counts_against_the_next(sc: Sidecar) -> None:
    r = deploy(sc, "first", kv_offloading_size=1)
    assert r.status_code in (200, 201, 202), r.text
    first = r.json()["deployment"]["id"]
    sc.wait_state(first, ("ready",))
    decision = sc.admin.get(f"/admin/deployments/{first}").json()
    with Ledger(ledger_path(Path(sc.settings.state_dir))) as ledger:
        rows = ledger.by_deployment(first)
    host = sum(row.host_bytes for row in rows)
    assert host > GiB  # the processes' floor and 1 GiB of KV offloading
    second = deploy(sc, "second", kv_offloading_size=1)
    assert second.status_code == 507, second.text
    assert "not yet taken by running workers" in second.json()["decision"]["reasons"][0]
    ledger_path(Path(sc.settings.state_dir)).unlink()  # lost: rebuilt from what runs
    again = deploy(sc, "second", kv_offloading_size=1)
    assert again.status_code == 507, "the rebuilt rows lost the first worker's host promise"
    with Ledger(ledger_path(Path(sc.settings.state_dir))) as ledger:
        assert sum(row.host_bytes for row in ledger.by_deployment(first)) == host
    predicted = samples(sc, "gatekeeper_host_worker_predicted_bytes")
    actual = samples(sc, "gatekeeper_host_worker_actual_bytes")
    assert predicted[first] == host and 0 < actual[first] < host
    headroom = samples(sc, "gatekeeper_host_headroom_bytes")[""]
    assert headroom < host  # what the second would have needed
    assert decision["state"] == "ready"
    sc.admin.delete(f"/admin/deployments/{first}")
    sc.wait_state(first, ("stopped",))


def test_the_cli_deploy_shows_the_host_refusal(sc: Sidecar) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "deploy", "tiny", "--name", "cli",
         "--kv-offloading-size", "8", "--url", sc.url, "--token", TOKEN],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "of host memory" in out.stderr + out.stdout
    assert "--kv-offloading-size" in out.stderr + out.stdout


def test_a_host_reading_that_fails_refuses_rather_than_guess(sc: Sidecar, host_root: Path) -> None:
    meminfo = host_root / "proc" / "meminfo"
    kept = meminfo.read_text()
    meminfo.unlink()
    try:
        r = deploy(sc, "blind")
        assert r.status_code == 507, r.text
        reason = r.json()["decision"]["reasons"][0]
        assert "could not be read" in reason and "meminfo" in reason
        assert samples(sc, "gatekeeper_host_read_success")[""] == 0
    finally:
        meminfo.write_text(kept)
    assert samples(sc, "gatekeeper_host_read_success")[""] == 1


def test_a_worker_that_sleeps_at_level_1_is_admitted_with_its_weights_on_the_host(
    sc: Sidecar,
) -> None:
    body = {"model": "tiny", "name": "sleepy", "idle_action": "sleep", "sleep_level": 1,
            "options": {"max_model_len": 4096, "kv_offloading_size": 1}}  # fmt: skip
    r = sc.admin.post("/admin/deployments", json=body)
    assert r.status_code == 507, r.text
    decision = r.json()["decision"]
    assert "sleeping_weights 1.12 GiB" in decision["reasons"][0]
    assert {"sleep_level": 2} in [s["options"] for s in decision["suggestions"]]
    r = sc.admin.post("/admin/deployments", json={**body, "sleep_level": 2})
    assert r.status_code in (200, 201, 202), r.text
    d = r.json()["deployment"]
    host = sc.admin.get(f"/admin/deployments/{d['id']}").json()
    assert host["sleep_level"] == 2
    sc.admin.delete(f"/admin/deployments/{d['id']}")
    sc.wait_state(d["id"], ("stopped",))
