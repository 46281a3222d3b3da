"""How a cluster without hub access gives the admission webhook the configs of models the
catalog lacks (docs/models.md, "A cluster without the hub"), through the webhook's own
model resolver:

- a ConfigMap of ``config.json`` files, projected by the kubelet in the Hugging Face cache
  layout (``items[].path`` ``models--ORG--NAME/snapshots/REV/config.json`` and
  ``models--ORG--NAME/refs/main``) at the webhook's ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1``;
- an HF cache volume (a PVC that ``hf download`` or vLLM filled) that the workload names
  with ``--download-dir`` and the webhook mounts at the same path;
- a hub proxy or mirror (``GATEKEEPER_ALLOW_NETWORK=true``, ``GATEKEEPER_HF_ENDPOINT``).

The first two run the real ``gatekeeper webhook`` process over TLS (one process for the
module, about 3 s); the cache volume is filled by ``huggingface_hub``'s own download from
the stand-in hub, so its layout is the library's (blobs and symlinks). The proxy runs the
webhook in-process against the stand-in hub on loopback.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from huggingface_hub import constants

from gatekeeper.k8s.server import webhook_from_settings
from gatekeeper.models.catalog import find_in_catalog
from gatekeeper.settings import Settings
from tests.models.test_hf_cache import fill_cache
from tests.support.fake_hub import Repo, serve_fake_hub
from tests.support.webhook_process import start_webhook

FIXTURES = Path(__file__).parents[1] / "fixtures" / "admission"
SMALL = "acme/qwen3-8b-support-ft"
"""A fine-tune the catalog does not know, with Qwen3-8B's published config: fits an H100."""
LARGE = "acme/llama-3.3-70b-legal-ft"
"""Llama-3.3-70B's published config under another name: does not fit one H100."""
UNKNOWN = "is unknown to gatekeeper"


def _config(repo: str) -> bytes:
    entry = find_in_catalog(repo)
    assert entry is not None
    return json.dumps(entry.config).encode()


def project_configmap(mount: Path, items: Mapping[str, bytes]) -> None:
    """Write ``items`` (path -> bytes) as the kubelet projects a ConfigMap volume
    (``pkg/volume/util/atomic_writer.go``): the files in a timestamped directory,
    ``..data`` a symlink to it, and each top-level name a symlink through ``..data``."""
    payload = mount / "..2026_12_06_10_00_00.000000001"
    for path, data in items.items():
        target = payload / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (mount / "..data").symlink_to(payload.name)
    for top in {p.split("/")[0] for p in items}:
        (mount / top).symlink_to(f"..data/{top}")


def review(model: str, *args: str) -> dict[str, Any]:
    """deployment-allowed.json (one H100 by node affinity) serving ``model``."""
    body: dict[str, Any] = json.loads((FIXTURES / "deployment-allowed.json").read_text())
    container = body["request"]["object"]["spec"]["template"]["spec"]["containers"][0]
    container["args"] = ["serve", model, "--max-model-len=8192", *args]
    return body


@dataclass
class Hook:
    client: httpx.Client
    volume: Path

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/k8s/validate", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()["response"]
        return answer


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hook]:
    root = tmp_path_factory.mktemp("offline-configs")
    mount = root / "configmap"
    mount.mkdir()
    project_configmap(
        mount,
        {
            f"models--acme--{SMALL.split('/')[1]}/refs/main": b"configmap",
            f"models--acme--{SMALL.split('/')[1]}/snapshots/configmap/config.json": _config(
                "Qwen/Qwen3-8B"
            ),
        },
    )
    volume = root / "pvc"
    with pytest.MonkeyPatch.context() as online:
        online.setattr(constants, "HF_HUB_OFFLINE", False)
        fill_cache(volume, LARGE, {"config.json": _config("meta-llama/Llama-3.3-70B-Instruct")})
    env = {"HF_HUB_CACHE": str(mount), "HF_HUB_OFFLINE": "1"}
    (root / "webhook").mkdir()
    webhook = start_webhook(root / "webhook", env=env)
    context = ssl.create_default_context(cafile=str(webhook.ca.path))
    client = httpx.Client(base_url=webhook.url(""), verify=context, timeout=30)
    try:
        yield Hook(client, volume)
    finally:
        client.close()
        webhook.stop()


def test_a_configmap_in_the_cache_layout_sizes_a_model_the_catalog_lacks(hook: Hook) -> None:
    response = hook.answer(review(SMALL))
    assert response["allowed"] is True
    assert not any(UNKNOWN in w for w in response.get("warnings", [])), response
    # sized from the config (Qwen3-8B's 16 GiB of bf16 weights and more), not waved through
    annotations = response["auditAnnotations"]
    sized = [int(v) for k, v in annotations.items() if k.endswith("bytes-per-rank")]
    assert sized and sized[0] > 16 * 2**30, annotations


def test_an_hf_cache_volume_named_by_download_dir_sizes_the_model(hook: Hook) -> None:
    """The workload reads the PVC with --download-dir; the webhook mounts it at the same
    path and finds the config there (it is too big for the H100: denied with numbers)."""
    response = hook.answer(review(LARGE, f"--download-dir={hook.volume}"))
    assert response["allowed"] is False, response
    message = response["status"]["message"]
    assert f"{LARGE} does not fit on H100-80GB" in message, message
    without = hook.answer(review(LARGE))  # not in the webhook's own cache: unknown, warned
    assert without["allowed"] is True
    assert any(UNKNOWN in w for w in without["warnings"]), without


def test_a_hub_proxy_answers_when_the_network_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GATEKEEPER_HF_ENDPOINT`` names a mirror or proxy (the stand-in hub here); the
    config it serves is written into the cache, so the next review is offline."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with serve_fake_hub() as hub:
        hub.repos[LARGE] = Repo({"config.json": _config("meta-llama/Llama-3.3-70B-Instruct")})
        settings = Settings(allow_network=True, hf_endpoint=hub.endpoint)
        webhook = webhook_from_settings(settings)
        status, body, _ = webhook.answer(json.dumps(review(LARGE)).encode())
        assert status == 200
        assert body["response"]["allowed"] is False
        assert f"{LARGE} does not fit" in body["response"]["status"]["message"]
        assert any(LARGE in path for _, path, _, _ in hub.requests)
    assert (tmp_path / "hub" / f"models--acme--{LARGE.split('/')[1]}").is_dir()
