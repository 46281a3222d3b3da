"""``gatekeeper webhook --mutate`` without an apiserver to write to: exit 2, saying what to
give (the server itself is tested in tests/cluster/test_mutating_webhook.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.tls_certs import issue, make_ca


def test_mutate_without_a_kubeconfig_says_what_to_give(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    issue(ca, tmp_path / "tls.crt", tmp_path / "tls.key")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEKEEPER_", "KUBE"))}
    env |= {"HOME": str(tmp_path), "GATEKEEPER_STATE_DIR": str(tmp_path / "state")}
    command = [sys.executable, "-m", "gatekeeper", "webhook", "--mutate", "--cert",
               str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"), "--port", "0"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "webhook --mutate: no apiserver to create claim templates on" in done.stderr
    assert "give --kubeconfig FILE, or run in a pod" in done.stderr
