"""Which models the sidecar may serve, and how: the configured entries and the allowed
patterns. A worker is launched only for a name this registry knows.

A pattern matches only a well-formed model reference, so a client cannot walk out of
it (``Qwen/*`` must not match ``Qwen/../..``):

- a hub repo id ``ORG/NAME`` as the hub allows it (letters, digits, ``_ - .``, each part
  starting and ending with a letter, digit or ``_``, no ``--`` or ``..``, not ending in
  ``.git``, at most 96 characters), for a pattern that is not an absolute path;
- an absolute, normalised local path (no ``.`` or ``..`` segment, no ``//``, no ``~``,
  backslash or control character, at most 1024 characters), only for a pattern the
  operator wrote as an absolute path (``/models/*``).

Anything else is refused before any look-up, with a message that does not depend on
what exists on disk. A ``[[models]]`` entry is matched by its name and may point
anywhere the operator chose.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimator.options import draft_reference
from gatekeeper.models.catalog import catalog_entries, find_in_catalog
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.types import PlacementRequest, auto_parallel
from gatekeeper.settings import ModelEntry
from gatekeeper.vllm.flags import model_location, options_from_mapping

__all__ = ["ModelNotAllowed", "ModelRegistry", "pattern_allows"]

REPO_ID_MAX_CHARS = 96
"""The hub's limit on a repo id."""
LOCAL_PATH_MAX_CHARS = 1024

_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_PATH_CHARS = re.compile(r"[A-Za-z0-9_.+@=,:/-]+")


def _is_repo_id(name: str) -> bool:
    return (
        len(name) <= REPO_ID_MAX_CHARS
        and _REPO_ID.fullmatch(name) is not None
        and "--" not in name
        and ".." not in name
        and not name.endswith(".git")
    )


def _is_local_path(name: str) -> bool:
    return (
        len(name) <= LOCAL_PATH_MAX_CHARS
        and name.startswith("/")
        and _PATH_CHARS.fullmatch(name) is not None
        and posixpath.normpath(name) == name
        and not any(part in (".", "..") for part in name.split("/"))
    )


def pattern_allows(pattern: str, name: str) -> bool:
    """Whether ``allowed_models`` pattern ``pattern`` lets a client ask for ``name``: a
    well-formed repo id for a hub pattern, a normalised absolute path for a pattern
    written as an absolute path; never anything else."""
    if pattern.startswith("/"):
        return _is_local_path(name) and fnmatch.fnmatchcase(name, pattern)
    return _is_repo_id(name) and fnmatch.fnmatchcase(name, pattern)


class ModelNotAllowed(GatekeeperError):
    """The model is neither configured nor allowed by a pattern."""


@dataclass(frozen=True, slots=True)
class ModelRegistry:
    entries: tuple[ModelEntry, ...]
    patterns: tuple[str, ...]
    resolve_spec: Callable[..., ModelSpec]
    """A model reference to its spec; takes vLLM's ``revision`` and ``download_dir``."""
    release: str | None = None
    """The vLLM release the sidecar runs (settings' ``default_vllm_version``): options are
    read with its flag table unless they name their own ``vllm_version``."""

    @classmethod
    def create(
        cls,
        entries: Sequence[ModelEntry],
        patterns: Sequence[str],
        resolve_spec: Callable[..., ModelSpec],
        release: str | None = None,
    ) -> ModelRegistry:
        return cls(tuple(entries), tuple(patterns), resolve_spec, release)

    def entry(self, name: str) -> ModelEntry | None:
        """The configured entry clients call ``name``, or one made from a matching pattern."""
        for e in self.entries:
            if e.name == name:
                return e
        if any(pattern_allows(p, name) for p in self.patterns):
            return ModelEntry(name=name, model=name)
        return None

    def alias(self, name: str) -> str | None:
        """The allowed model a catalog alias (``gemma3``, ``qwen3:0.6b``) stands for:
        its repo id, when the configuration allows it; else None."""
        found = find_in_catalog(name)
        if found is None or self.entry(found.repo_id) is None:
            return None
        return found.repo_id

    def listed(self) -> list[ModelEntry]:
        """The models to list for clients: the configured entries, then the catalog's
        models that a pattern allows (a pattern cannot be listed otherwise)."""
        named = {e.name for e in self.entries}
        matched = [
            ModelEntry(name=c.repo_id, model=c.repo_id)
            for c in catalog_entries()
            if c.repo_id not in named and any(pattern_allows(p, c.repo_id) for p in self.patterns)
        ]
        return [*self.entries, *matched]

    def allowed(self, name: str) -> ModelEntry:
        entry = self.entry(name)
        if entry is None:
            known = ", ".join(e.name for e in self.entries) or "none configured"
            shown = name if len(name) <= 200 else name[:200] + "..."
            raise ModelNotAllowed(
                f"model: {shown!r} is not allowed on this node (configured: {known}; patterns: "
                f"{', '.join(self.patterns) or 'none'}; a pattern matches only a hub repo id "
                "ORG/NAME, or a normalised path under a pattern written as an absolute path); "
                "add it to GATEKEEPER_MODELS or GATEKEEPER_ALLOWED_MODELS",
                field="model",
                value=shown,
            )
        return entry

    def request(
        self, entry: ModelEntry, overrides: dict[str, object] | None = None
    ) -> PlacementRequest:
        """The placement request for an entry, with optional option overrides."""
        serve, given = options_from_mapping(
            {**entry.options, **(overrides or {})},
            where=f"options of {entry.name}",
            release=self.release,
        )
        draft = draft_reference(serve)
        # the model as the worker will load it: at the revision, from the download dir
        located = model_location(serve)
        return PlacementRequest(
            model=self.resolve_spec(entry.model, **located),
            options=serve,
            auto_parallel=auto_parallel(given),
            min_kv_tokens=entry.min_kv_tokens,
            min_sequences=entry.min_sequences,
            draft=self.resolve_spec(draft) if draft else None,
        )
