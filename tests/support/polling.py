"""Waiting for what another process does (a control plane's informers, an agent's pass)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout_seconds: float = 30.0,
    interval_seconds: float = 0.05,
) -> T:
    """Calls ``check`` until it returns something truthy, and returns that; raises
    AssertionError naming ``what`` when ``timeout_seconds`` pass first."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval_seconds)
    raise AssertionError(f"{what}: not seen in {timeout_seconds} s")
