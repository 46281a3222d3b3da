"""A deployment's predicted host bytes, by part, as vLLM defines each flag: CPU offload per
GPU, KV offloading across the TP ranks (per engine replica), V0's swap space per GPU,
sleeping weights at level 1 only."""

from __future__ import annotations

from gatekeeper.estimator.host import (
    ENGINE_CORE_BYTES,
    FRONTEND_BYTES,
    RANK_BYTES,
    process_bytes,
)
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.types import GpuTarget
from gatekeeper.estimator.vllm_method import estimate
from gatekeeper.models.source import resolve_model

GiB = 1 << 30
H100 = GpuTarget(total_bytes=80 * GiB, name="H100-80GB")


def host_of(**options: object):
    spec = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    e = estimate(spec, ServeOptions(max_model_len=8192, **options), H100)  # type: ignore[arg-type]
    return e, e.host


def test_an_awake_worker_without_offload_holds_its_processes_only() -> None:
    _, host = host_of()
    assert host.host_bytes == host.process_bytes == FRONTEND_BYTES + RANK_BYTES
    assert process_bytes(2) == FRONTEND_BYTES + ENGINE_CORE_BYTES + 2 * RANK_BYTES


def test_kv_offloading_is_one_buffer_across_ranks_and_cpu_offload_one_per_gpu() -> None:
    e, host = host_of(tensor_parallel_size=2, cpu_offload_gb=4, kv_offloading_size=16)
    assert host.kv_offload_bytes == 16 * GiB  # the total over both ranks, not 2 x 16
    assert host.cpu_offload_bytes == 2 * e.worst.cpu_offloaded_bytes >= 2 * 4 * GiB
    assert host.host_bytes == sum(host.parts().values())
    _, replicas = host_of(data_parallel_size=2, kv_offloading_size=16)
    assert replicas.kv_offload_bytes == 32 * GiB  # each engine replica has its buffer


def test_swap_space_is_v0s_only() -> None:
    _, v1 = host_of(vllm_version="0.10.0", swap_space=8)
    assert v1.swap_space_bytes == 0  # V1 keeps no CPU swap
    _, v0 = host_of(vllm_version="0.7.3", tensor_parallel_size=2)
    assert v0.swap_space_bytes == 2 * 4 * GiB  # V0's default, 4 GiB per GPU
    _, given = host_of(vllm_version="0.7.3", swap_space=1.5)
    assert given.swap_space_bytes == round(1.5 * GiB)


def test_sleeping_weights_are_held_at_level_1_only() -> None:
    e, awake = host_of(tensor_parallel_size=2)
    level1, level2 = awake.at_sleep_level(1), awake.at_sleep_level(2)
    assert level1.sleeping_weights_bytes == 2 * e.worst.weights_bytes
    assert level1.host_bytes == awake.host_bytes + level1.sleeping_weights_bytes
    assert level2.host_bytes == awake.host_bytes and level2.sleep_level == 2


def test_the_estimates_json_carries_host_bytes_and_its_parts() -> None:
    e, host = host_of(kv_offloading_size=2)
    data = e.to_json()
    assert data["host_bytes"] == host.host_bytes
    assert data["host"]["kv_offload_bytes"] == 2 * GiB and data["host"]["sleep_level"] == 0
