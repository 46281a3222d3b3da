"""Resolve a model reference into a ``ModelSpec``: a local directory, the embedded
catalog, or (when allowed) the Hugging Face hub, in that order."""

from __future__ import annotations

import json
from pathlib import Path

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.catalog import catalog_entries, find_in_catalog
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.safetensors import read_checkpoint
from gatekeeper.models.spec import ModelSpec

__all__ = ["load_model_dir", "resolve_model"]


def load_model_dir(directory: Path) -> ModelSpec:
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
    return spec_from_config(
        config,
        name=directory.name,
        source=f"local directory {directory}",
        checkpoint=read_checkpoint(directory),
        reference=str(directory.resolve()),
    )


def resolve_model(
    reference: str,
    *,
    allow_network: bool = False,
    hf_endpoint: str | None = None,
    timeout_seconds: float = 10.0,
) -> ModelSpec:
    """Turn ``reference`` (a path, a catalog name or a hub repo id) into a ``ModelSpec``."""
    try:
        path = Path(reference).expanduser()
    except RuntimeError:  # "~user" with no such user: not a local path
        path = Path(reference)
    if path.is_dir():
        return load_model_dir(path)
    entry = find_in_catalog(reference)
    if entry is not None:
        return spec_from_config(
            entry.config,
            name=entry.repo_id,
            source=f"embedded catalog ({entry.provenance})",
            declared_parameters=entry.parameters,
        )
    if allow_network and "/" in reference:
        from gatekeeper.models.hub import fetch_hub_model

        model = fetch_hub_model(reference, endpoint=hf_endpoint, timeout_seconds=timeout_seconds)
        return spec_from_config(
            model.config, name=reference, source="Hugging Face hub", checkpoint=model.checkpoint
        )
    hint = (
        "set GATEKEEPER_ALLOW_NETWORK=true to look it up on the hub, " if not allow_network else ""
    )
    raise ModelSpecError(
        f"model: {reference!r} is not a local directory nor in the catalog "
        f"({len(catalog_entries())} models: gatekeeper models lists them); {hint}"
        "or give a directory holding its config.json",
        field="model",
        value=reference,
    )
