"""Which models the sidecar may serve, and how: the configured entries and the allowed
patterns. A worker is launched only for a name this registry knows."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gatekeeper.errors import GatekeeperError
from gatekeeper.estimate.options import draft_reference
from gatekeeper.models.spec import ModelSpec
from gatekeeper.placement.types import PlacementRequest, auto_parallel
from gatekeeper.settings import ModelEntry
from gatekeeper.vllm.flags import model_location, options_from_mapping

__all__ = ["ModelNotAllowed", "ModelRegistry"]


class ModelNotAllowed(GatekeeperError):
    """The model is neither configured nor allowed by a pattern."""


@dataclass(frozen=True, slots=True)
class ModelRegistry:
    entries: tuple[ModelEntry, ...]
    patterns: tuple[str, ...]
    resolve_spec: Callable[..., ModelSpec]
    """A model reference to its spec; takes vLLM's ``revision`` and ``download_dir``."""

    @classmethod
    def create(
        cls,
        entries: Sequence[ModelEntry],
        patterns: Sequence[str],
        resolve_spec: Callable[..., ModelSpec],
    ) -> ModelRegistry:
        return cls(tuple(entries), tuple(patterns), resolve_spec)

    def entry(self, name: str) -> ModelEntry | None:
        """The configured entry clients call ``name``, or one made from a matching pattern."""
        for e in self.entries:
            if e.name == name:
                return e
        if any(fnmatch.fnmatchcase(name, p) for p in self.patterns):
            return ModelEntry(name=name, model=name)
        return None

    def allowed(self, name: str) -> ModelEntry:
        entry = self.entry(name)
        if entry is None:
            known = ", ".join(e.name for e in self.entries) or "none configured"
            raise ModelNotAllowed(
                f"model: {name!r} is not allowed on this node (configured: {known}; patterns: "
                f"{', '.join(self.patterns) or 'none'}); add it to GATEKEEPER_MODELS or "
                "GATEKEEPER_ALLOWED_MODELS",
                field="model",
                value=name,
            )
        return entry

    def request(
        self, entry: ModelEntry, overrides: dict[str, object] | None = None
    ) -> PlacementRequest:
        """The placement request for an entry, with optional option overrides."""
        serve, given = options_from_mapping(
            {**entry.options, **(overrides or {})}, where=f"options of {entry.name}"
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
