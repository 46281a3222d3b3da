"""The length a model would be launched at, as ``/v1/models`` shows it, is vLLM's default
length (``ModelSpec.default_max_model_len``), not the model's limit: a LongRoPE model
such as Phi-4-mini serves at its original 4,096 unless ``--max-model-len`` says more."""

from __future__ import annotations

from pathlib import Path

import httpx

from gatekeeper.models.source import resolve_model
from gatekeeper.settings import ModelEntry
from tests.support.sidecar_harness import running_sidecar, settings_for

PHI = "microsoft/Phi-4-mini-instruct"


def test_model_cards_give_the_length_a_launch_would_get(tmp_path: Path) -> None:
    spec = resolve_model(PHI)
    assert spec.default_max_model_len == 4096 < spec.max_position_embeddings
    entries = [
        ModelEntry(name="phi", model=PHI, options={}),
        ModelEntry(name="phi-long", model=PHI, options={"max_model_len": 65536}),
    ]
    settings = settings_for(tmp_path, models=entries, allowed_models=["microsoft/*"])
    with running_sidecar(settings) as sc:
        cards = httpx.get(f"{sc.url}/v1/models", timeout=30).json()["data"]
    lengths = {c["id"]: c["max_model_len"] for c in cards}
    assert lengths["phi"] == 4096 and lengths["phi-long"] == 65536
