"""``bench/gpu_check.py --sleep-model`` without a GPU day: on the stand-in NVML driver
with no CUDA build of vLLM here, it says so and exits 2 (the check itself needs a GPU:
vLLM's CPU build has no sleep mode)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import gpu_check
from gatekeeper.gpus.stand_in import h100, subprocess_env, write_state


def test_without_vllm_it_exits_2_and_names_the_command(nvml_stub_lib: Path, tmp_path: Path):
    state = tmp_path / "state.txt"
    write_state(state, [h100(0)])
    missing = str(tmp_path / "no-vllm-here")
    result = subprocess.run(
        [sys.executable, gpu_check.__file__, "--sleep-model", "m", "--vllm", missing],
        env=subprocess_env(nvml_stub_lib.parent, state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"cannot run here: no {missing!r} command" in result.stderr
    assert "Traceback" not in result.stderr
