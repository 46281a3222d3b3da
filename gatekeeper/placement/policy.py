"""The operator's rules for placing workers (``PlacementPolicy``): the safety margin kept
free on every GPU, which GPUs may be used, whether workers share GPUs, and the release
whose accounting applies. Its own module so that reading the settings
(``gatekeeper.settings``) does not load the placement's machinery."""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.units import MIB

__all__ = ["PlacementPolicy"]


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """The operator's rules for placing workers."""

    margin_bytes: int = 512 * MIB
    margin_fraction: float = 0.02
    allowed_gpus: frozenset[str] | None = None
    """GPU indices (as strings) or UUIDs gatekeeper may use; None = all."""
    share_gpus: bool = False
    """Several workers on one GPU, each with a byte budget (--kv-cache-memory-bytes)."""
    shared_kv_sequences: int = 8
    """With ``share_gpus``, the sequences of max_model_len a worker's KV budget holds when
    the request sets no budget of its own: min(max_num_seqs, this), else the most that
    fit down to the request's ``min_sequences`` (``gatekeeper.placement.gpu_search``)."""
    allow_pipeline: bool = False
    default_vllm_version: str = DEFAULT_VLLM_VERSION
    """The release whose accounting applies when the options name none."""

    def margin_for(self, total_bytes: int) -> int:
        """The safety margin kept free on a GPU of ``total_bytes``: the fixed bytes plus
        the fraction of the total. The one margin rule of placement, the webhook and the
        headroom metrics."""
        return self.margin_bytes + int(self.margin_fraction * total_bytes)
