"""Plan files read and launch with the vLLM release they name (per deployment, or for the
whole plan), else with the release ``load_plan`` is given (the settings' default)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gatekeeper.gpus.declared import parse_declared_node
from gatekeeper.models.source import resolve_model
from gatekeeper.placement import PlacementPolicy, PlanError, load_plan, run_plan

PLAN = """
node = "1xH100-80GB"
{head}
[[deployments]]
name = "lora"
model = "Qwen/Qwen3-0.6B"
max_model_len = 4096
enable_lora = true
max_lora_rank = 48
{first}
[[deployments]]
name = "chat"
model = "Qwen/Qwen3-0.6B"
max_model_len = 4096
{second}
"""


def _plan(tmp_path: Path, head: str = "", first: str = "", second: str = "") -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(head=head, first=first, second=second))
    return path


def test_a_plan_naming_a_release_is_read_and_launched_as_that_release(tmp_path: Path):
    # max_lora_rank 48: any rank in 0.8.5, not among 0.32's choices
    plan = load_plan(
        _plan(tmp_path, head='vllm_version = "0.8.5"', second='vllm_version = "0.10.2"')
    )
    assert plan.vllm_version == "0.8.5"
    assert [d.options.vllm_version for d in plan.deployments] == ["0.8.5", "0.10.2"]
    result = run_plan(
        plan, parse_declared_node("1xH100-80GB"), PlacementPolicy(share_gpus=True), resolve_model
    )
    lora, chat = result.decisions
    assert lora.placement is not None, lora.reasons
    assert lora.placement.estimate.vllm_version == "0.8.5"
    assert "--kv-cache-memory-bytes" not in lora.placement.args  # 0.8.5 has none
    assert "--max-lora-rank" in lora.placement.args
    # the second worker shares the GPU: 0.10.2 sizes it in bytes, beside the 0.8.5 one
    assert chat.placement is not None, chat.reasons
    assert "--kv-cache-memory-bytes" in chat.placement.args
    assert chat.placement.gpu_indices == lora.placement.gpu_indices


def test_a_plan_naming_no_release_is_read_with_the_one_given(tmp_path: Path):
    path = _plan(tmp_path)
    with pytest.raises(PlanError, match="max_lora_rank = 48 is invalid"):
        load_plan(path)  # the newest table
    plan = load_plan(path, release="0.8.5")
    assert plan.vllm_version is None and plan.deployments[0].options.max_lora_rank == 48
    newer = _plan(tmp_path, second='performance_mode = "throughput"')
    with pytest.raises(
        PlanError, match=re.escape("'performance_mode' is not a flag of vllm serve 0.8.5")
    ):
        load_plan(newer, release="0.8.5")


def test_a_whole_device_release_in_a_plan_gets_a_gpu_of_its_own(tmp_path: Path):
    plan = load_plan(_plan(tmp_path, head='vllm_version = "0.8.5"'))
    result = run_plan(
        plan, parse_declared_node("1xH100-80GB"), PlacementPolicy(share_gpus=True), resolve_model
    )
    first, second = result.decisions
    assert first.admitted and not second.admitted
    assert any("vLLM 0.8.5 cannot share a GPU" in r for r in second.reasons)


@pytest.mark.parametrize("value", ['"latest"', "0.8", "[1]"])
def test_a_plan_release_that_is_not_a_version_is_refused(tmp_path: Path, value: str):
    with pytest.raises(PlanError) as caught:
        load_plan(_plan(tmp_path, head=f"vllm_version = {value}"))
    message = str(caught.value)
    assert "vllm_version" in message and "is not a vLLM version" in message
    assert 'give one such as "0.10.1"' in message
