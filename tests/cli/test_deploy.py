"""``gatekeeper deploy`` takes vLLM's flags as vLLM reads them and the sidecar checks them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.sidecar_harness import TOKEN, running_sidecar, settings_for


def gatekeeper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args], capture_output=True, text=True, timeout=60
    )


def test_deploy_sends_vllms_flags_and_the_sidecar_refuses_what_it_cannot_size(tmp_path: Path):
    with running_sidecar(settings_for(tmp_path)) as sc:
        client = ("--url", sc.url, "--token", TOKEN)
        ok = gatekeeper("deploy", "tiny", "--max_model_len", "2k", "--max-num-seqs", "8", *client)
        assert ok.returncode == 0, ok.stderr
        deployments = sc.admin.get("/admin/deployments").json()["deployments"]
        args = " ".join(deployments[0]["vllm_args"])
        assert "--max-model-len 2000" in args and "--max-num-seqs 8" in args
        lora = gatekeeper("deploy", "tiny", "--name", "t2", "--enable-lora", *client)
        assert lora.returncode == 0, lora.stderr  # LoRA slots are sized, so it launches
        assert "--enable-lora" in lora.stdout
        overrides = gatekeeper(
            "deploy", "tiny", "--name", "t3", "--kv-offloading-backend", "lmcache", *client
        )
        assert overrides.returncode == 2  # the sidecar's 400: bad input, not a rejection
        assert "400" in overrides.stderr and "kv_offloading_backend" in overrides.stderr
        assert "does not size" in overrides.stderr
        typo = gatekeeper("deploy", "tiny", "--max-modle-len", "4096", *client)
        assert typo.returncode == 2 and "did you mean --max-model-len" in typo.stderr
        for d in sc.admin.get("/admin/deployments").json()["deployments"]:
            sc.admin.delete(f"/admin/deployments/{d['id']}")
