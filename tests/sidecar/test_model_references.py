"""Path traversal at every door that takes a model reference (#13, item 4): an allowed
pattern matches only a well-formed reference, and a refusal reads the same whether or
not anything exists on disk."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from gatekeeper.settings import ModelEntry
from tests.support.sidecar_harness import running_sidecar, settings_for

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "torch_dtype": "bfloat16",
}


def checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CONFIG))
    return directory


def hostile(target: Path) -> list[str]:
    """References that a glob like ``Qwen/*`` or ``/…/models/*`` used to let through,
    each aimed at ``target``."""
    up = "../" * 30  # past the root from any working directory
    rel = str(target).lstrip("/")
    return [
        f"Qwen/{up}{rel}",
        f"Qwen/x/{up}{rel}",
        f"Qwen/..%2F..%2F{rel.replace('/', '%2F')}",
        f"Qwen/./{rel}",
        f"Qwen/{rel}/.",
        str(target),
        f"{target.parent}/models/../{target.name}",
        f"{target.parent}/models//../{target.name}",
        f"~/{rel}",
        f"Qwen\\..\\..\\{rel}",
        f"Qwen/{target.name}\x00",
        f"Qwen/{target.name}.git",
        "Qwen/" + "a" * 300,
    ]


def neutral(message: str, name: str) -> str:
    shown = name if len(name) <= 200 else name[:200] + "..."
    return message.replace(repr(shown), "NAME").replace(f"`{name}`", "NAME")


def test_no_door_takes_a_traversing_reference_and_none_tells_what_exists(tmp_path: Path):
    real = checkpoint(tmp_path / "ckpt")
    missing = tmp_path / "nothing-here"
    settings = settings_for(tmp_path / "state", allowed_models=["Qwen/*", f"{tmp_path}/models/*"])
    with running_sidecar(settings) as sc, httpx.Client(base_url=sc.url, timeout=30) as proxy:
        for there, absent in zip(hostile(real), hostile(missing), strict=True):
            answers = []
            for name in (there, absent):
                r = proxy.post(
                    "/v1/chat/completions",
                    json={"model": name, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 404, (name, r.status_code, r.text)
                proxied = neutral(r.json()["error"]["message"], name)
                r = sc.admin.post("/admin/deployments", json={"model": name})
                assert r.status_code == 403, (name, r.status_code, r.text)
                assert r.json()["error"]["type"] == "model_not_allowed"
                answers.append((proxied, neutral(r.json()["error"]["message"], name)))
            assert answers[0] == answers[1], (there, answers)
        assert sc.admin.get("/admin/deployments").json()["deployments"] == []
        assert sc.admin.get("/admin/gpus").json()["gpus"][0]["reserved_by_gatekeeper_bytes"] == 0


def test_a_path_under_an_absolute_pattern_or_in_models_is_still_served(tmp_path: Path):
    under = checkpoint(tmp_path / "models" / "ckpt")
    configured = checkpoint(tmp_path / "elsewhere" / "ckpt")
    settings = settings_for(tmp_path / "state", allowed_models=["Qwen/*", f"{tmp_path}/models/*"])
    settings.models.append(ModelEntry(name="local", model=str(configured)))
    with running_sidecar(settings) as sc:
        for model in (str(under), "local", "Qwen/Qwen3-0.6B"):
            r = sc.admin.post("/admin/deployments", json={"model": model})
            assert r.status_code == 201, (model, r.text)
            sc.admin.delete(f"/admin/deployments/{r.json()['deployment']['id']}")
