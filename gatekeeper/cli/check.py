"""``gatekeeper check`` (one request against the node) and ``gatekeeper plan`` (a file
of deployments admitted in order: capacity planning)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatekeeper.cli.exit_codes import EXIT_OK, EXIT_REJECTED
from gatekeeper.cli.options import (
    add_serving_flags,
    model_from_args,
    note_unmodelled,
    options_from_args,
    positive_int,
    serve_command,
)
from gatekeeper.cli.output import GpusUnreadable
from gatekeeper.cli.weights_from import add_weights_from, with_built_weights
from gatekeeper.estimator.options import draft_reference
from gatekeeper.settings import Settings, gpu_source, model_resolver, placement_policy

if TYPE_CHECKING:
    from gatekeeper.gpus.inventory import InventorySnapshot
    from gatekeeper.placement.types import Decision

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    c = subparsers.add_parser(
        "check",
        help="decide whether a model fits this node, where, and with which flags",
        description="Admission decision for one deployment (nothing is launched or reserved).",
    )
    c.add_argument(
        "model",
        nargs="?",
        help="local checkpoint directory, catalog name or hub repo id; or `model:` in a "
        "--config file",
    )
    add_serving_flags(c)
    _add_request_flags(c)
    add_weights_from(c)
    c.set_defaults(func=run_check)
    p = subparsers.add_parser(
        "plan",
        help="admit a file of deployments in order and show the node's headroom",
        description="Capacity planning: FILE (TOML or YAML) lists deployments.",
    )
    p.add_argument("file", type=Path, help="the plan: deployments in order (TOML or YAML)")
    p.add_argument(
        "--node", default=None, help="declared node (default: the file's, else settings)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (errors too)")
    p.set_defaults(func=run_plan_command)


def _add_request_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--node", default=None, help="declared node such as 2xH100-80GB (default: live GPUs)"
    )
    c.add_argument(
        "--min-kv-tokens",
        type=positive_int("--min-kv-tokens"),
        help="KV cache for at least this many tokens (with --min-sequences: the larger)",
    )
    c.add_argument(
        "--min-sequences",
        type=positive_int("--min-sequences"),
        default=1,
        help="KV cache for at least N sequences of max_model_len (default 1, vLLM's least)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object (errors too)")


def _snapshot(settings: Settings, node: str | None) -> InventorySnapshot:
    source = gpu_source(settings, node)
    snapshot = source.snapshot(visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not snapshot.ok:
        raise GpusUnreadable(
            f"gpus: cannot read the GPUs ({snapshot.error}); "
            "pass --node 2xH100-80GB (or set GATEKEEPER_GPUS) to plan for a declared node",
            field="gpus",
            value=snapshot.source,
        )
    return snapshot


def run_check(args: argparse.Namespace, settings: Settings) -> int:
    # Placement is loaded by the commands that place, not by every start of the CLI (#39).
    from gatekeeper.placement.decision import decide
    from gatekeeper.placement.types import PlacementRequest, auto_parallel

    resolve = model_resolver(settings)
    spec = model_from_args(args, settings)
    options = options_from_args(args, settings)
    spec, fell_back = with_built_weights(
        spec, options, args.weights_from, settings, serve_command(args, settings).values
    )
    for warning in fell_back:
        print(f"gatekeeper: warning: {warning}", file=sys.stderr)
    draft = draft_reference(options)
    request = PlacementRequest(
        model=spec,
        options=options,
        draft=resolve(draft) if draft else None,
        auto_parallel=auto_parallel(serve_command(args).values),
        min_kv_tokens=args.min_kv_tokens,
        min_sequences=args.min_sequences,
    )
    live = args.node is None
    snapshot = _snapshot(settings, args.node)
    reserved, workers = _ledger_usage(settings) if live else ({}, {})
    decision = decide(
        request, snapshot, reserved=reserved, workers=workers, policy=placement_policy(settings)
    )
    note_unmodelled(args, "decision")
    _print(decision, args.json)
    return EXIT_OK if decision.admitted else EXIT_REJECTED


def _ledger_usage(settings: Settings) -> tuple[dict[str, int], dict[str, int]]:
    """What the sidecar's ledger holds per GPU (a declared ``--node`` reads none)."""
    from gatekeeper.sidecar.ledger import ledger_usage  # the CLI loads the sidecar only here

    return ledger_usage(settings.state_dir.expanduser())


def _print(decision: Decision, as_json: bool) -> None:
    from gatekeeper.placement.render import render_decision

    print(json.dumps(decision.to_json(), indent=2) if as_json else render_decision(decision))


def run_plan_command(args: argparse.Namespace, settings: Settings) -> int:
    from gatekeeper.placement.plan import load_plan, run_plan

    plan = load_plan(args.file, release=settings.default_vllm_version)
    snapshot = _snapshot(settings, args.node or plan.node)
    result = run_plan(plan, snapshot, placement_policy(settings), model_resolver(settings))
    print(json.dumps(result.to_json(), indent=2) if args.json else result.render())
    return EXIT_OK if all(d.admitted for d in result.decisions) else EXIT_REJECTED
