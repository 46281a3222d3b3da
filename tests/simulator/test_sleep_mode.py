"""The simulator's sleep mode (#40): vLLM's routes, parameters, answers and status codes
(``vllm/entrypoints/serve/dev/sleep/api_router.py``), served only with
``VLLM_SERVER_DEV_MODE=1``, and the memory it gives back in the stand-in NVML driver's
state file while asleep (the weights and KV cache), taken back at wake."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from gatekeeper.gpus.stand_in import h100, write_state
from gatekeeper.units import GIB
from tests.simulator.test_simulator import Sim, _gpu_used
from tests.support.polling import wait_for

SIZES = {
    "GATEKEEPER_SIM_ACTUAL_BYTES": "20GiB",
    "GATEKEEPER_SIM_WEIGHTS_BYTES": "8GiB",
    "GATEKEEPER_SIM_KV_BYTES": "9GiB",
}


def test_sleep_routes_release_and_restore_the_claims(tmp_path: Path) -> None:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0)])
    env = {"GATEKEEPER_SIM_NVML_STATE": str(state), "VLLM_SERVER_DEV_MODE": "1", **SIZES}
    with Sim(tmp_path, "m", "--enable-sleep-mode", **env) as s:
        s.wait_ready()
        assert _gpu_used(state) == [20 * GIB]
        assert httpx.get(f"{s.url}/is_sleeping").json() == {"is_sleeping": False}
        r = httpx.post(f"{s.url}/sleep", params={"level": 2, "mode": "wait"})
        assert (r.status_code, r.json()) == (200, {"status": "sleeping", "level": 2})
        assert _gpu_used(state) == [3 * GIB]  # 20 - weights 8 - KV cache 9
        assert httpx.get(f"{s.url}/is_sleeping").json() == {"is_sleeping": True}
        assert httpx.get(f"{s.url}/health").status_code == 200
        answered: list[str] = []
        waiting = threading.Thread(
            target=lambda: answered.append(
                s.client().completions.create(model="m", prompt="x", max_tokens=2).id
            )
        )
        waiting.start()
        waiting.join(0.5)
        assert not answered  # kept while asleep, as vLLM's paused scheduler keeps it
        r = httpx.post(f"{s.url}/wake_up")
        assert (r.status_code, r.json()) == (200, {"status": "awake", "tags": None})
        waiting.join(10)
        assert answered and _gpu_used(state) == [20 * GIB]
    # the claims' keeper gives them back once the simulator has exited (asynchronously)
    wait_for("the claims given back", lambda: _gpu_used(state) == [0])


BAD: list[tuple[dict[str, int | str], str]] = [({"level": 3}, "level"), ({"level": -1}, "level"), ({"level": "x"}, "level"),
       ({"mode": "drop"}, "mode")]  # fmt: skip


def test_bad_sleep_parameters_are_fastapis_422(tmp_path: Path) -> None:
    with Sim(tmp_path, "m", "--enable-sleep-mode", VLLM_SERVER_DEV_MODE="1") as s:
        s.wait_ready()
        for params, loc in BAD:
            r = httpx.post(f"{s.url}/sleep", params=params)
            assert r.status_code == 422, params
            assert r.json()["detail"][0]["loc"] == ["query", loc]
        assert httpx.get(f"{s.url}/is_sleeping").json() == {"is_sleeping": False}


def test_without_dev_mode_no_sleep_routes_and_without_the_flag_nothing_freed(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0)])
    with Sim(tmp_path, "m", name="plain", GATEKEEPER_SIM_NVML_STATE=str(state), **SIZES) as s:
        s.wait_ready()
        assert httpx.post(f"{s.url}/sleep").status_code == 404
    env = {"GATEKEEPER_SIM_NVML_STATE": str(state), "VLLM_SERVER_DEV_MODE": "1", **SIZES}
    with Sim(tmp_path, "m", name="noflag", **env) as s:
        s.wait_ready()
        assert httpx.post(f"{s.url}/sleep").json() == {"status": "sleeping", "level": 1}
        assert _gpu_used(state) == [20 * GIB]  # no CuMemAllocator pool: nothing released


def test_a_wake_onto_a_gpu_filled_meanwhile_is_cudas_out_of_memory(tmp_path: Path) -> None:
    state = tmp_path / "nvml_state.txt"
    write_state(state, [h100(0)])
    env = {"GATEKEEPER_SIM_NVML_STATE": str(state), "VLLM_SERVER_DEV_MODE": "1", **SIZES}
    with Sim(tmp_path, "m", "--enable-sleep-mode", "--gpu-memory-utilization", "0.3", **env) as s:
        s.wait_ready()
        assert httpx.post(f"{s.url}/sleep").status_code == 200
        filler = {**env, "GATEKEEPER_SIM_ACTUAL_BYTES": "70GiB"}
        with Sim(tmp_path, "other", "--gpu-memory-utilization", "0.1", name="o", **filler) as o:
            o.wait_ready()
            r = httpx.post(f"{s.url}/wake_up")
            assert r.status_code == 500 and "CUDA out of memory" in r.json()["error"]["message"]
            assert httpx.get(f"{s.url}/is_sleeping").json() == {"is_sleeping": True}
