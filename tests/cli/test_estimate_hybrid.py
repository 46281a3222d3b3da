"""``gatekeeper estimate``'s table for a hybrid model says the recurrent state it holds per
sequence, which the per-token KV figure leaves out (#26 item 6)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_estimate import gatekeeper
from tests.estimator.test_hybrid import GRANITE_H


def test_a_hybrid_models_table_shows_its_recurrent_state_per_sequence(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(GRANITE_H), encoding="utf-8")
    args = ("estimate", str(tmp_path), "--gpu", "H100-80GB", "-tp", "2", "--max-model-len", "32768")
    table, as_json = gatekeeper(*args), gatekeeper(*args, "--json")
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    state = json.loads(as_json.stdout)["state_bytes_per_sequence"]
    assert state > 0
    line = next(x for x in table.stdout.splitlines() if "recurrent state:" in x)
    assert f"({state:,} bytes) per sequence" in line and f"{state / 2**30:.3f} GiB" in line


def test_an_attention_only_models_table_has_no_state_line():
    out = gatekeeper("estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB")
    assert out.returncode == 0, out.stderr
    assert "recurrent state" not in out.stdout
