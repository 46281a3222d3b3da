"""The embedded catalog: popular open models' ``config.json`` shipped in the package.

One JSON file per model in ``gatekeeper/catalog/``: ``repo_id``, ``aliases``,
``provenance`` (where the values come from), ``parameters`` (published count, when
known), ``config`` and, where the checkpoint has them, ``files``: the small JSON files
beside its ``config.json`` that vLLM reads too (``hf_quant_config.json``, ``modules.json``,
``sentence_bert_config.json``, ``tokenizer_config.json``), by name; ``implicit_defaults``
marks a config read with its class's defaults filled in. Lookup ignores case and accepts
aliases such as ``llama3.1:8b``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from types import MappingProxyType
from typing import Any

__all__ = ["CatalogEntry", "catalog_entries", "find_in_catalog"]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    repo_id: str
    aliases: tuple[str, ...]
    provenance: str
    parameters: int | None
    config: dict[str, Any]
    files: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The JSON files published beside ``config.json`` (name -> parsed content)."""
    implicit_defaults: bool = False
    """The config leaves class defaults implicit that change how it reads (transformers 5
    configs of Gemma 4, GLM-5, Kimi-K2.5 ...): it is read with its class's defaults filled
    in, as vLLM's transformers reads it, not as written."""


@cache
def catalog_entries() -> tuple[CatalogEntry, ...]:
    """Every catalog entry, sorted by repo id."""
    entries = [_read(key) for key in _files()]
    return tuple(sorted(entries, key=lambda e: e.repo_id.lower()))


@cache
def _files() -> dict[str, Traversable]:
    """The catalog's files by the repo id their names spell (``owner__name.json`` for
    ``owner/name``; ``tests/models/test_catalog.py`` holds every file to it), lowercased."""
    folder = resources.files("gatekeeper").joinpath("catalog")
    return {
        item.name.removesuffix(".json").replace("__", "/", 1).lower(): item
        for item in folder.iterdir()
        if item.name.endswith(".json")
    }


@cache
def _read(key: str) -> CatalogEntry:
    raw = json.loads(_files()[key].read_text())
    return CatalogEntry(
        repo_id=raw["repo_id"],
        aliases=tuple(raw.get("aliases", ())),
        provenance=raw.get("provenance", ""),
        parameters=raw.get("parameters"),
        config=raw["config"],
        files=MappingProxyType(dict(raw.get("files", {}))),
        implicit_defaults=bool(raw.get("implicit_defaults", False)),
    )


@cache
def _index() -> dict[str, CatalogEntry]:
    index: dict[str, CatalogEntry] = {}
    for entry in catalog_entries():
        for key in (entry.repo_id, entry.repo_id.split("/")[-1], *entry.aliases):
            index.setdefault(key.lower(), entry)
    return index


def find_in_catalog(reference: str) -> CatalogEntry | None:
    """The catalog entry for a repo id, its bare name or an alias (case-insensitive).
    A full repo id reads its one file; a bare name or an alias reads the whole catalog
    once (#39: every ``gatekeeper estimate`` read all of it)."""
    key = reference.strip().lower()
    if key in _files():
        entry = _read(key)
        if entry.repo_id.lower() == key:  # a file whose name does not spell its repo id
            return entry  # is found through the index below
    return _index().get(key)
