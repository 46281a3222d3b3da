"""Deployment records and the vLLM release (#26 item 4): a sidecar records the release it
admitted a worker for, and a restarted sidecar reads the record with that release's
flags (else with its own configured release), not with the newest table; what a sidecar
of an older release launches takes only that release's flags."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.types import PlacementRequest
from gatekeeper.sidecar.records import resolve_request
from gatekeeper.vllm.flags import options_record
from tests.support.sidecar_harness import running_sidecar, settings_for

QWEN = PlacementRequest(resolve_model("Qwen/Qwen3-0.6B"), ServeOptions())


def _record(options: ServeOptions, release: str | None) -> dict[str, object]:
    """A record's request as the manager writes it (every option field)."""
    request: dict[str, object] = {
        "options": options_record(options),
        "min_sequences": 1,
        "min_kv_tokens": None,
        "auto_parallel": True,
    }
    if release is not None:
        request["vllm_version"] = release
    return request


def test_a_record_is_read_with_the_release_it_names():
    # vLLM 0.8.5 takes any LoRA rank; 0.32's parser offers a list of them (no 48)
    lora = ServeOptions(max_model_len=4096, enable_lora=True, max_lora_rank=48)
    read = resolve_request(QWEN, _record(lora, "0.8.5"), release="0.33.0")
    assert read.options.max_lora_rank == 48 and read.options.enable_lora
    assert read.options.vllm_version is None, "the options keep what the operator named"
    with pytest.raises(ServeOptionsError, match="max_lora_rank = 48 is invalid"):
        resolve_request(QWEN, _record(lora, None), release="0.33.0")
    # a record from before the release was recorded: the sidecar's configured release
    assert resolve_request(QWEN, _record(lora, None), release="0.8.5").options == lora


def test_a_record_listing_every_field_reads_under_a_release_without_the_newer_flags():
    plain = ServeOptions(max_model_len=4096, kv_cache_dtype="fp8")
    written = _record(plain, "0.8.5")
    assert options_record(plain)["runner"] == "auto"  # 0.8.5 has no --runner
    assert resolve_request(QWEN, written).options == plain
    asked = ServeOptions(max_model_len=4096, performance_mode="throughput")  # 0.20 on
    with pytest.raises(ServeOptionsError, match=re.escape("not a flag of vllm serve 0.8.5")):
        resolve_request(QWEN, _record(asked, "0.8.5"))


def test_an_older_release_sidecar_launches_its_flags_and_a_restart_adopts_by_the_record(
    tmp_path: Path,
) -> None:
    settings = settings_for(
        tmp_path, default_vllm_version="0.10.1", share_gpus=True, stop_workers_on_exit=False
    )
    body = {"model": "tiny", "options": {"runner": "generate"}}  # --runner: 0.10.0 on
    with running_sidecar(settings) as sc:
        r = sc.admin.post("/admin/deployments", json=body)
        assert r.status_code == 201, r.text
        deployment_id = r.json()["deployment"]["id"]
        ready = sc.wait_state(deployment_id, ("ready", "failed"))
        assert ready["state"] == "ready", ready
        pid = ready["pid"]
    record = json.loads((tmp_path / "deployments" / f"{deployment_id}.json").read_text())
    args = record["record"]["args"]
    assert "--kv-cache-memory-bytes" not in args, "0.10.1 has no byte budget"
    assert "--gpu-memory-utilization" in args and "--runner" in args
    assert record["request"]["vllm_version"] == "0.10.1"
    assert record["decision"]["placement"]["vllm_version"] == "0.10.1"
    # a sidecar now configured for 0.8.5 (no --runner) still reads the record as 0.10.1's
    older = {"default_vllm_version": "0.8.5", "stop_workers_on_exit": True}
    with running_sidecar(settings.model_copy(update=older)) as sc:
        adopted = sc.wait_state(deployment_id, ("ready",))
        assert adopted["pid"] == pid and adopted["vllm_args"] == args
