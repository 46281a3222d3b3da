"""``bench/proxy.py --servers``: the sidecars it starts, one per ``http_server``, are all in
front of the same worker (real ``gatekeeper serve`` processes: the second adopts the
first's worker); each gets the five criteria under its own name; a list that is not one of
``http_server``'s values is refused with the choices."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from bench.proxy import Target, servers_list, verdict
from bench.proxy_targets import sidecars
from bench.serve_process import TOKEN

ENV = '{ GATEKEEPER_SIM_STARTUP_SECONDS = "0.2", GATEKEEPER_SIM_TOKEN_SECONDS = "0" }'
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_every_sidecar_proxies_to_the_one_worker(tmp_path: Path) -> None:
    with ExitStack() as stack:
        worker, found = sidecars(stack, tmp_path, ENV, ["gatekeeper", "uvicorn"])
        assert [name for name, _ in found] == ["gatekeeper", "gk+uvicorn"]
        assert len({running.pid for _, running in found} | {worker.pid}) == 3
        for _, running in found:
            url = f"http://127.0.0.1:{running.port}"
            r = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30)
            assert r.status_code == 200, r.text
            listed = httpx.get(f"{url}/admin/deployments", headers=ADMIN).json()["deployments"]
            assert [(d["pid"], d["port"]) for d in listed] == [(worker.pid, worker.port)]
        log = (tmp_path / "uvicorn" / "sidecar.log").read_text()
        assert "http_server = uvicorn" in log, log
    # the first sidecar stopped the worker; the adopting one left it to the first
    assert not Path(f"/proc/{worker.pid}").exists() or _zombie(worker.pid)


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def _target(name: str, ms: float, cpu_ms: float, rate: float) -> Target:
    t = Target(name, 1, None if name == "worker" else list)
    t.whole, t.first = [ms / 1e3] * 10, [ms / 2e3] * 10
    t.cpu_whole = t.cpu_stream = cpu_ms / 1e3 * 10
    t.n_whole = t.n_stream = 10
    t.rates = [rate]
    return t


def test_each_sidecar_gets_the_five_criteria_under_its_name() -> None:
    fast = [
        _target("worker", 1.0, 0.0, 200.0),
        _target("gatekeeper", 1.1, 0.1, 199.0),
        _target("gk+granian", 1.5, 0.3, 190.0),
        _target("vllm-router", 1.2, 0.2, 200.0),
        _target("nginx", 1.0, 0.05, 200.0),
    ]
    lines = verdict(fast, fast)
    assert len(lines) == 10
    assert all(" gatekeeper " in line and line.endswith("met") for line in lines[:4])
    assert all(" gk+granian " in line and "NOT met" in line for line in lines[5:])
    assert not any("nginx" in line for line in lines)


@pytest.mark.parametrize("text", ["nginx", "gatekeeper,gatekeeper", ""])
def test_servers_that_are_not_http_servers_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="gatekeeper, uvicorn, granian"):
        servers_list(text)
    assert servers_list(" granian,gatekeeper ") == ["granian", "gatekeeper"]
