"""A sidecar for vLLM 0.34 with a worker that plays 0.34 (the simulator with
``GATEKEEPER_SIM_VLLM_VERSION``): the worker sizes its KV cache after warm-up from the
stand-in GPU's free memory, becomes ready, and the sidecar's actual KV cache is the one
its log said ("Extended KV cache to N blocks (X GiB)"), not the reservation "Available
KV cache memory" shows."""

from __future__ import annotations

import re
from pathlib import Path

from gatekeeper.gpus.nvml import NvmlInventory
from gatekeeper.gpus.stand_in import FakeNvml, h100
from gatekeeper.units import GIB
from tests.support.sidecar_harness import running_sidecar, settings_for

# The rehearsal tells a simulated worker the prediction's figures; leaving out the KV
# cache and the bytes held lets it measure them as vLLM 0.34 does.
MEASURED = {
    "GATEKEEPER_SIM_VLLM_VERSION": "0.34.0",
    "GATEKEEPER_SIM_KV_BYTES": "",
    "GATEKEEPER_SIM_ACTUAL_BYTES": "",
}


def test_a_0_34_worker_starts_and_its_kv_cache_is_what_its_log_said(
    tmp_path: Path, fake_nvml: FakeNvml
) -> None:
    fake_nvml.set([h100(0), h100(1)])
    settings = settings_for(tmp_path / "state", gpus="nvml", default_vllm_version="0.34.0")
    settings.worker_env.update(MEASURED, GATEKEEPER_SIM_NVML_STATE=str(fake_nvml.state_path))
    with NvmlInventory() as inventory, running_sidecar(settings, inventory) as sc:
        r = sc.admin.post("/admin/deployments", json={"model": "tiny"})
        assert r.status_code == 201, r.text
        d = sc.wait_state(r.json()["deployment"]["id"], ("ready", "failed"))
        assert d["state"] == "ready", d
        log = Path(d["log_path"]).read_text()
        sc.admin.delete(f"/admin/deployments/{d['id']}")
    assert "vLLM 0.34.0 log formats" in log
    assert "--kv-cache-memory-bytes" not in d["vllm_args"], "alone on its GPU: the cache on"
    reserved = re.search(r"Available KV cache memory: ([\d.]+) GiB", log)
    extended = re.search(r"Extended KV cache to (\d+) blocks \(([\d.]+) GiB\)\.", log)
    tokens = re.search(r"GPU KV cache size: ([\d,]+) tokens", log)
    assert reserved and extended and tokens, log
    assert d["actual"]["kv_cache_bytes"] == round(float(extended.group(2)) * GIB)
    assert d["actual"]["kv_cache_bytes"] < round(float(reserved.group(1)) * GIB)
    assert d["actual"]["kv_cache_tokens"] == int(tokens.group(1).replace(",", ""))
    # 64-token blocks (4,096 tokens a request are 64 whole blocks)
    assert d["actual"]["kv_cache_tokens"] == int(extended.group(1)) * 64
    # the weights and the rest are the prediction's, echoed by the rehearsal
    assert abs(d["actual"]["weights_bytes"] - d["predicted"]["weights_bytes"]) <= GIB // 200
    # Alone on its GPU, gatekeeper caps the cache with --gpu-memory-utilization; the worker's
    # own 0.34 arithmetic (the simulator's, written apart from the estimator's) lands on
    # the prediction's KV cache within 0.1%.
    assert "--gpu-memory-utilization" in d["vllm_args"]
    predicted = d["predicted"]["kv_cache_bytes"]
    assert abs(d["actual"]["kv_cache_bytes"] - predicted) <= predicted // 1000
