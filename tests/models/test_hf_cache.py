"""Models in the Hugging Face cache, resolved offline as vLLM resolves them.

Every cache here is filled by ``huggingface_hub``'s own downloads from the stand-in hub
(``tests/support/fake_hub.py``), so it is laid out exactly as ``huggingface_hub`` lays it
out (``models--ORG--NAME/refs``, ``snapshots/COMMIT`` links into ``blobs``); the stand-in is
stopped, or ``HF_HUB_OFFLINE`` set, before the look-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi, constants
from safetensors.numpy import save

from gatekeeper.errors import HubError, ModelSpecError
from gatekeeper.models.source import load_model_dir, resolve_model
from tests.models.test_sources import TINY
from tests.support.fake_hub import SHA, FakeHub, Repo, serve_fake_hub

WEIGHTS = {
    "model.embed_tokens.weight": np.zeros((1000, 64), np.float16),
    "model.layers.0.self_attn.q_proj.weight": np.zeros((64, 64), np.float16),
    "lm_head.weight": np.zeros((1000, 64), np.float16),
}
FILES = {"config.json": json.dumps(TINY).encode(), "model.safetensors": save(WEIGHTS)}


def fill_cache(
    cache: Path, repo_id: str, files: dict[str, bytes], *, download: tuple[str, ...] = ()
) -> Path:
    """Download ``download`` (default: every file) of a repo into ``cache`` through
    ``huggingface_hub``, from a stand-in hub stopped afterwards; the snapshot folder."""
    with serve_fake_hub() as hub, pytest.MonkeyPatch.context() as online:
        online.setattr(constants, "HF_HUB_OFFLINE", False)
        hub.repos[repo_id] = Repo(files)
        api = HfApi(endpoint=hub.endpoint)
        paths = [api.hf_hub_download(repo_id, f, cache_dir=cache) for f in download or files]
    return Path(paths[0]).parent


def default_cache() -> Path:
    return Path(constants.HF_HUB_CACHE)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_a_cached_model_resolves_offline_by_its_name(offline: None, tmp_path: Path) -> None:
    snapshot = fill_cache(default_cache(), "org/tiny", FILES)
    assert snapshot == default_cache() / "models--org--tiny" / "snapshots" / SHA
    assert (default_cache() / "models--org--tiny" / "refs" / "main").read_text() == SHA

    spec = resolve_model("org/tiny")

    assert spec.name == "org/tiny" and spec.serve_reference == "org/tiny"
    assert spec.source == f"Hugging Face cache (main = {SHA[:12]}, {snapshot})"
    # the safetensors headers of the snapshot, exactly as a local directory's
    plain = tmp_path / "plain"
    plain.mkdir()
    for name, data in FILES.items():
        (plain / name).write_bytes(data)
    local = load_model_dir(plain)
    assert spec.checkpoint is not None and local.checkpoint is not None
    assert spec.checkpoint.tensors == local.checkpoint.tensors
    assert spec.checkpoint.total_bytes == sum(a.nbytes for a in WEIGHTS.values())


def test_the_cache_comes_before_the_hub(hub: FakeHub) -> None:
    fill_cache(default_cache(), "org/tiny", FILES)
    spec = resolve_model("org/tiny", allow_network=True, hf_endpoint=hub.endpoint)
    assert spec.source.startswith("Hugging Face cache")
    assert hub.requests == []


def test_revision_by_commit_and_by_branch(offline: None) -> None:
    fill_cache(default_cache(), "org/tiny", FILES)
    by_commit = resolve_model("org/tiny", revision=SHA)
    assert by_commit.source.startswith(f"Hugging Face cache ({SHA[:12]},")
    assert resolve_model("org/tiny", revision="main").source == resolve_model("org/tiny").source


def test_a_revision_not_in_the_cache_lists_those_that_are(offline: None) -> None:
    fill_cache(default_cache(), "org/tiny", FILES)
    with pytest.raises(ModelSpecError) as info:
        resolve_model("org/tiny", revision="v2.0")
    message = str(info.value)
    assert "not at revision 'v2.0'" in message and f"main -> {SHA[:12]}" in message
    assert "--revision" in message and "GATEKEEPER_ALLOW_NETWORK" not in message


def test_a_snapshot_without_config_json_says_so(offline: None) -> None:
    fill_cache(default_cache(), "org/weights-only", FILES, download=("model.safetensors",))
    with pytest.raises(ModelSpecError, match=r"in the Hugging Face cache .* without config\.json"):
        resolve_model("org/weights-only")


def test_a_corrupt_cached_config_is_named(offline: None) -> None:
    files = {**FILES, "config.json": b"{not json"}
    snapshot = fill_cache(default_cache(), "org/corrupt", files)
    with pytest.raises(ModelSpecError, match="is not valid JSON") as info:
        resolve_model("org/corrupt")
    assert str(snapshot / "config.json") in str(info.value)


def test_download_dir_is_looked_in_first(offline: None, tmp_path: Path) -> None:
    own = tmp_path / "weights"
    fill_cache(own, "org/tiny", FILES)
    with pytest.raises(ModelSpecError, match="not in the Hugging Face cache"):
        resolve_model("org/tiny")
    spec = resolve_model("org/tiny", download_dir=str(own))
    assert spec.name == "org/tiny" and str(own) in spec.source


def test_a_snapshot_given_as_a_path_is_named_by_its_repo(offline: None) -> None:
    snapshot = fill_cache(default_cache(), "org/tiny", FILES)
    spec = resolve_model(str(snapshot))
    assert spec.name == "org/tiny"
    assert spec.serve_reference == str(snapshot.resolve())


def test_offline_and_not_cached_says_so(offline: None) -> None:
    with pytest.raises(ModelSpecError) as info:
        resolve_model("org/absent", allow_network=True)
    message = str(info.value)
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE is set" in message
    assert "GATEKEEPER_ALLOW_NETWORK" not in message
    # huggingface_hub's current CLI (huggingface-cli no longer installs with it)
    assert "hf download org/absent config.json" in message and "huggingface-cli" not in message


def test_not_cached_without_network_names_the_setting() -> None:
    with pytest.raises(ModelSpecError, match="GATEKEEPER_ALLOW_NETWORK=true") as info:
        resolve_model("org/absent")
    assert str(default_cache()) in str(info.value)


def test_a_hub_look_up_is_written_into_the_cache(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.repos["org/tiny"] = Repo(dict(FILES))
    first = resolve_model("org/tiny", allow_network=True, hf_endpoint=hub.endpoint)
    assert first.source == "Hugging Face hub" and first.name == "org/tiny"
    assert first.checkpoint is not None and len(first.checkpoint.tensors) == 3

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    asked = len(hub.requests)
    again = resolve_model("org/tiny", allow_network=True, hf_endpoint=hub.endpoint)
    assert again.source.startswith(f"Hugging Face cache (main = {SHA[:12]}")
    assert len(hub.requests) == asked  # offline: the hub was not asked again
    # the headers are not cached (only whole files are): the architecture sizes it
    assert again.checkpoint is None and again.hidden_size == first.hidden_size


def test_a_gated_catalog_model_falls_back_to_the_catalog(hub: FakeHub) -> None:
    repo = "meta-llama/Llama-3.1-8B-Instruct"
    hub.repos[repo] = Repo({"config.json": b"{}"}, gated=True)
    spec = resolve_model(repo, allow_network=True, hf_endpoint=hub.endpoint)
    assert spec.source.startswith("embedded catalog")
    assert "the hub look-up failed" in spec.source and "gated" in spec.source


def test_a_gated_repo_outside_the_catalog_says_to_accept_its_terms(hub: FakeHub) -> None:
    hub.repos["org/gated"] = Repo({"config.json": b"{}"}, gated=True)
    with pytest.raises(HubError, match=r"org/gated is gated .* set HF_TOKEN"):
        resolve_model("org/gated", allow_network=True, hf_endpoint=hub.endpoint)


def test_a_catalog_model_at_a_revision_not_cached_is_refused() -> None:
    with pytest.raises(ModelSpecError, match="no revisions") as info:
        resolve_model("meta-llama/Llama-3.1-8B-Instruct", revision="refs/pr/1")
    assert "Drop --revision" in str(info.value)


def test_estimate_finds_the_cache_through_hf_home(tmp_path: Path) -> None:
    home = tmp_path / "hf-home"
    fill_cache(home / "hub", "org/tiny", FILES)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GATEKEEPER_"))}
    env |= {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [
            *(sys.executable, "-m", "gatekeeper", "estimate", "org/tiny"),
            *("--revision", "main", "--gpu-memory", "16GiB"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("org/tiny on a 16.00 GiB GPU")
    assert "weights from: safetensors headers (1 file)" in out.stdout
    assert "--revision" not in out.stderr  # used by the look-up, not "read but not modelled"


def test_a_snapshot_without_config_advises_hf_download(offline: None) -> None:
    fill_cache(default_cache(), "org/weights-only", FILES, download=("model.safetensors",))
    with pytest.raises(ModelSpecError) as info:
        resolve_model("org/weights-only")
    message = str(info.value)
    assert "without config.json" in message
    # the default branch needs no --revision, as the not-cached advice words it too
    assert "(hf download org/weights-only config.json)" in message
    assert "huggingface-cli" not in message
