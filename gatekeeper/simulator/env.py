"""The simulator's behaviour, read from ``GATEKEEPER_SIM_*`` environment variables.

These variables are the simulator's protocol with whoever launches it (the sidecar's
rehearsal, the tests); ``gatekeeper.simulator`` documents each one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.units import parse_size

__all__ = [
    "ACTUAL_BYTES_VAR",
    "COMPONENT_VARS",
    "FAIL_MODES",
    "PREFIX_ENV",
    "RELEASES",
    "TIMED_MODES",
    "VLLM_VERSION_VAR",
    "SimEnv",
    "played_release",
]

FAIL_MODES = (
    "free-memory",
    "max-model-len",
    "oom-load",
    "oom-sampler",
    "hang",
    "wake-error",
    "wake-hang",
)
TIMED_MODES = ("crash-after-requests", "die-after-ready")
PREFIX_ENV = "GATEKEEPER_SIM_"
COMPONENT_VARS = {
    "weights": PREFIX_ENV + "WEIGHTS_BYTES",
    "kv": PREFIX_ENV + "KV_BYTES",
    "activation": PREFIX_ENV + "ACTIVATION_BYTES",
    "non_torch": PREFIX_ENV + "NON_TORCH_BYTES",
    "cuda_graph": PREFIX_ENV + "CUDA_GRAPH_BYTES",
}
"""The per-GPU figures the simulator's log reports, by component."""
ACTUAL_BYTES_VAR = PREFIX_ENV + "ACTUAL_BYTES"
"""The bytes the simulator holds per GPU."""
VLLM_VERSION_VAR = PREFIX_ENV + "VLLM_VERSION"
"""The vLLM release whose worker the simulator plays (``played_release``)."""
RELEASES = ("0.33.0", "0.34.0")
"""The releases whose start-up the simulator plays, oldest first: the first is the default."""


def _release_key(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-].*)?", text.strip())
    if match is None:
        raise ValueError(f"{VLLM_VERSION_VAR}={text!r} is not a vLLM release such as 0.34.0")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def played_release(text: str | None) -> str:
    """The release of ``RELEASES`` the simulator plays for vLLM ``text``: the newest at or
    before it (0.33.0 for older releases and when unset: their lines are 0.33's)."""
    if not text:
        return RELEASES[0]
    key = _release_key(text)
    older = [r for r in RELEASES if _release_key(r) <= key]
    return older[-1] if older else RELEASES[0]


def _size_env(environ: Mapping[str, str], name: str) -> int | None:
    text = environ.get(PREFIX_ENV + name)
    if not text:
        return None
    return 0 if text.strip() == "0" else parse_size(text, field=PREFIX_ENV + name)


def _float_env(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(PREFIX_ENV + name)
    try:
        return default if not text else float(text)
    except ValueError as e:
        raise ValueError(f"{PREFIX_ENV}{name}={text!r} is not a number of seconds") from e


@dataclass(frozen=True, slots=True)
class SimEnv:
    """The simulator's behaviour, from ``GATEKEEPER_SIM_*`` variables (module docstring)."""

    startup_seconds: float = 0.5
    token_seconds: float = 0.005
    fail: str | None = None
    crash_after_requests: int | None = None
    die_after_ready_seconds: float | None = None
    gpu_total_bytes: int | None = None
    actual_bytes: int | None = None
    components: tuple[tuple[str, int], ...] = ()
    kv_bytes_per_token: int | None = None
    nvml_state: Path | None = None
    visible_devices: str | None = None
    vllm_version: str = RELEASES[0]
    """The release played (``played_release`` of ``GATEKEEPER_SIM_VLLM_VERSION``)."""
    dev_mode: bool = False
    """vLLM's ``VLLM_SERVER_DEV_MODE`` (read as vLLM reads it: ``bool(int(value))``): the
    sleep routes are served only with it."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SimEnv:
        """Read the environment; ``ValueError`` names the bad variable."""
        fail = environ.get(PREFIX_ENV + "FAIL") or None
        mode, _, value = (fail or "").partition(":")
        if fail is not None and fail not in FAIL_MODES and mode not in TIMED_MODES:
            raise ValueError(
                f"{PREFIX_ENV}FAIL={fail!r} is not one of {', '.join(FAIL_MODES)}, "
                "crash-after-requests:N, die-after-ready:S"
            )
        try:
            crash = int(value) if mode == "crash-after-requests" else None
            die = float(value) if mode == "die-after-ready" else None
        except ValueError as e:
            raise ValueError(f"{PREFIX_ENV}FAIL={fail!r}: {e}") from e
        components = (
            (name, _size_env(environ, var.removeprefix(PREFIX_ENV)))
            for name, var in COMPONENT_VARS.items()
        )
        state = environ.get(PREFIX_ENV + "NVML_STATE")
        dev = environ.get("VLLM_SERVER_DEV_MODE", "0")
        try:
            dev_mode = bool(int(dev))
        except ValueError as e:
            raise ValueError(f"VLLM_SERVER_DEV_MODE={dev!r} is not 0 or 1") from e
        return cls(
            startup_seconds=_float_env(environ, "STARTUP_SECONDS", 0.5),
            token_seconds=_float_env(environ, "TOKEN_SECONDS", 0.005),
            fail=None if crash is not None or die is not None else fail,
            crash_after_requests=crash,
            die_after_ready_seconds=die,
            gpu_total_bytes=_size_env(environ, "GPU_TOTAL_BYTES"),
            actual_bytes=_size_env(environ, "ACTUAL_BYTES"),
            components=tuple((n, b) for n, b in components if b is not None),
            kv_bytes_per_token=_size_env(environ, "KV_BYTES_PER_TOKEN"),
            nvml_state=Path(state) if state else None,
            visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
            vllm_version=played_release(environ.get(VLLM_VERSION_VAR)),
            dev_mode=dev_mode,
        )
