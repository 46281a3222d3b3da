"""``gatekeeper estimate`` (``gatekeeper models`` is ``gatekeeper.cli.models``)."""

from __future__ import annotations

import argparse
import json
import textwrap
from dataclasses import replace
from typing import Any

from gatekeeper.cli.exit_codes import EXIT_OK, EXIT_REJECTED
from gatekeeper.cli.options import (
    add_serving_flags,
    model_from_args,
    note_unmodelled,
    options_from_args,
    serve_command,
)
from gatekeeper.cli.weights_from import add_weights_from, with_built_weights
from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.options import ServeOptions, draft_reference
from gatekeeper.estimator.simple_method import simple_estimate
from gatekeeper.estimator.vllm_method import Estimate, GpuTarget, estimate
from gatekeeper.estimator.weight_groups import GROUPS, WeightGroups
from gatekeeper.estimator.weights import parameter_count
from gatekeeper.gpus.products import lookup_gpu
from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec
from gatekeeper.settings import Settings, model_resolver
from gatekeeper.units import format_gib, gib, parse_size

__all__ = ["add_parser"]

DEFAULT_GPU = "H100-80GB"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "estimate",
        help="estimate a model's per-GPU memory under vLLM",
        description="Estimate per-GPU memory as vLLM accounts it, and whether it would start.",
    )
    p.add_argument(
        "model",
        nargs="?",
        help="local checkpoint directory, GGUF file, catalog name or hub repo id "
        "(found in the Hugging Face cache first); or `model:` in a --config file",
    )
    add_serving_flags(p)
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", default=None, help=f"GPU product (default {DEFAULT_GPU})")
    gpu.add_argument("--gpu-memory", default=None, help="GPU total memory, e.g. 79.19GiB")
    p.add_argument(
        "--method",
        choices=("vllm", "simple"),
        default="vllm",
        help="vllm: each component as vLLM accounts it (default); simple: the rule of thumb "
        "parameters x bytes x 1.2, for comparison",
    )
    add_weights_from(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (errors too)")
    p.set_defaults(func=run)


def _gpu(args: argparse.Namespace) -> GpuTarget:
    if args.gpu_memory:
        try:
            return GpuTarget(total_bytes=parse_size(args.gpu_memory, field="--gpu-memory"))
        except ValueError as e:
            raise ServeOptionsError(str(e), field="gpu_memory", value=args.gpu_memory) from e
    product = lookup_gpu(args.gpu or DEFAULT_GPU)
    return GpuTarget(
        total_bytes=product.total_bytes,
        name=product.name,
        compute_capability=product.compute_capability,
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    options = options_from_args(args, settings)
    note_unmodelled(args, "estimate")
    gpu = _gpu(args)
    resolve = model_resolver(settings)
    spec = model_from_args(args, settings)
    spec, fell_back = with_built_weights(
        spec, options, args.weights_from, settings, serve_command(args, settings).values
    )
    draft = draft_reference(options)
    result = estimate(
        spec,
        options,
        gpu,
        default_version=settings.default_vllm_version,
        draft=resolve(draft) if draft else None,
    )
    if fell_back:
        result = replace(result, warnings=(*result.warnings, *fell_back))
    if args.method == "simple":
        payload = _simple_json(spec, result, options)
        print(json.dumps(payload, indent=2) if args.json else _render_simple(payload))
        return EXIT_OK if payload["fits"] else EXIT_REJECTED
    payload = {**result.to_json(), "config_source": config_source(spec)}
    print(json.dumps(payload, indent=2) if args.json else render(result, spec))
    return EXIT_OK if result.fits else EXIT_REJECTED


def _simple_json(spec: ModelSpec, result: Estimate, options: ServeOptions) -> dict[str, Any]:
    bits = result_bits(spec, result)
    simple = simple_estimate(parameter_count(spec), bits)
    per_gpu = simple.total_bytes // (options.tensor_parallel_size * options.pipeline_parallel_size)
    fits = per_gpu <= result.gpu_total_bytes
    return {
        "model": spec.name,
        "method": "simple",
        "vllm_version": result.vllm_version,
        "parameters": simple.parameters,
        "bits": bits,
        "weights_bytes": simple.weights_bytes,
        "total_bytes": simple.total_bytes,
        "non_torch_bytes": 0,
        "activation_peak_bytes": simple.total_bytes - simple.weights_bytes,
        "cuda_graph_bytes": 0,
        "kv_cache_bytes": 0,
        "kv_cache_tokens": 0,
        "max_concurrency": 0.0,
        "fits": fits,
        "reasons": []
        if fits
        else [
            f"P x Q/8 x 1.2 = {format_gib(per_gpu)} per GPU exceeds {format_gib(result.gpu_total_bytes)}"
        ],
        "max_model_len": result.max_model_len,
    }


def result_bits(spec: ModelSpec, result: Estimate) -> int:
    quant = spec.quantization
    return quant.weight_bits if quant is not None else DTYPE_BYTES[result.dtype] * 8


def _render_simple(payload: dict[str, Any]) -> str:
    return (
        f"{payload['model']}: simple method M = P x Q/8 x 1.2\n"
        f"  P = {payload['parameters']:,} parameters, Q = {payload['bits']} bits\n"
        f"  weights {format_gib(payload['weights_bytes'])}, total {format_gib(payload['total_bytes'])}\n"
        f"  verdict: {'FITS' if payload['fits'] else 'DOES NOT FIT'}"
        + "".join(f"\n    - {r}" for r in payload["reasons"])
    )


def render(e: Estimate, spec: ModelSpec) -> str:
    """The human table: components in GiB, the verdict, the largest max_model_len."""
    w = e.worst
    rank = (
        f"stage {w.stage} of {e.pipeline_parallel_size}, " if e.pipeline_parallel_size > 1 else ""
    )
    lines = [
        f"{e.model} on a {gib(e.gpu_total_bytes):.2f} GiB GPU, TP={e.tensor_parallel_size} "
        f"PP={e.pipeline_parallel_size}, {e.dtype}, KV {e.kv_cache_dtype}"
        + (f", {e.quantization}" if e.quantization else ""),
        f"vLLM {e.vllm_version} accounting, per GPU ({rank}most loaded rank); "
        f"config from {config_source(spec)}",
        f"  max_model_len {e.max_model_len}, max_num_seqs {e.max_num_seqs}, "
        f"max_num_batched_tokens {e.max_num_batched_tokens}, "
        f"gpu_memory_utilization {e.gpu_memory_utilization}",
        "",
        f"  {'component':<28}{'GiB':>10}",
    ]
    rows = [("weights", w.weights_bytes)]
    rows += [
        (f"  of which {name}", value)
        for name, value in (("LoRA slots", w.lora_bytes), ("draft model", w.draft_weights_bytes))
        if value
    ]
    if w.cpu_offloaded_bytes:
        rows.append(("  offloaded to host (not GPU)", w.cpu_offloaded_bytes))
    rows += [
        ("non-torch", w.non_torch_bytes),
        ("activation peak", w.activation_peak_bytes),
        ("CUDA graphs", w.cuda_graph_bytes),
        ("KV cache", w.kv_cache_bytes),
        *([("margin kept free", w.kv_margin_bytes)] if e.extensible_kv_cache else []),
        (_budget_label(e), w.budget_bytes),
        ("NVML total for the worker", w.nvml_bytes),
    ]
    table = [f"  {name:<28}{gib(value):>10.2f}" for name, value in rows]
    lines += [table[0], *_group_lines(w.weights_by_group), *table[1:]]  # under the weights
    lines += [
        "",
        f"  KV cache: {e.kv_cache_tokens:,} tokens, {e.kv_bytes_per_token:,} bytes per token, "
        f"max concurrency {e.max_concurrency:.2f}x at {e.max_model_len} tokens",
        *(
            ["  KV cache sized after warm-up and CUDA-graph capture (extensible KV cache)"]
            if e.extensible_kv_cache
            else []
        ),
        *_state_lines(e),
        *_parallel_lines(e),
        _host_line(e),
        f"  weights from: {e.weights_source}",
        *([f"  MoE experts padded as backend {e.experts_backend}"] if e.experts_backend else []),
        f"  verdict: {'FITS' if e.fits else 'DOES NOT FIT'}",
    ]
    lines += [f"    - {r}" for r in e.reasons]
    lines += [f"    ! {m}" for m in e.warnings]
    lines += [f"    ! {n}" for n in spec.notes]
    lines.append(f"  largest max_model_len that fits: {e.max_model_len_fit}")
    return "\n".join(lines)


def _budget_label(e: Estimate) -> str:
    """vLLM 0.34's extensible KV cache: the budget is ``u x total`` or the free memory
    less the margin, whichever is less (``gatekeeper/estimator/extensible_kv.py``)."""
    return (
        "budget (u x total or free - margin)"
        if e.extensible_kv_cache
        else ("budget (utilization x total)")
    )


def _group_lines(groups: WeightGroups) -> list[str]:
    """The weights by module group and format, wrapped: ``of which: attention 1.91 GiB
    bfloat16, experts 60.59 GiB mxfp4, embedding+head 2.16 GiB bfloat16, ...``; the
    embedding and the LM head as one when they share one format."""
    by_group = groups.by_group()
    embedding, head = by_group.get("embedding", {}), by_group.get("lm_head", {})
    if len(embedding) == 1 and embedding.keys() == head.keys():
        fmt = next(iter(embedding))
        merged = {"embedding+head": {fmt: embedding[fmt] + head[fmt]}}
        by_group = {
            **{g: f for g, f in by_group.items() if g not in ("embedding", "lm_head")},
            **merged,
        }
        by_group = dict(sorted(by_group.items(), key=lambda kv: _GROUP_ORDER.get(kv[0], 99)))
    items = [
        f"{group} " + " + ".join(f"{gib(size):.2f} GiB {fmt}" for fmt, size in shown.items())
        for group, formats in by_group.items()
        if (shown := _shown(formats))
    ]
    if not items:
        return []
    return textwrap.wrap(
        "of which: " + ", ".join(items),
        width=100,
        initial_indent="    ",
        subsequent_indent="      ",
        break_on_hyphens=False,
    )


def _shown(formats: dict[str, int]) -> dict[str, int]:
    """A group's formats of 0.01 GiB or more (the largest one whatever its size)."""
    top = max(formats, key=lambda f: formats[f])
    return {f: b for f, b in formats.items() if f == top or gib(b) >= 0.005}


_GROUP_ORDER = {g: k for k, g in enumerate(GROUPS)} | {"embedding+head": GROUPS.index("embedding")}


CATALOG_SOURCE = "embedded catalog"


def config_source(spec: ModelSpec) -> str:
    """Where the model's config was read, as an operator finds it again: the embedded
    catalog (``gatekeeper models``), a Hugging Face cache snapshot or a local directory
    with its path, a GGUF file, or the hub; not the catalog's provenance notes (the
    files it was copied from), which are the project's, not the operator's."""
    source = spec.source or "unknown"
    if source.startswith(CATALOG_SOURCE):
        fallback = source.rpartition("; the hub look-up failed: ")
        note = f"; the hub look-up failed: {fallback[2]}" if fallback[1] else ""
        return f"{CATALOG_SOURCE} (`gatekeeper models` lists it){note}"
    return source


def _host_line(e: Estimate) -> str:
    """The deployment's host memory, all its processes and GPUs together, by part."""
    h = e.host
    named = (("CPU offload", h.cpu_offload_bytes), ("KV offloading", h.kv_offload_bytes),
             ("swap space", h.swap_space_bytes), ("sleeping weights", h.sleeping_weights_bytes))  # fmt: skip
    parts = [f"processes {format_gib(h.process_bytes)} (a floor)"]
    parts += [f"{name} {format_gib(value)}" for name, value in named if value]
    return f"  host memory: {format_gib(h.host_bytes)} for the deployment: {', '.join(parts)}"


def _state_lines(e: Estimate) -> list[str]:
    """The recurrent state of hybrid and attention-free models: per sequence, not per
    token, so the per-token figure above leaves it out; the concurrency counts it."""
    if not e.state_bytes_per_sequence:
        return []
    return [
        f"  recurrent state: {format_gib(e.state_bytes_per_sequence, 3)} "
        f"({e.state_bytes_per_sequence:,} bytes) per sequence on this rank, in the KV cache "
        "beside the attention blocks (bytes per token above are the attention layers' only; "
        "max concurrency counts both)"
    ]


def _parallel_lines(e: Estimate) -> list[str]:
    """GPUs beyond one TP x PP group, speculative decoding and graph capture, when asked."""
    out = []
    if e.gpus > e.tensor_parallel_size * e.pipeline_parallel_size or e.expert_parallel_size > 1:
        out.append(
            f"  GPUs: {e.gpus} (DP={e.data_parallel_size} x TP={e.tensor_parallel_size} x "
            f"PP={e.pipeline_parallel_size}), experts over {e.expert_parallel_size} ranks"
        )
    if e.decode_context_parallel_size > 1:
        out.append(f"  decode context parallel over {e.decode_context_parallel_size} ranks")
    if e.speculative_method:
        out.append(f"  speculative decoding: {e.speculative_method}")
    out.append(
        f"  CUDA graphs captured up to {e.cuda_graph_capture_size} tokens"
        if e.cuda_graph_capture_size
        else "  no CUDA graphs (eager)"
    )
    return out
