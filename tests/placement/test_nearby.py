"""The menu of nearby configurations that the sidecar and the webhook share."""

from __future__ import annotations

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.models.source import resolve_model
from gatekeeper.placement.nearby import (
    MIN_SUGGESTED_LEN,
    larger_sizes,
    lighter_variants,
    longest_length,
    online_fp8_flag,
)

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
FP8 = resolve_model("Qwen/Qwen3-235B-A22B-FP8")


def test_lighter_variants_offer_fp8_kv_then_online_fp8_weights_in_each_releases_spelling():
    kinds = [v.kind for v in lighter_variants(LLAMA8, ServeOptions(), "0.33.0")]
    assert kinds == ["kv_cache_dtype", "quantization"]
    new, old = (lighter_variants(LLAMA8, ServeOptions(), v)[1] for v in ("0.33.0", "0.10.1"))
    assert new.changes == {"quantization": "fp8_per_tensor"}
    assert old.changes == {"quantization": "fp8"}
    assert old.flag == "--quantization fp8 (online fp8 weights)"
    assert online_fp8_flag("0.33.0") == "fp8_per_tensor"


def test_nothing_lighter_for_an_fp8_cache_or_a_quantized_checkpoint():
    assert lighter_variants(FP8, ServeOptions(kv_cache_dtype="fp8"), "0.33.0") == []
    only_kv = lighter_variants(LLAMA8, ServeOptions(quantization="awq"), "0.33.0")
    assert [v.option for v in only_kv] == ["kv_cache_dtype fp8"]


def test_larger_sizes_come_from_the_sizes_placement_searches():
    assert larger_sizes(1) == (2, 4, 8, 16)
    assert larger_sizes(4) == (8, 16)
    assert larger_sizes(16) == ()


def test_longest_length_finds_the_boundary_and_never_suggests_below_the_minimum():
    probes: list[int] = []

    def fits_up_to_5000(n: int) -> str | None:
        probes.append(n)
        return "here" if n <= 5000 else None

    assert longest_length(fits_up_to_5000, 131072) == (5000, "here")
    assert min(probes) >= MIN_SUGGESTED_LEN and len(probes) <= 18
    assert longest_length(lambda n: None, 131072) is None
    assert longest_length(lambda n: "x" if n < 100 else None, 131072) is None
