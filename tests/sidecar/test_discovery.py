"""``GET /discovery/workers`` (Prometheus HTTP service discovery): the pure view in
``gatekeeper.sidecar.discovery`` over deployments, and the endpoint on a real sidecar
with simulator workers. A real Prometheus using it: tests/metrics/test_worker_discovery.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.sidecar.deployment import Deployment, State
from gatekeeper.sidecar.discovery import SCRAPED_STATES, advertised_host, worker_targets
from tests.support.sidecar_harness import Sidecar, running_sidecar, settings_for

REQUEST = PlacementRequest(resolve_model("Qwen/Qwen3-0.6B"), ServeOptions(max_model_len=4096))
NODE = "node-a"


def deployment(worker: str, state: State, port: int = 18000, gpus: tuple[int, ...] = (0,)) -> Any:
    return Deployment(
        id=worker, name="qwen", request=REQUEST, decision=None, prediction=None,
        promise_bytes=(1,) * len(gpus), gpu_indices=gpus,
        gpu_uuids=tuple(f"GPU-{i}" for i in gpus), args=(), state=state, port=port,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("worker_host", "request_host", "expected"),
    [
        ("127.0.0.1", "node-a.example", "127.0.0.1"),
        ("10.0.0.7", "node-a.example", "10.0.0.7"),
        ("0.0.0.0", "node-a.example", "node-a.example"),
        ("::", "10.0.0.7", "10.0.0.7"),
        ("0.0.0.0", "fd00::7", "[fd00::7]"),
        ("::1", "node-a.example", "[::1]"),
    ],
)
def test_the_advertised_host_is_the_listen_address_or_the_one_asked(
    worker_host, request_host, expected
):
    assert advertised_host(worker_host, request_host) == expected


def test_only_serving_workers_are_targets_with_their_labels():
    states: tuple[State, ...] = get_args(State)
    workers = [deployment(f"w-{s}", s, port=18000 + i) for i, s in enumerate(states)]
    groups = worker_targets(workers, host="10.0.0.7", node=NODE)
    assert [g["labels"]["worker"] for g in groups] == ["w-ready", "w-stopping"]
    assert {s for s in states if f"w-{s}" in str(groups)} == SCRAPED_STATES
    assert groups[0] == {
        "targets": ["10.0.0.7:18003"],
        "labels": {"model": "qwen", "worker": "w-ready", "gpu": "0", "UUID": "GPU-0"}
        | {"Hostname": NODE, "node": NODE},
    }


def test_a_tensor_parallel_worker_lists_its_gpus_and_a_portless_one_is_left_out():
    groups = worker_targets(
        [deployment("b", "ready", gpus=(2, 3)), deployment("a", "ready", port=0)],
        host="h",
        node=NODE,
    )
    (group,) = groups
    assert group["labels"]["gpu"] == "2,3" and group["labels"]["UUID"] == "GPU-2,GPU-3"


def ready_worker(sc: Sidecar) -> dict[str, Any]:
    r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
    assert r.status_code == 201, r.text
    return sc.wait_state(r.json()["deployment"]["id"], ("ready",))


def test_the_endpoint_lists_the_sidecar_s_serving_workers(tmp_path: Path):
    settings = settings_for(tmp_path, node_name=NODE)
    with running_sidecar(settings) as sc:
        assert httpx.get(f"{sc.url}/discovery/workers").json() == []
        d = ready_worker(sc)
        response = httpx.get(f"{sc.url}/discovery/workers")  # no token: as open as /metrics
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        (group,) = response.json()
        assert group["targets"] == [f"127.0.0.1:{d['port']}"]
        gpus = sc.admin.get("/admin/gpus").json()["gpus"]
        (gpu,) = d["gpus"]
        assert group["labels"] == {
            "model": "tiny",
            "worker": d["id"],
            "gpu": str(gpu),
            "UUID": next(g["uuid"] for g in gpus if g["index"] == gpu),
            "Hostname": NODE,
            "node": NODE,
        }
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{sc.url}/v1/chat/completions", json=body).status_code == 200
        worker_metrics = httpx.get(f"http://{group['targets'][0]}/metrics").text
        assert "vllm:kv_cache_usage_perc" in worker_metrics
        # The simulator's time to first token: one request observed, in the +Inf bucket.
        families = {f.name: f for f in text_string_to_metric_families(worker_metrics)}
        ttft = {s.name: s for s in families["vllm:time_to_first_token_seconds"].samples}
        assert ttft["vllm:time_to_first_token_seconds_count"].value == 1
        assert 0 < ttft["vllm:time_to_first_token_seconds_sum"].value < 5
        sc.admin.delete(f"/admin/deployments/{d['id']}")
        assert httpx.get(f"{sc.url}/discovery/workers").json() == []


def test_workers_on_every_interface_get_the_host_prometheus_asked(tmp_path: Path):
    settings = settings_for(tmp_path, node_name=NODE, worker_host="0.0.0.0")
    with running_sidecar(settings) as sc:
        d = ready_worker(sc)
        port = sc.url.rsplit(":", 1)[1]
        (group,) = httpx.get(f"http://localhost:{port}/discovery/workers").json()
        assert group["targets"] == [f"localhost:{d['port']}"]
        sc.admin.delete(f"/admin/deployments/{d['id']}")
