"""The simulator's command line: every flag of ``vllm serve`` in vLLM's flag table, read
as vLLM reads it (``flags`` builds the parser, ``argv`` rewrites the command line first);
``gatekeeper.simulator`` documents it."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

from gatekeeper.simulator import flags
from gatekeeper.simulator.argv import rewrite
from gatekeeper.simulator.env import SimEnv
from gatekeeper.simulator.extensible import FIRST_RELEASE, config_error
from gatekeeper.simulator.http import SIMULATOR_NOTE
from gatekeeper.simulator.process import VLLM_VERSION, Simulator, simulated_flags

__all__ = ["build_parser", "main", "parse_args"]

_SENSITIVE = frozenset({"api_key", "hf_token", "watermark_config"})
"""Flags whose values vLLM logs as ``***``."""


def build_parser(played: str = VLLM_VERSION) -> argparse.ArgumentParser:
    """``vllm serve``'s parser from the shipped table of the release the simulator plays."""
    release, rows = flags.table(played)
    missing = sorted(simulated_flags(played) - {row["dest"] for row in rows})
    if missing:
        raise RuntimeError(
            f"vLLM {release}'s flag table has no {', '.join(missing)}, which the simulator "
            "reads; update gatekeeper.simulator.process.SIMULATED_FLAGS for that release"
        )
    return flags.build_parser(rows, description=f"{SIMULATOR_NOTE} (flags of vLLM {release}).")


def parse_args(
    argv: Sequence[str], played: str = VLLM_VERSION
) -> tuple[argparse.Namespace, dict[str, Any]]:
    """``argv`` (what follows ``vllm serve``) as vLLM ``played`` reads it, and the
    ``non-default args`` vLLM logs; argparse's errors exit 2, and what vLLM refuses before
    argparse, or in its config (0.34: ``--enable-extensible-kv-cache`` with a byte budget),
    raises ``ValueError`` (or ``OSError`` for a config file that cannot be read)."""
    parser = build_parser(played)
    _, rows = flags.table(played)
    args = parser.parse_args(rewrite(argv, flags.option_strings(rows)))
    if played == FIRST_RELEASE and (error := config_error(args)) is not None:
        raise ValueError(error)
    if args.model_tag is not None:
        args.model = args.model_tag  # as `vllm serve` does, before it logs
    defaults = vars(parser.parse_args([]))
    given = {k: v for k, v in vars(args).items() if k in defaults and v != defaults[k]}
    return args, {k: "***" if k in _SENSITIVE else v for k, v in given.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gatekeeper.simulator [serve] MODEL [flags]``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    try:
        env: SimEnv | None = SimEnv.from_environ(os.environ)
        env_error = None
    except ValueError as e:
        env, env_error = None, e
    played = env.vllm_version if env is not None else VLLM_VERSION
    try:
        args, non_default = parse_args(argv, played)
    except (ValueError, OSError) as e:
        print(
            "Traceback (most recent call last):\n"
            '  File "<gatekeeper simulator>", line 1, in <simulated vllm serve>\n'
            f"{type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return 1
    if env is None:
        build_parser(played).error(str(env_error))
    return asyncio.run(Simulator(args, non_default, env).run())


if __name__ == "__main__":
    sys.exit(main())
