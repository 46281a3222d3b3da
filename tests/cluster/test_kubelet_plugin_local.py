"""The kubelet plugin's parts that need no apiserver (issue 30 items 1 and 2): the
checkpoint's checksum, a process's pod from its cgroup, what a claim's vLLM containers
let vLLM take (``gatekeeper.cluster.reserves``), and the simulator started with the flags
the mutating webhook writes reporting the claimed KV cache, read as gatekeeper reads
vLLM's start-up log (``gatekeeper.vllm.log``), and real vLLM on CPU taking the KV cache
the flag names."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pytest

from gatekeeper.cluster.allocation_check import check_published
from gatekeeper.cluster.checkpoint import Checkpoint, CheckpointError
from gatekeeper.cluster.pod_cgroup import pod_uid
from gatekeeper.cluster.prepared import ClaimedDevice, ClaimRef, PreparedDevice, PrepareError
from gatekeeper.cluster.reserves import check_reserves, claim_users, vllm_takes
from gatekeeper.units import GIB, MIB
from gatekeeper.vllm.log import StartupLog
from tests.support.dra_kubelet import CGROUP, webhook_sized
from tests.support.prometheus_server import free_port
from tests.support.real_vllm import (
    NO_VLLM_CPU,
    VllmServer,
    build_tiny_model,
    cpu_serve_args,
    vllm_cpu_available,
    worker_env,
)

H100_TOTAL = 85520809984
REF = ClaimRef("team-a", "vllm-0-gpu", "uid-1")


def test_a_checkpoint_that_does_not_match_its_checksum_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save({})
    raw = json.loads(path.read_text())
    raw["data"]["claims"]["x"] = {}
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="checksum does not match"):
        Checkpoint(path).load()
    assert not list(tmp_path.glob(".checkpoint.json.*"))  # no temporary file left


def test_a_process_s_pod_comes_from_either_cgroup_driver(tmp_path: Path) -> None:
    uid = "1a2b3c4d-0000-4111-8222-123456789abc"
    cgroups = {
        1: CGROUP.format(uid.replace("-", "_")),  # systemd
        2: f"12:memory:/kubepods/besteffort/pod{uid}/0123abcd\n",  # cgroupfs, v1
        3: "0::/system.slice/sshd.service\n",  # no pod
    }
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    assert [pod_uid(pid, tmp_path) for pid in (1, 2, 3, 4)] == [uid, uid, None, None]


def _pod(*containers: dict[str, Any], status: bool = False) -> dict[str, Any]:
    """A pod whose entry ``gpu`` is claim ``vllm-0-gpu``: named in its spec, or made from
    a template and named in its status."""
    entry: dict[str, Any] = {"name": "gpu", "resourceClaimTemplateName": "t"}
    statuses = [{"name": "gpu", "resourceClaimName": "vllm-0-gpu"}] if status else []
    if not status:
        entry = {"name": "gpu", "resourceClaimName": "vllm-0-gpu"}
    return {
        "metadata": {"namespace": "team-a", "name": "vllm-0"},
        "spec": {"containers": list(containers), "resourceClaims": [entry]},
        "status": {"resourceClaimStatuses": statuses},
    }


def _container(
    name: str, *args: str, request: str | None = None, vllm: bool = True
) -> dict[str, Any]:
    claim = {"name": "gpu"} | ({"request": request} if request else {})
    return {
        "name": name,
        "image": "vllm/vllm-openai:v0.11.0",
        "command": ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", *args] if vllm else ["sleep"],
        "resources": {"claims": [claim]},
    }


def test_the_containers_that_run_vllm_on_the_claim_are_found() -> None:
    pod = _pod(
        _container("vllm", "--gpu-memory-utilization", "0.5", request="rank0"),
        _container("logger", vllm=False),
        {"name": "other", "command": ["vllm", "serve", "m"]},  # uses no claim
        status=True,
    )
    users, others = claim_users(pod, "vllm-0-gpu")
    assert [(u.pod, u.container, u.requests) for u in users] == [
        ("team-a/vllm-0", "vllm", ("rank0",))
    ]
    assert users[0].command.options.gpu_memory_utilization == 0.5
    assert others == ["container 'logger' of pod team-a/vllm-0"]
    assert claim_users(pod, "another-claim") == ([], [])


def test_what_the_flags_let_vllm_take() -> None:
    def takes(*args: str, estimated: int | None = None) -> tuple[int, str]:
        users, _ = claim_users(_pod(_container("vllm", *args)), "vllm-0-gpu")
        found = vllm_takes(users[0].command, H100_TOTAL, estimated)
        return found.bytes, found.flag

    assert takes() == (math.ceil(0.9 * H100_TOTAL), "--gpu-memory-utilization")  # the default
    assert takes("--gpu-memory-utilization", "0.25") == (
        math.ceil(0.25 * H100_TOTAL),
        "--gpu-memory-utilization",
    )
    budget = ("--kv-cache-memory-bytes", "4G", "--gpu-memory-utilization", "0.05")
    assert takes(*budget, estimated=20 * GIB) == (20 * GIB, "--kv-cache-memory-bytes")
    assert takes(*budget) == (4 * GIB, "--kv-cache-memory-bytes")  # 4G: GiB; not sized: KV alone


def test_users_of_one_device_add_up_and_the_refusal_names_the_numbers() -> None:
    pod = _pod(
        _container("a", "--gpu-memory-utilization", "0.2"),
        _container("b", "--gpu-memory-utilization", "0.1"),
    )
    users, _ = claim_users(pod, "vllm-0-gpu")
    took = [(u, vllm_takes(u.command, H100_TOTAL, None)) for u in users]
    claimed = ClaimedDevice("rank0", "node-a", "gpu-0", 20 * GIB)
    device = PreparedDevice(claimed, 0, "GPU-0", "cdi")
    with pytest.raises(PrepareError) as refused:
        check_reserves(REF, device, H100_TOTAL, took)
    both = math.ceil(0.2 * H100_TOTAL) + math.ceil(0.1 * H100_TOTAL)
    for part in (
        "claim team-a/vllm-0-gpu (uid uid-1): container 'a' of pod team-a/vllm-0",
        f"with the claim's other users, {both} bytes",
        f"the claim holds {20 * GIB} bytes (20.00 GiB)",
        "lower --gpu-memory-utilization to 0.1511",  # (20 GiB - 0.1 x total) / total
        f"capacity.requests.memory to {both}",
    ):
        assert part in str(refused.value)
    check_reserves(REF, device, H100_TOTAL, took[1:])  # b alone fits
    whole = PreparedDevice(ClaimedDevice("rank0", "node-a", "gpu-0", 0), 0, "GPU-0", "cdi")
    check_reserves(REF, whole, H100_TOTAL, took)  # a device booked whole: not checked


def test_the_simulator_started_with_the_webhook_s_flags_reports_the_claimed_kv_cache() -> None:
    edited, sizing = webhook_sized()
    assert edited["command"][:2] == ["vllm", "serve"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env["GATEKEEPER_SIM_STARTUP_SECONDS"] = "0.1"  # and no NVML state: nothing to hold
    argv = [sys.executable, "-m", "gatekeeper.simulator", "serve", *edited["command"][2:]]
    argv += ["--host", "127.0.0.1", "--port", str(free_port())]
    lines: list[str] = []
    ready = threading.Event()

    def drain(out: IO[str]) -> None:  # reads to the end, so the pipe never fills
        for line in out:
            lines.append(line)
            if "Starting vLLM server" in line:
                ready.set()
        ready.set()

    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as sim:
        assert sim.stdout is not None
        reader = threading.Thread(target=drain, args=(sim.stdout,), daemon=True)
        reader.start()
        try:
            assert ready.wait(60), "".join(lines)
        finally:
            sim.send_signal(signal.SIGTERM)
            try:
                sim.wait(timeout=30)
            except subprocess.TimeoutExpired:
                sim.kill()
                sim.wait()
        reader.join(timeout=10)
    log = StartupLog()
    for line in lines:
        log = log.feed(line)
    print("".join(lines[-6:]))
    reported = log.memory.kv_cache
    assert reported is not None, "".join(lines)
    # vLLM prints GiB with two decimals: within half a hundredth of a GiB of the flag
    assert abs(reported - sizing.kv_cache_memory_bytes) <= 0.005 * GIB, (reported, sizing)
    assert any(f"'kv_cache_memory_bytes': {sizing.kv_cache_memory_bytes}" in x for x in lines)


@pytest.mark.slow
@pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)
def test_real_vllm_on_cpu_takes_the_kv_cache_the_flag_names(tmp_path: Path) -> None:
    """vLLM-CPU 0.32 honours --kv-cache-memory-bytes (in host memory: it says nothing of a
    GPU's reservation) unless VLLM_CPU_KVCACHE_SPACE is set, which wins (platforms/cpu.py)."""
    model = build_tiny_model(tmp_path / "tiny")
    port = free_port()
    flags = ["--max-model-len", "512", "--kv-cache-memory-bytes", str(256 * MIB)]
    args = cpu_serve_args(["tiny", *flags, "--gpu-memory-utilization", "0.1"], model, port)
    env = worker_env(tmp_path)
    env.pop("VLLM_CPU_KVCACHE_SPACE")
    with VllmServer(args, env, tmp_path / "vllm.log", port) as server:
        server.wait_ready(300)
    log = (tmp_path / "vllm.log").read_text()
    assert "Explicitly set (0.25/" in log, log[-3000:]  # 256 MiB, as vLLM prints GiB
    assert "'kv_cache_memory_bytes': 268435456" in log
    read = StartupLog()
    for line in log.splitlines():
        read = read.feed(line)
    assert read.memory.kv_cache == 256 * MIB  # 0.25 GiB, as gatekeeper reads the line


def test_a_booking_is_checked_against_the_published_capacity_and_policy() -> None:
    """``allocation_check``: the range policy the agent publishes, and a ``validValues``
    one another publisher may write."""
    ranged = {"value": "100", "requestPolicy": {"validRange": {"min": "10", "step": "10"}}}
    listed = {"value": "100", "requestPolicy": {"validValues": ["25", "50"]}}
    published = {
        "spec": {
            "devices": [
                {"name": "a", "capacity": {"memory": ranged}},
                {"name": "b", "capacity": {"memory": listed}},
                {"name": "c", "capacity": {}},
            ]
        }
    }
    ref = ClaimRef("ns", "c", "u")

    def refused(device: str, booked: int) -> str | None:
        claimed = ClaimedDevice("r", "node", device, booked)
        try:
            check_published(ref, [claimed], published, int, "ResourceSlice s")
        except PrepareError as e:
            return str(e)
        return None

    assert refused("a", 100) is None and refused("a", 30) is None and refused("b", 50) is None
    assert "above the device's published capacity" in (refused("a", 110) or "")
    assert "steps of 10 bytes from 10" in (refused("a", 35) or "")
    assert "allows 10 to 100 bytes" in (refused("a", 5) or "")
    assert "allows only 25, 50 bytes" in (refused("b", 30) or "")
    assert "positive number of bytes" in (refused("b", 0) or "")
    assert "not published with a memory capacity" in (refused("c", 10) or "")
    with pytest.raises(PrepareError, match="ResourceSlice s is not published"):
        check_published(ref, [], None, int, "ResourceSlice s")
