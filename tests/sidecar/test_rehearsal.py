"""The rehearsal speaks the simulator's protocol: what it sets, the simulator reads back."""

from __future__ import annotations

from gatekeeper.placement.types import Prediction
from gatekeeper.sidecar.rehearsal import SIMULATOR, is_simulator, simulator_env
from gatekeeper.simulator import SimEnv


def test_the_simulator_reports_the_prediction_the_rehearsal_hands_it():
    prediction = Prediction(
        weights_bytes=15 * 2**30,
        non_torch_bytes=2**28,
        activation_peak_bytes=2**31,
        cuda_graph_bytes=0,
        kv_cache_bytes=50 * 2**30,
    )
    env = SimEnv.from_environ(simulator_env(prediction, (70 * 2**30, 70 * 2**30)))
    assert dict(env.components) == {
        "weights": 15 * 2**30,
        "non_torch": 2**28,
        "activation": 2**31,
        "kv": 50 * 2**30,
    }
    assert env.actual_bytes == 70 * 2**30
    assert SimEnv.from_environ(simulator_env(Prediction(), ())) == SimEnv()


def test_the_rehearsal_recognises_its_worker_command():
    assert is_simulator(SIMULATOR)
    assert is_simulator(["/usr/bin/python3", "-m", "gatekeeper.simulator", "serve"])
    assert not is_simulator(["vllm", "serve"])
