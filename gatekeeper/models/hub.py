"""Model facts from the Hugging Face hub: ``config.json`` and safetensors headers, never weights.

One call, ``fetch_hub_model``, makes these requests through ``huggingface_hub``:

1. ``GET /api/models/{repo}[/revision/{rev}]`` (``HfApi.model_info``): the list of files.
   It fails fast (no retries) when the hub is unreachable, the repo is missing or a
   token is needed.
2. ``HEAD`` + ``GET /{repo}/resolve/{rev}/config.json`` (``hf_hub_download`` into the
   Hugging Face cache, ``cache_dir`` or ``HF_HUB_CACHE``): the file lands in
   ``snapshots/COMMIT/`` and a branch or tag in ``refs/``, so the next look-up finds it
   offline (``gatekeeper.models.hf_cache``), as vLLM and transformers would.
3. For sharded checkpoints, ``model.safetensors.index.json`` the same way, at that commit.
4. The files beside the config that change what vLLM builds, where the repo has them, the
   same way into the cache: ``modules.json`` and ``sentence_bert_config.json`` (or a
   sibling; ``gatekeeper.models.sentence_transformers``: a pooling model, its length) and
   ``tokenizer_config.json`` (a pooling model's length cap). Small JSON, never weights.
5. ``GET`` with ``Range: bytes=0-100000`` on each ``*.safetensors`` file
   (``HfApi.parse_safetensors_file_metadata``): the header only, a second range request
   when the header is larger. Headers are not cached (the cache holds whole files): an
   offline look-up of the same model reads the index's ``total_size``, or, for a
   single-file checkpoint, the architecture.

Everything after step 2 is read at the commit step 2 resolved, so config and headers
agree. The repo's file list decides between ``model.safetensors`` and the index, as
``get_safetensors_metadata`` does; it is not called because its existence checks ignore
the timeout.

Each request is limited to ``timeout_seconds``, with two exceptions inside
``hf_hub_download``: the body of ``config.json`` uses ``HF_HUB_DOWNLOAD_TIMEOUT`` (10 s by
default), and ``HF_HUB_ETAG_TIMEOUT``, when set, replaces the limit of its ``HEAD``. If that
``HEAD`` fails on the network after step 1 succeeded, ``hf_hub_download`` retries it
with back-off for about 25 s before giving up. ``endpoint=None`` means
``huggingface_hub``'s default: ``HF_ENDPOINT`` when it was set before import, else
https://huggingface.co. The token is ``token``, else ``HF_TOKEN`` or the saved login.
Every failure is a ``HubError`` whose message says what to do.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)

from gatekeeper.errors import HubError, ModelSpecError
from gatekeeper.models.sentence_transformers import (
    ENCODER_CONFIG_FILES,
    TOKENIZER_CONFIG,
    PoolingFiles,
    read_pooling_files,
)
from gatekeeper.models.spec import CheckpointTensor, CheckpointWeights

__all__ = ["HubModel", "fetch_hub_model"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SIDE_FILES = ("modules.json", *ENCODER_CONFIG_FILES, TOKENIZER_CONFIG)
"""Metadata files fetched beside ``config.json`` when the repo has them."""
_MAX_PARALLEL_HEADERS = 8
_OFFLINE_HINT = (
    "use a local model directory or a name from the embedded catalog instead "
    "(GATEKEEPER_ALLOW_NETWORK=false keeps lookups off the hub)"
)


@dataclass(frozen=True, slots=True)
class HubModel:
    """What the hub says about one model repo."""

    repo_id: str
    revision: str | None
    """The revision asked for (None: the default branch)."""
    config: dict[str, Any]
    """The parsed ``config.json``."""
    checkpoint: CheckpointWeights | None
    """Exact bytes per tensor from the safetensors headers; None without safetensors."""
    pooling: PoolingFiles | None = None
    """The sentence-transformers files and tokenizer config (``SIDE_FILES``); None
    without any."""


def fetch_hub_model(
    repo_id: str,
    *,
    endpoint: str | None,
    timeout_seconds: float,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
) -> HubModel:
    """Read ``config.json`` and the safetensors headers of ``repo_id`` from the hub.

    ``config.json`` and the index are written into the Hugging Face cache (``cache_dir``,
    vLLM's ``--download-dir``, else ``HF_HUB_CACHE``). Raises ``HubError`` for every
    failure: repo or revision missing, token needed, hub unreachable, ``config.json`` or
    a header malformed.
    """
    api = HfApi(endpoint=endpoint, token=token, library_name="gatekeeper")
    try:
        info = api.model_info(repo_id, revision=revision, timeout=timeout_seconds)
        files = {s.rfilename for s in info.siblings or ()}
        first = _Fetch(api, repo_id, revision, cache_dir, timeout_seconds)
        config_path = first.download("config.json")  # writes refs/REVISION too
        fetch = _Fetch(api, repo_id, config_path.parent.name, cache_dir, timeout_seconds)
        config = _read_config(config_path, repo_id)
        for name in SIDE_FILES:
            if name in files:
                fetch.download(name)  # into the same snapshot directory as config.json
        pooling = _read_side_files(config_path.parent, repo_id)
        checkpoint = _read_checkpoint(fetch, files)
    except HubError:
        raise
    except Exception as e:
        raise _hub_error(e, repo_id, api.endpoint, revision, timeout_seconds) from e
    return HubModel(
        repo_id=repo_id, revision=revision, config=config, checkpoint=checkpoint, pooling=pooling
    )


def _read_side_files(snapshot: Path, repo_id: str) -> PoolingFiles | None:
    try:
        return read_pooling_files(snapshot)
    except ModelSpecError as e:
        raise _malformed(repo_id, str(e.field), f"is malformed ({e.message})") from e


@dataclass(frozen=True, slots=True)
class _Fetch:
    """Requests for one repo at one commit."""

    api: HfApi
    repo_id: str
    commit: str | None
    """The revision: a branch or tag for ``config.json``, then the commit it named."""
    cache_dir: str | None
    timeout_seconds: float

    def download(self, filename: str) -> Path:
        path = self.api.hf_hub_download(
            self.repo_id,
            filename,
            revision=self.commit,
            cache_dir=self.cache_dir,
            etag_timeout=self.timeout_seconds,
        )
        return Path(path)

    def tensors(self, filename: str) -> list[CheckpointTensor]:
        """The tensors one safetensors file declares, from its header alone."""
        header = self.api.parse_safetensors_file_metadata(
            self.repo_id, filename, revision=self.commit, timeout=self.timeout_seconds
        )
        return [
            CheckpointTensor(
                name=name,
                dtype=str(info.dtype),
                shape=tuple(int(d) for d in info.shape),
                num_bytes=int(info.data_offsets[1]) - int(info.data_offsets[0]),
            )
            for name, info in header.tensors.items()
        ]


def _read_config(path: Path, repo_id: str) -> dict[str, Any]:
    try:
        config = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _malformed(repo_id, "config.json", f"is not JSON ({e})") from e
    if not isinstance(config, dict):
        raise _malformed(
            repo_id, "config.json", f"is a JSON {type(config).__name__}, not an object"
        )
    return config


def _read_checkpoint(fetch: _Fetch, files: set[str]) -> CheckpointWeights | None:
    """Tensors from every safetensors header, None when the repo has no safetensors."""
    if SINGLE_FILE in files:
        shards = [SINGLE_FILE]
    elif INDEX_FILE in files:
        shards = _shards(fetch.download(INDEX_FILE), fetch.repo_id)
    else:
        return None
    workers = max(1, min(_MAX_PARALLEL_HEADERS, len(shards)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gatekeeper-hub") as pool:
        per_file = list(pool.map(fetch.tensors, shards))
    tensors = tuple(t for file_tensors in per_file for t in file_tensors)
    return CheckpointWeights(
        total_bytes=sum(t.num_bytes for t in tensors),
        tensors=tensors,
        source=f"safetensors headers (hub: {fetch.repo_id})",
    )


def _shards(index_path: Path, repo_id: str) -> list[str]:
    """The shard files an index names, sorted."""
    try:
        index = json.loads(index_path.read_bytes())
        weight_map = index["weight_map"]
        shards = sorted({str(f) for f in weight_map.values()})
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _malformed(repo_id, INDEX_FILE, "has no weight_map object") from e
    if not shards:
        raise _malformed(repo_id, INDEX_FILE, "has an empty weight_map")
    return shards


def _malformed(repo_id: str, filename: str, why: str) -> HubError:
    return HubError(
        f"{filename} of {repo_id} on the hub {why}. Fix the repo, pass another revision, "
        "or use a local model directory with a valid file",
        field=filename,
        value=repo_id,
    )


def _hub_error(
    e: Exception, repo_id: str, endpoint: str, revision: str | None, timeout_seconds: float
) -> HubError:
    """One ``HubError`` for anything ``huggingface_hub`` or the network raised."""
    where = f"the hub at {endpoint}"
    if isinstance(e, LocalEntryNotFoundError) and isinstance(e.__cause__, Exception):
        e = e.__cause__  # hf_hub_download's "not in the local cache" hides the HEAD failure
    if isinstance(e, HfHubHTTPError):
        message = _http_message(e, repo_id, where, revision)
    elif isinstance(e, OfflineModeIsEnabled):
        message = f"HF_HUB_OFFLINE is set, so {where} is not contacted for {repo_id}; unset it or {_OFFLINE_HINT}"
    elif isinstance(e, httpx2.TransportError | LocalEntryNotFoundError | ConnectionError):
        message = _unreachable_message(e, repo_id, where, timeout_seconds)
    elif isinstance(e, FileMetadataError):
        message = (
            f"{where} does not answer like a Hugging Face hub for {repo_id} ({_first_line(e)}). "
            f"Check GATEKEEPER_HF_ENDPOINT, or {_OFFLINE_HINT}"
        )
    elif isinstance(e, HFValidationError):
        message = f"{repo_id!r} is not a hub repo id; use the form owner/name ({_first_line(e)})"
    elif isinstance(e, SafetensorsParsingError):
        message = (
            f"a safetensors header of {repo_id} on {where} could not be parsed ({_first_line(e)}). "
            "Pass another revision, or use a local model directory"
        )
    else:
        message = (
            f"reading {repo_id} from {where} failed ({type(e).__name__}: {_first_line(e)}). "
            f"Retry, or {_OFFLINE_HINT}"
        )
    return HubError(message, field="repo_id", value=repo_id)


def _unreachable_message(e: Exception, repo_id: str, where: str, timeout_seconds: float) -> str:
    detail = f"{type(e).__name__}: {_first_line(e)}"
    if isinstance(e, httpx2.TimeoutException):
        detail += f"; the limit is {timeout_seconds:g} s per request"
    return (
        f"{where} could not be reached for {repo_id} ({detail}). "
        f"Check the network or GATEKEEPER_HF_ENDPOINT, or {_OFFLINE_HINT}"
    )


def _http_message(e: HfHubHTTPError, repo_id: str, where: str, revision: str | None) -> str:
    status = e.response.status_code
    if isinstance(e, GatedRepoError):
        return (
            f"{repo_id} is gated on {where} (HTTP {status}). Accept its terms on the model page, "
            "then set HF_TOKEN to a token of that account"
        )
    if isinstance(e, RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r} on {where}. Pass an existing branch, tag or commit"
    if isinstance(e, RemoteEntryNotFoundError):
        filename = e.response.url.path.rsplit("/", 1)[-1]
        return (
            f"{repo_id} on {where} has no {filename} (HTTP {status}); vLLM cannot load it as is. "
            "Check the repo id, or use a local model directory"
        )
    if status == 401:
        return (
            f"{repo_id} is private, gated or missing on {where} (HTTP 401). "
            "Set HF_TOKEN to a token that can read it, or check the repo id"
        )
    if status == 403:
        return f"{where} refused access to {repo_id} (HTTP 403). Set HF_TOKEN to a token with read access to it"
    if status == 404:
        return f"{repo_id} was not found on {where} (HTTP 404). Check the repo id (owner/name) and the endpoint"
    return f"{where} answered HTTP {status} for {repo_id}. Retry later, or {_OFFLINE_HINT}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "no details"
