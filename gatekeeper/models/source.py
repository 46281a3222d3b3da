"""Resolve a model reference into a ``ModelSpec`` as vLLM resolves ``vllm serve MODEL``.

In order:

1. a local path: a checkpoint directory (``config.json`` plus the safetensors headers), or
   a GGUF file (``gatekeeper.models.gguf``);
2. the Hugging Face cache (``gatekeeper.models.hf_cache``): ``--download-dir``, then
   ``HF_HUB_CACHE``, at ``--revision`` (a branch or tag through ``refs/``, or a commit),
   offline, the snapshot read as a checkpoint directory;
3. the hub, when ``allow_network`` and ``HF_HUB_OFFLINE`` is not set (config and
   safetensors metadata only, written into the cache so that step 2 finds it next time);
4. the embedded catalog, gatekeeper's offline fallback: used when the hub is not asked,
   or when it fails (a gated repo without a token, no network) and no revision was
   named, since the catalog holds one published config per model and no revisions.

A catalog model costs one ``stat`` of the cache before the catalog answers. A cached
or hub model is named by its repo id (``ORG/NAME``), and the repo id is what vLLM is
given (``ModelSpec.reference``): vLLM finds the same cache itself (same ``HF_HOME``) and
serves the model under that name, which routing uses. A cache snapshot given as a path
is named by its repo too, and vLLM is given the path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gatekeeper.errors import HubError, ModelSpecError
from gatekeeper.models.catalog import CatalogEntry, catalog_entries, find_in_catalog
from gatekeeper.models.hf_cache import (
    CachedSnapshot,
    cache_dirs,
    find_cached,
    hf_download_hint,
    is_offline,
    looks_like_repo_id,
    snapshot_repo_id,
)
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.safetensors import read_checkpoint
from gatekeeper.models.sentence_transformers import pooling_files, read_pooling_files
from gatekeeper.models.spec import ModelSpec

__all__ = ["MODEL_SOURCE_FLAGS", "load_model_dir", "resolve_model"]

MODEL_SOURCE_FLAGS = ("revision", "download_dir", "tokenizer")
"""``vllm serve`` flags that say where the model comes from, not what memory it takes:
``--revision`` and ``--download-dir`` steer the look-up, ``--tokenizer`` (a GGUF file's
tokenizer repo) is accepted and changes nothing."""


def load_model_dir(
    directory: Path,
    *,
    name: str | None = None,
    source: str | None = None,
    reference: str = "",
    overrides: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """A local checkpoint directory: ``config.json`` plus safetensors headers if present."""
    path = directory / "config.json"
    if not path.is_file():
        raise ModelSpecError(
            f"model: {str(directory)!r} is a directory without config.json; "
            "point at a Hugging Face checkpoint directory",
            field="model",
            value=str(directory),
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSpecError(
            f"model: {path} is not valid JSON ({e}); fix or replace the file",
            field="config.json",
            value=str(path),
        ) from e
    spec = spec_from_config(
        _with_modelopt_config(config, directory),
        name=name or snapshot_repo_id(directory) or directory.name,
        source=source or f"local directory {directory}",
        checkpoint=read_checkpoint(directory),
        reference=reference or str(directory.resolve()),
        overrides=overrides,
        pooling=read_pooling_files(directory),
    )
    return replace(spec, config_path=str(path.resolve()))


def _with_modelopt_config(config: Any, directory: Path) -> Any:
    """ModelOpt checkpoints keep their scheme in ``hf_quant_config.json`` beside the config;
    vLLM reads it when ``config.json`` has no ``quantization_config``, and so does this."""
    path = directory / "hf_quant_config.json"
    if not isinstance(config, dict) or config.get("quantization_config") or not path.is_file():
        return config
    try:
        quant = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSpecError(
            f"model: {path} is not valid JSON ({e}); fix or replace the file",
            field="hf_quant_config.json",
            value=str(path),
        ) from e
    return _with_quant(config, quant)


def _with_quant(config: Any, quant: Any) -> Any:
    """``config`` with ModelOpt's ``hf_quant_config.json`` as its ``quantization_config``
    where it names none."""
    if not isinstance(config, dict) or config.get("quantization_config"):
        return config
    return {**config, "quantization_config": quant} if isinstance(quant, dict) else config


def resolve_model(
    reference: str,
    *,
    allow_network: bool = False,
    hf_endpoint: str | None = None,
    timeout_seconds: float = 10.0,
    revision: str | None = None,
    download_dir: str | None = None,
    hf_overrides: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """Turn ``reference`` (a path, a GGUF file, a cached or hub repo id, a catalog name)
    into a ``ModelSpec``; ``revision``, ``download_dir`` and ``hf_overrides`` are vLLM's
    flags (the overrides are laid over the config before it is read)."""
    return _resolve(
        reference, allow_network, hf_endpoint, timeout_seconds, revision, download_dir,
        hf_overrides,
    )  # fmt: skip


def _resolve(
    reference: str,
    allow_network: bool,
    hf_endpoint: str | None,
    timeout_seconds: float,
    revision: str | None,
    download_dir: str | None,
    overrides: Mapping[str, Any] | None,
) -> ModelSpec:
    local = _local(reference, overrides)
    if local is not None:
        return local
    miss: ModelSpecError | None = None
    try:
        cached = find_cached(reference, revision=revision, download_dir=download_dir)
    except ModelSpecError as not_at_revision:
        cached, miss = None, not_at_revision
    if cached is not None:
        return _load_snapshot(cached, overrides)
    entry = find_in_catalog(reference)
    hub_allowed = allow_network and not is_offline() and looks_like_repo_id(reference)
    if hub_allowed:
        try:
            return _from_hub(
                reference, hf_endpoint, timeout_seconds, revision, download_dir, overrides
            )
        except HubError as e:
            if entry is None or revision is not None:
                raise
            return _from_catalog(entry, f"; the hub look-up failed: {e}", overrides)
    if miss is not None and (revision is not None or entry is None):
        raise miss
    if entry is not None and revision is None:
        return _from_catalog(entry, overrides=overrides)
    raise _not_found(reference, allow_network, revision, download_dir, in_catalog=entry is not None)


def _local(reference: str, overrides: Mapping[str, Any] | None = None) -> ModelSpec | None:
    """A checkpoint directory or a GGUF file at ``reference``; None when it is no path."""
    try:
        path = Path(reference).expanduser()
    except RuntimeError:  # "~user" with no such user: not a local path
        path = Path(reference)
    if path.is_dir():
        return load_model_dir(path, overrides=overrides)
    if path.is_file():
        from gatekeeper.models.gguf import is_gguf_file, load_gguf

        if is_gguf_file(path):
            return load_gguf(path, overrides)
        raise ModelSpecError(
            f"model: {reference!r} is a file that is not GGUF; vLLM takes a checkpoint "
            "directory, a GGUF file or a hub repo id",
            field="model",
            value=reference,
        )
    if path.suffix.lower() == ".gguf":
        raise ModelSpecError(
            f"model: GGUF file {reference!r} does not exist; check the path",
            field="model",
            value=reference,
        )
    return None


def _load_snapshot(cached: CachedSnapshot, overrides: Mapping[str, Any] | None = None) -> ModelSpec:
    pinned = (
        cached.commit[:12]
        if cached.revision == cached.commit
        else f"{cached.revision} = {cached.commit[:12]}"
    )
    return load_model_dir(
        cached.directory,
        name=cached.repo_id,
        source=f"Hugging Face cache ({pinned}, {cached.directory})",
        reference=cached.repo_id,
        overrides=overrides,
    )


def _from_hub(
    reference: str,
    endpoint: str | None,
    timeout_seconds: float,
    revision: str | None,
    download_dir: str | None,
    overrides: Mapping[str, Any] | None = None,
) -> ModelSpec:
    from gatekeeper.models.hub import fetch_hub_model

    model = fetch_hub_model(
        reference,
        endpoint=endpoint,
        timeout_seconds=timeout_seconds,
        revision=revision,
        cache_dir=download_dir,
    )
    return spec_from_config(
        model.config,
        name=reference,
        source="Hugging Face hub" + (f" (revision {revision})" if revision else ""),
        checkpoint=model.checkpoint,
        overrides=overrides,
        pooling=model.pooling,
    )


def _from_catalog(
    entry: CatalogEntry, note: str = "", overrides: Mapping[str, Any] | None = None
) -> ModelSpec:
    return spec_from_config(
        _with_quant(entry.config, entry.files.get("hf_quant_config.json")),
        name=entry.repo_id,
        source=f"embedded catalog ({entry.provenance}){note}",
        declared_parameters=entry.parameters,
        overrides=overrides,
        pooling=pooling_files(entry.files.get, f"the catalog's {entry.repo_id}"),
    )


def _not_found(
    reference: str,
    allow_network: bool,
    revision: str | None,
    download_dir: str | None,
    *,
    in_catalog: bool,
) -> ModelSpecError:
    caches = ", ".join(str(c) for c in cache_dirs(download_dir))
    at = f" at revision {revision!r}" if revision else ""
    if in_catalog:
        what = (
            f"model: {reference!r}{at} is not in the Hugging Face cache ({caches}); the "
            "embedded catalog holds one published config and no revisions"
        )
        todo = "drop --revision to use the catalog's config, or download that revision"
    elif not looks_like_repo_id(reference):
        what = (
            f"model: {reference!r} is not a local directory or GGUF file, nor in the "
            f"embedded catalog ({len(catalog_entries())} models: gatekeeper models lists them)"
        )
        todo = (
            "give a checkpoint directory, a GGUF file, a catalog name or a hub repo id (ORG/NAME)"
        )
    else:
        what = (
            f"model: {reference!r}{at} is not a local directory, not in the Hugging Face "
            f"cache ({caches}) nor in the embedded catalog ({len(catalog_entries())} models: "
            "gatekeeper models lists them)"
        )
        todo = f"download it ({hf_download_hint(reference, revision)})"
    if is_offline() and looks_like_repo_id(reference):
        what += "; HF_HUB_OFFLINE is set, so the hub is not asked"
        todo += " while online, or unset HF_HUB_OFFLINE"
    elif not allow_network and looks_like_repo_id(reference):
        todo += ", or set GATEKEEPER_ALLOW_NETWORK=true to look it up on the hub"
    return ModelSpecError(f"{what}. {todo[0].upper()}{todo[1:]}", field="model", value=reference)
