"""What the reservations ledger means for placement: bytes promised per GPU to workers
still starting, and gatekeeper workers per GPU."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ledger_usage"]


def ledger_usage(state_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(outstanding bytes by GPU UUID, live workers by GPU UUID); empty without a ledger."""
    from gatekeeper.ledger import Ledger, ledger_path, promised_bytes

    path = ledger_path(state_dir)
    if not path.is_file():
        return {}, {}

    from gatekeeper.admission import workers_per_gpu

    with Ledger(path) as ledger:
        return dict(promised_bytes(ledger.outstanding())), workers_per_gpu(ledger.live())
