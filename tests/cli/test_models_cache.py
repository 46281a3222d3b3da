"""``gatekeeper models`` lists the Hugging Face cache beside the catalog, with whether
gatekeeper can size each cached model and why not (#31 item 8). The cache is filled by
huggingface_hub's own downloads from the stand-in hub; the real CLI lists it offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.models.test_hf_cache import FILES, fill_cache
from tests.models.test_sources import TINY

GATEKEEPER = Path(sys.executable).parent / "gatekeeper"


def models(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEKEEPER_")}
    env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [str(GATEKEEPER), "models", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("hub")
    fill_cache(cache, "org/tiny", FILES)
    fill_cache(cache, "org/weights-only", FILES, download=("model.safetensors",))
    # an architecture gatekeeper does not know, whose config lacks the usual fields
    odd = {"architectures": ["NoSuchModelForCausalLM"], "model_type": "no_such", "vocab_size": 8}
    fill_cache(cache, "org/odd-architecture", {"config.json": json.dumps(odd).encode()})
    quant = {**TINY, "quantization_config": {"quant_method": "no-such-method"}}
    fill_cache(cache, "org/odd-quant", {"config.json": json.dumps(quant).encode()})
    return cache


def listed(cache: Path) -> dict[str, dict[str, Any]]:
    result = models("--download-dir", str(cache), "--json")
    assert result.returncode == 0, result.stderr
    return {e["repo_id"]: e for e in json.loads(result.stdout) if e["source"] == "hf_cache"}


def test_each_cached_model_says_whether_it_can_be_sized(cache: Path):
    entries = listed(cache)
    assert set(entries) == {"org/tiny", "org/weights-only", "org/odd-architecture", "org/odd-quant"}
    tiny = entries["org/tiny"]
    assert tiny["sizable"] is True and tiny["reason"] is None and tiny["refs"] == ["main"]
    assert tiny["size_on_disk_bytes"] == sum(len(b) for b in FILES.values())
    for repo, words in (
        ("org/weights-only", "config.json"),
        ("org/odd-architecture", "num_hidden_layers"),
        ("org/odd-quant", "no-such-method"),
    ):
        entry = entries[repo]
        assert entry["sizable"] is False, repo
        assert words in entry["reason"] and "\n" not in entry["reason"], entry["reason"]


def test_the_catalog_stays_listed_first(cache: Path):
    result = models("--download-dir", str(cache), "--json")
    payload = json.loads(result.stdout)
    assert payload[0]["source"] == "catalog" and "aliases" in payload[0]
    sources = [e["source"] for e in payload]
    assert sources == sorted(sources)  # catalog, then hf_cache


def test_the_table_shows_the_cache_with_its_verdicts(cache: Path, tmp_path: Path):
    text = models("--download-dir", str(cache)).stdout
    catalog, _, cached = text.partition("Hugging Face cache (")
    assert catalog.startswith("embedded catalog:") and str(cache) in cached
    rows = {line.split()[0]: line for line in cached.splitlines()[1:]}
    assert rows["org/tiny"].endswith("sizable") and "GiB" in rows["org/tiny"]
    assert "not sizable: " in rows["org/odd-quant"]
    empty = models("--download-dir", str(tmp_path / "none")).stdout
    assert empty.rstrip().endswith("(no models)")
