"""``gatekeeper.models.hub`` against the stand-in hub on 127.0.0.1
(``tests/support/fake_hub.py``). The safetensors files are written by the ``safetensors``
package."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from huggingface_hub import constants
from safetensors.numpy import save, save_file

from gatekeeper.errors import HubError, ModelSpecError
from gatekeeper.models.hub import HubModel, fetch_hub_model
from gatekeeper.models.safetensors import read_checkpoint
from gatekeeper.models.spec import CheckpointTensor
from tests.support.fake_hub import SHA, FakeHub, Repo

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
TIMEOUT = 5.0
Arrays = dict[str, npt.NDArray[Any]]


def _safetensors(tensors: Arrays) -> bytes:
    return save(tensors, metadata={"format": "pt"})


def _fetch(hub: FakeHub, repo_id: str, **kwargs: object) -> HubModel:
    return fetch_hub_model(repo_id, endpoint=hub.endpoint, timeout_seconds=TIMEOUT, **kwargs)  # type: ignore[arg-type]


SMALL: Arrays = {
    "model.embed_tokens.weight": np.zeros((16, 8), dtype=np.float16),
    "model.norm.weight": np.ones((8,), dtype=np.float32),
    "lm_head.step": np.zeros((), dtype=np.int64),
}


def test_single_file_config_and_exact_tensors(hub: FakeHub, tmp_path: Path) -> None:
    hub.repos["org/small"] = Repo(
        {"config.json": json.dumps(CONFIG).encode(), "model.safetensors": _safetensors(SMALL)}
    )

    model = _fetch(hub, "org/small")

    assert model.repo_id == "org/small"
    assert model.revision is None
    assert model.config == CONFIG
    assert model.checkpoint is not None
    assert set(model.checkpoint.tensors) == {
        CheckpointTensor("model.embed_tokens.weight", "F16", (16, 8), 256),
        CheckpointTensor("model.norm.weight", "F32", (8,), 32),
        CheckpointTensor("lm_head.step", "I64", (), 8),
    }
    assert model.checkpoint.total_bytes == 296
    assert model.checkpoint.bytes_by_dtype() == {"F16": 256, "F32": 32, "I64": 8}
    assert model.checkpoint.source == "safetensors headers (hub: org/small)"
    # The same numbers as reading the file locally.
    save_file(SMALL, str(tmp_path / "model.safetensors"))
    local = read_checkpoint(tmp_path)
    assert local is not None
    assert set(local.tensors) == set(model.checkpoint.tensors)


def test_requests_pin_the_commit_and_ask_only_for_headers(hub: FakeHub) -> None:
    big: Arrays = {"w": np.zeros((64, 1024), dtype=np.float32)}  # 256 KiB of data
    data = _safetensors(big)
    hub.repos["org/big"] = Repo({"config.json": b"{}", "model.safetensors": data})

    model = _fetch(hub, "org/big", revision="main")

    assert model.revision == "main"
    assert model.checkpoint is not None
    assert model.checkpoint.total_bytes == 64 * 1024 * 4
    paths = [(method, path) for method, path, _, _ in hub.requests]
    assert paths[0] == ("GET", "/api/models/org/big/revision/main")
    # config.json at the revision asked (so the cache records refs/main), the rest at the
    # commit the hub answered with
    assert all("/resolve/main/config.json" in p for _, p in paths[1:3]), paths
    assert all(f"/resolve/{SHA}/" in p for _, p in paths[3:]), paths
    ranges = [r for _, p, r, _ in hub.requests if p.endswith("model.safetensors")]
    assert ranges == ["bytes=0-100000"]
    assert hub.sent[f"/org/big/resolve/{SHA}/model.safetensors"] == 100_001 < len(data)


def test_large_header_takes_a_second_range_request(hub: FakeHub) -> None:
    many: Arrays = {"model.router.weight": np.zeros((2,), np.uint8)}
    many |= {
        f"model.layers.{i}.self_attn.q_proj.weight": np.zeros((3, 2), np.float16)
        for i in range(1500)
    }
    hub.repos["org/many"] = Repo({"config.json": b"{}", "model.safetensors": _safetensors(many)})

    model = _fetch(hub, "org/many")

    assert model.checkpoint is not None
    assert len(model.checkpoint.tensors) == 1501
    assert model.checkpoint.total_bytes == 2 + 1500 * 12
    ranges = [r for _, p, r, _ in hub.requests if p.endswith("model.safetensors")]
    assert len(ranges) == 2 and ranges[0] == "bytes=0-100000"


def test_sharded_checkpoint_reads_every_shard_header(hub: FakeHub, tmp_path: Path) -> None:
    shard1: Arrays = {
        "a.weight": np.zeros((4, 4), np.float16),
        "b.weight": np.zeros((4,), np.float32),
    }
    shard2: Arrays = {"c.weight": np.zeros((2, 3), np.int8)}
    weight_map = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00001-of-00002.safetensors",
        "c.weight": "model-00002-of-00002.safetensors",
    }
    index = {"metadata": {"total_size": 54}, "weight_map": weight_map}
    hub.repos["org/sharded"] = Repo(
        {
            "config.json": json.dumps(CONFIG).encode(),
            "model.safetensors.index.json": json.dumps(index).encode(),
            "model-00001-of-00002.safetensors": _safetensors(shard1),
            "model-00002-of-00002.safetensors": _safetensors(shard2),
        }
    )

    model = _fetch(hub, "org/sharded")

    assert model.checkpoint is not None
    assert sorted(model.checkpoint.tensors, key=lambda t: t.name) == [
        CheckpointTensor("a.weight", "F16", (4, 4), 32),
        CheckpointTensor("b.weight", "F32", (4,), 16),
        CheckpointTensor("c.weight", "I8", (2, 3), 6),
    ]
    assert model.checkpoint.total_bytes == 54
    shard_gets = {p for m, p, r, _ in hub.requests if r is not None}
    assert shard_gets == {
        f"/org/sharded/resolve/{SHA}/model-00001-of-00002.safetensors",
        f"/org/sharded/resolve/{SHA}/model-00002-of-00002.safetensors",
    }
    # config.json and the index are in the HF cache, laid out by huggingface_hub; no weights
    repo = tmp_path / "hf" / "hub" / "models--org--sharded"
    assert (repo / "refs" / "main").read_text() == SHA
    cached = sorted(p.name for p in (repo / "snapshots" / SHA).iterdir())
    assert cached == ["config.json", "model.safetensors.index.json"]


def test_repo_without_safetensors_has_no_checkpoint(hub: FakeHub) -> None:
    hub.repos["org/bin"] = Repo(
        {"config.json": b'{"model_type": "gpt2"}', "pytorch_model.bin": b"x"}
    )

    model = _fetch(hub, "org/bin")

    assert model.config == {"model_type": "gpt2"}
    assert model.checkpoint is None
    assert not any(p.endswith(".bin") for _, p, _, _ in hub.requests)


def test_token_is_sent_to_the_hub(hub: FakeHub) -> None:
    hub.repos["org/small"] = Repo({"config.json": b"{}", "model.safetensors": _safetensors(SMALL)})

    _fetch(hub, "org/small", token="hf_test_token")

    assert {auth for _, _, _, auth in hub.requests} == {"Bearer hf_test_token"}


def test_missing_repo_names_it(hub: FakeHub) -> None:
    with pytest.raises(HubError) as info:
        _fetch(hub, "org/nope")

    message = str(info.value)
    assert "org/nope was not found" in message
    assert hub.endpoint in message and "HTTP 404" in message
    assert "\n" not in message
    assert isinstance(info.value, ModelSpecError)
    assert info.value.value == "org/nope"


def test_missing_revision_names_it(hub: FakeHub) -> None:
    hub.repos["org/small"] = Repo({"config.json": b"{}"})

    with pytest.raises(HubError, match="org/small has no revision 'v9'"):
        _fetch(hub, "org/small", revision="v9")


def test_missing_config_json_says_so(hub: FakeHub) -> None:
    hub.repos["org/noconfig"] = Repo({"model.safetensors": _safetensors(SMALL)})

    with pytest.raises(HubError, match=r"org/noconfig on the hub at .* has no config\.json"):
        _fetch(hub, "org/noconfig")


@pytest.mark.parametrize("status", [401, 403])
def test_unauthorized_says_to_set_hf_token(hub: FakeHub, status: int) -> None:
    hub.repos["org/private"] = Repo({"config.json": b"{}"}, status=status)

    with pytest.raises(HubError) as info:
        _fetch(hub, "org/private")

    message = str(info.value)
    assert "HF_TOKEN" in message and f"HTTP {status}" in message and "org/private" in message
    assert "\n" not in message


def test_gated_repo_says_to_accept_terms_and_set_hf_token(hub: FakeHub) -> None:
    hub.repos["org/gated"] = Repo({"config.json": b"{}"}, gated=True)

    with pytest.raises(HubError, match=r"org/gated is gated .* set HF_TOKEN"):
        _fetch(hub, "org/gated")


@pytest.mark.parametrize(
    ("body", "why"),
    [(b"{not json", "is not JSON"), (b"[1, 2]", "is a JSON list, not an object")],
)
def test_malformed_config_json(hub: FakeHub, body: bytes, why: str) -> None:
    hub.repos["org/broken"] = Repo({"config.json": body})

    with pytest.raises(
        HubError, match=rf"config\.json of org/broken on the hub {re.escape(why)}"
    ) as info:
        _fetch(hub, "org/broken")
    assert info.value.field == "config.json"


def test_malformed_index(hub: FakeHub) -> None:
    hub.repos["org/badindex"] = Repo(
        {"config.json": b"{}", "model.safetensors.index.json": b'{"metadata": {}}'}
    )

    with pytest.raises(HubError, match=r"model\.safetensors\.index\.json of org/badindex"):
        _fetch(hub, "org/badindex")


def test_unparseable_safetensors_header(hub: FakeHub) -> None:
    hub.repos["org/junk"] = Repo({"config.json": b"{}", "model.safetensors": b"\xff" * 64})

    with pytest.raises(HubError, match=r"a safetensors header of org/junk .* could not be parsed"):
        _fetch(hub, "org/junk")


def test_invalid_repo_id(hub: FakeHub) -> None:
    with pytest.raises(HubError, match="is not a hub repo id"):
        _fetch(hub, "not a/valid//id")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_unreachable_endpoint_fails_fast() -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()

    with pytest.raises(HubError) as info:
        fetch_hub_model("org/small", endpoint=endpoint, timeout_seconds=1.0)

    assert time.monotonic() - started < 3.0
    message = str(info.value)
    assert f"the hub at {endpoint} could not be reached" in message
    assert "local model directory" in message and "GATEKEEPER_ALLOW_NETWORK" in message
    assert "\n" not in message


def test_silent_endpoint_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # connections queue in the kernel and are never answered
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()

        with pytest.raises(
            HubError, match=r"could not be reached .*Timeout.* the limit is 0\.5 s per request"
        ):
            fetch_hub_model("org/small", endpoint=endpoint, timeout_seconds=0.5)

        assert time.monotonic() - started < 3.0


def test_offline_mode_is_named(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub.repos["org/small"] = Repo({"config.json": b"{}"})

    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set"):
        _fetch(hub, "org/small")
    assert hub.requests == []


ST_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
ST_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ],
    "sentence_bert_config.json": {"max_seq_length": 512},
    "tokenizer_config.json": {"model_max_length": 256},
}


def test_sentence_transformers_files_are_fetched_beside_the_config(
    hub: FakeHub, tmp_path: Path
) -> None:
    """modules.json, sentence_bert_config.json and tokenizer_config.json come into the cache
    with config.json (metadata, never weights), so a hub model vLLM runs as a pooling
    model is sized as one (no LM head), and the next look-up finds them offline."""
    from gatekeeper.estimator.options import ServeOptions
    from gatekeeper.estimator.vllm_method import GpuTarget, estimate
    from gatekeeper.models.source import resolve_model

    files = {name: json.dumps(body).encode() for name, body in ST_FILES.items()}
    hub.repos["org/st"] = Repo({"config.json": json.dumps(ST_LLAMA).encode(), **files})
    hub.repos["org/plain"] = Repo({"config.json": json.dumps(ST_LLAMA).encode()})
    cache = str(tmp_path / "cache")

    model = _fetch(hub, "org/st", cache_dir=str(tmp_path / "first"))  # not ``cache``
    assert model.pooling is not None and model.pooling.pooling
    assert (model.pooling.max_seq_length, model.pooling.tokenizer_max_length) == (512, 256)
    assert not any("1_Pooling" in p for _, p, _, _ in hub.requests)
    assert _fetch(hub, "org/plain", cache_dir=str(tmp_path / "first")).pooling is None
    assert not any("org/plain/resolve" in p and "json" in p and "config.json" not in p
                   for _, p, _, _ in hub.requests)  # fmt: skip

    def spec(repo: str, network: bool) -> Any:
        return resolve_model(repo, allow_network=network, hf_endpoint=hub.endpoint,
                             timeout_seconds=TIMEOUT, download_dir=cache)  # fmt: skip

    hub.requests.clear()
    pooled, plain = spec("org/st", True), spec("org/plain", True)  # from the hub
    assert any(p.endswith("/modules.json") for _, p, _, _ in hub.requests)
    assert pooled.sentence_transformers and pooled.max_position_embeddings == 512
    assert not plain.sentence_transformers and plain.max_position_embeddings == 4096
    gpu = GpuTarget(total_bytes=80 * 2**30, name="H100-80GB")
    options = ServeOptions(max_model_len=256)
    head = 1024 * 128 * 2  # the padded vocabulary x hidden, in bf16
    generating = estimate(plain, options, gpu).worst.weights_bytes
    assert generating - estimate(pooled, options, gpu).worst.weights_bytes == head
    hub.requests.clear()
    offline = spec("org/st", False)  # from the cache alone
    assert not hub.requests
    assert offline.sentence_transformers and offline.max_position_embeddings == 512


def test_a_malformed_side_file_names_it(hub: FakeHub) -> None:
    hub.repos["org/bad"] = Repo(
        {"config.json": json.dumps(ST_LLAMA).encode(), "modules.json": b'{"not": "a list"}'}
    )
    with pytest.raises(HubError, match=r"modules.json of org/bad on the hub is malformed"):
        _fetch(hub, "org/bad")
