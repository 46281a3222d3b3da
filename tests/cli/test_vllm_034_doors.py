"""``gatekeeper check`` on vLLM 0.34 (#37), as an operator runs it: the line placement
derives, estimated again by ``gatekeeper estimate`` as the worker it launches, holds
exactly what was promised (sharing: a byte budget, the extensible KV cache off) or no more
(alone: a cap on the extensible cache)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _gatekeeper(*args: str, share: bool = False) -> dict[str, Any]:
    env = {**os.environ, "GATEKEEPER_SHARE_GPUS": "true" if share else "false"}
    out = subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args, "--json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


@pytest.mark.parametrize("share", [True, False])
def test_the_line_check_derives_for_0_34_holds_its_promise(share: bool) -> None:
    decision = _gatekeeper("check", MODEL, "--node", "1xH100-80GB", "--vllm-version", "0.34.0",
                           "--max-model-len", "8192", share=share)  # fmt: skip
    placement = decision["placement"]
    assert decision["admitted"] and placement["accounting"] == "v1-0.34"
    args = placement["vllm_args"]
    assert args[0] == MODEL
    assert ("--kv-cache-memory-bytes" in args) is share
    launched = _gatekeeper("estimate", *args, "--gpu", "H100-80GB", "--vllm-version", "0.34.0")
    assert launched["fits"] and launched["extensible_kv_cache"] is not share
    promise = placement["promise_bytes"][0]
    if share:
        assert launched["nvml_bytes"] == promise
        assert launched["kv_cache_bytes"] == placement["flags"]["kv_cache_memory_bytes"]
    else:
        assert launched["nvml_bytes"] <= promise
        assert launched["kv_cache_bytes"] == placement["predicted"]["kv_cache_bytes"]
