"""Weights by module group and format (#36 item 4): the groups add up exactly to the
weights the estimate reports, on every catalog model (TP 1/2/8, PP 2), every quantized
conformance case's config, checkpoint tensors, an index's ``total_size``, ``--cpu-offload-gb``,
LoRA and a drafter; and they say what is quantized (attention excluded stays bf16).

Against vLLM's own construction: tests/estimator/test_quant_conformance.py
(``test_weight_groups_match_what_vllm_builds``)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest

from gatekeeper.errors import ModelSpecError, ServeOptionsError
from gatekeeper.estimator import Estimate, GpuTarget, ServeOptions, estimate
from gatekeeper.estimator.speculative import parse_speculative
from gatekeeper.estimator.weight_groups import GROUPS, WeightGroups, module_group
from gatekeeper.models.built_weights import BuiltTensor, BuiltWeights
from gatekeeper.models.catalog import catalog_entries
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.spec import CheckpointTensor, CheckpointWeights, ModelSpec
from tests.support.quant_conformance import case_options, gatekeeper_quant
from tests.support.quant_conformance_cases import CASES, FAMILIES

GPU = GpuTarget(total_bytes=8 * 80 * 2**30)
"""Large enough that nothing is refused before its weights are split."""
PARALLEL = [(1, 1), (2, 1), (8, 1), (1, 2)]


def assert_exact(
    spec: ModelSpec, options: ServeOptions, draft: ModelSpec | None = None
) -> Estimate:
    result = estimate(spec, options, GPU, draft=draft)
    for stage in result.stages:
        groups = stage.weights_by_group
        assert groups.total_bytes == stage.weights_bytes, (
            f"{spec.name} stage {stage.stage}: groups {groups.total_bytes:,} B, "
            f"weights {stage.weights_bytes:,} B: {groups.by_group()}"
        )
        assert all(g in GROUPS and b > 0 for g, _, b in groups.entries), groups
    payload = result.to_json()["weights_by_group"]
    assert sum(sum(f.values()) for f in payload.values()) == result.worst.weights_bytes
    return result


def _catalog_spec(entry: Any) -> ModelSpec:
    return spec_from_config(entry.config, name=entry.repo_id, declared_parameters=entry.parameters)


@pytest.mark.parametrize("entry", catalog_entries(), ids=lambda e: e.repo_id)
def test_every_catalog_model_adds_up(entry: Any) -> None:
    spec = _catalog_spec(entry)
    sized = []
    for tp, pp in PARALLEL:
        options = ServeOptions(
            tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=4096
        )
        try:
            assert_exact(spec, options)
        except ServeOptionsError as exc:  # a TP size vLLM refuses for this model
            assert tp > 1 and exc.field == "tensor_parallel_size", exc
            continue
        sized.append((tp, pp))
    assert (1, 1) in sized and (1, 2) in sized


@pytest.mark.parametrize("case", list(CASES))
def test_every_quantized_case_adds_up(case: str) -> None:
    try:
        spec, _ = gatekeeper_quant(CASES[case])
    except ModelSpecError as exc:  # a method gatekeeper cannot size says so (torchao)
        pytest.skip(str(exc))
    for tp, pp in ((1, 1), (2, 2)):
        assert_exact(spec, case_options(CASES[case], tp, pp))


def _groups(case: str) -> dict[str, dict[str, int]]:
    spec, _ = gatekeeper_quant(CASES[case])
    return assert_exact(spec, case_options(CASES[case])).worst.weights_by_group.by_group()


def test_excluded_attention_stays_in_the_model_dtype() -> None:
    """AWQ with ``self_attn`` not converted: attention all bfloat16, the MLP AWQ; ModelOpt
    FP8 excluding layer 1's MLP and the LM head: the MLP split between the two."""
    groups = _groups("awq-skip/llama")
    assert set(groups["attention"]) == {"bfloat16"}
    assert set(groups["mlp"]) == {"awq"}
    assert set(groups["embedding"]) == {"bfloat16"}
    excluded = _groups("modelopt-fp8-exclude/llama")
    assert set(excluded["attention"]) == {"modelopt:fp8"}
    assert set(excluded["mlp"]) == {"modelopt:fp8", "bfloat16"}
    assert set(excluded["lm_head"]) == {"bfloat16"}


def test_moe_splits_experts_router_and_shared_experts() -> None:
    """Qwen3-MoE NVFP4: routed experts NVFP4, the router (vLLM builds Qwen3-MoE's router
    with the quantization config) in the experts group; DeepSeek-V3 FP8 block: MLA in
    attention, shared experts in the MLP group."""
    moe = _groups("modelopt-nvfp4/qwen3_moe")
    assert max(moe["experts"], key=moe["experts"].__getitem__) == "modelopt:nvfp4"
    assert "mlp" not in moe
    mla = _groups("fp8-block/deepseek_v3")
    assert set(mla["attention"]) >= {"fp8"} and set(mla["mlp"]) == {"fp8"}
    assert "fp8" in mla["experts"]


def test_unquantized_model_is_all_model_dtype() -> None:
    spec = spec_from_config(FAMILIES["llama"], name="llama")
    groups = assert_exact(spec, ServeOptions(dtype="float16", max_model_len=512))
    formats = {f for _, f, _ in groups.worst.weights_by_group.entries}
    assert formats == {"float16"}


def _llama_tensors(spec: ModelSpec, fp8: bool) -> list[CheckpointTensor]:
    """A Llama checkpoint as transformers saves it; FP8 linears with fp32 scales."""
    h, inter = spec.hidden_size, spec.intermediate_size
    kv = spec.num_kv_heads * spec.head_dim
    q = spec.num_attention_heads * spec.head_dim
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h),
              "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, q),
              "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}  # fmt: skip
    bf16 = [("model.embed_tokens.weight", (spec.vocab_size, h)), ("model.norm.weight", (h,))]
    if not spec.tie_word_embeddings:
        bf16.append(("lm_head.weight", (spec.vocab_size, h)))
    out = [CheckpointTensor(n, "BF16", s, 2 * _numel(s)) for n, s in bf16]
    for i in range(spec.num_layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out.append(CheckpointTensor(f"model.layers.{i}.{norm}.weight", "BF16", (h,), 2 * h))
        for name, shape in shapes.items():
            prefix = f"model.layers.{i}.{name}"
            if fp8:
                out.append(CheckpointTensor(f"{prefix}.weight", "F8_E4M3", shape, _numel(shape)))
                out.append(CheckpointTensor(f"{prefix}.weight_scale", "F32", (1,), 4))
            else:
                out.append(CheckpointTensor(f"{prefix}.weight", "BF16", shape, 2 * _numel(shape)))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _with_checkpoint(
    spec: ModelSpec, tensors: list[CheckpointTensor], index_only: bool
) -> ModelSpec:
    total = sum(t.num_bytes for t in tensors)
    ckpt = CheckpointWeights(total, () if index_only else tuple(tensors), "safetensors headers")
    return dataclasses.replace(spec, checkpoint=ckpt)


@pytest.mark.parametrize("index_only", [False, True], ids=["tensors", "index total_size"])
def test_checkpoint_weights_add_up_and_are_classified(index_only: bool) -> None:
    fp8 = {"quant_method": "fp8", "activation_scheme": "static"}
    spec = spec_from_config({**FAMILIES["llama"], "quantization_config": fp8}, name="llama-fp8")
    spec = _with_checkpoint(spec, _llama_tensors(spec, fp8=True), index_only)
    for tp, pp in PARALLEL[:2] + PARALLEL[3:]:
        options = ServeOptions(
            tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=512
        )
        result = assert_exact(spec, options)
        assert result.weights_source == "safetensors headers"
    groups = assert_exact(spec, ServeOptions(max_model_len=512)).worst.weights_by_group.by_group()
    assert set(groups["attention"]) == {"fp8"} and set(groups["mlp"]) == {"fp8"}
    assert set(groups["embedding"]) == {"bfloat16"} and set(groups["lm_head"]) == {"bfloat16"}


def test_cpu_offload_takes_the_offloaded_bytes_from_the_layers() -> None:
    spec = spec_from_config(FAMILIES["llama"], name="llama")
    tensors = _llama_tensors(spec, fp8=False)
    for s in (spec, _with_checkpoint(spec, tensors, False), _with_checkpoint(spec, tensors, True)):
        base = assert_exact(s, ServeOptions(max_model_len=512)).worst.weights_by_group.by_group()
        result = assert_exact(s, ServeOptions(max_model_len=512, cpu_offload_gb=0.001))
        assert result.worst.cpu_offloaded_bytes > 0
        groups = result.worst.weights_by_group.by_group()
        assert groups["embedding"] == base["embedding"]  # the offloader moves layers only
        assert groups["attention"]["bfloat16"] < base["attention"]["bfloat16"]


def test_lora_and_drafter_are_their_own_groups() -> None:
    spec = spec_from_config(FAMILIES["deepseek_v3"], name="deepseek-v3-tiny")
    if not spec.mtp_layers:
        spec = dataclasses.replace(spec, mtp_layers=1)
    mtp = parse_speculative({"method": "mtp", "num_speculative_tokens": 1}, "mtp")
    result = assert_exact(spec, ServeOptions(max_model_len=512, speculative_config=mtp))
    assert result.worst.weights_by_group.by_group()["drafter"] == {
        "bfloat16": result.worst.draft_weights_bytes
    }
    llama = spec_from_config(FAMILIES["llama"], name="llama")
    lora = assert_exact(llama, ServeOptions(max_model_len=512, enable_lora=True))
    assert lora.worst.weights_by_group.by_group()["lora"] == {"bfloat16": lora.worst.lora_bytes}


def test_calibration_scales_the_split_with_the_weights() -> None:
    groups = WeightGroups.of({("attention", "bfloat16"): 300, ("mlp", "fp8"): 701})
    scaled = groups.scaled_to(1100)
    assert scaled.total_bytes == 1100
    assert scaled.by_group() == {"attention": {"bfloat16": 330}, "mlp": {"fp8": 770}}


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("model.layers.0.self_attn.q_proj.weight", "attention"),
        ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight_scale_inv", "attention"),
        ("model.layers.1.mlp.experts.7.down_proj.weight_packed", "experts"),
        ("model.layers.1.mlp.gate.weight", "experts"),
        ("model.layers.1.block_sparse_moe.gate.weight", "experts"),
        ("model.layers.1.mlp.shared_experts.up_proj.weight", "mlp"),
        ("model.layers.1.mlp.shared_expert_gate.weight", "mlp"),
        ("model.layers.1.mlp.down_proj.weight", "mlp"),
        ("model.layers.2.linear_attn.in_proj_qkvz.weight", "mixer"),
        ("backbone.layers.2.mixer.A_log", "mixer"),
        ("backbone.layers.4.mixer.q_proj.weight", "attention"),
        ("model.layers.0.input_layernorm.weight", "other"),
        ("model.layers.0.post_attention_layernorm.weight", "other"),
        ("model.layers.0.self_attn.q_a_layernorm.weight", "attention"),
        ("model.layers.0.self_attn.k_norm.weight", "attention"),
        ("model.norm.weight", "other"),
        ("model.embed_tokens.weight", "embedding"),
        ("model.embedding.weight", "embedding"),
        ("lm_head.weight", "lm_head"),
        ("model.visual.blocks.0.attn.qkv.weight", "vision"),
        ("multi_modal_projector.linear_1.weight", "vision"),
    ],
)
def test_tensor_names_are_classified(name: str, group: str) -> None:
    assert module_group(name) == group


def _built_llama(spec: ModelSpec) -> BuiltWeights:
    """A Llama FP8 (per-tensor) as vLLM builds it, under vLLM's names: fused qkv and
    gate_up, fp8 weights with fp32 scales, a rotary cache buffer."""
    h, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    qkv = (spec.num_attention_heads + 2 * spec.num_kv_heads) * hd
    linears = {"self_attn.qkv_proj": (qkv, h), "self_attn.o_proj": (h, h),
               "mlp.gate_up_proj": (2 * inter, h), "mlp.down_proj": (h, inter)}  # fmt: skip
    vocab = (spec.vocab_size + 63) // 64 * 64
    out = [BuiltTensor("model.embed_tokens.weight", "bfloat16", (vocab, h), vocab * h * 2)]
    for i in range(spec.num_layers):
        for name, (rows, cols) in linears.items():
            prefix = f"model.layers.{i}.{name}"
            out.append(BuiltTensor(f"{prefix}.weight", "float8_e4m3fn", (rows, cols), rows * cols))
            out.append(BuiltTensor(f"{prefix}.weight_scale", "float32", (3,), 12))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out.append(BuiltTensor(f"model.layers.{i}.{norm}.weight", "bfloat16", (h,), 2 * h))
    rope = BuiltTensor(
        "model.layers.0.self_attn.rotary_emb.cos_sin_cache", "bfloat16", (4096, hd), 4096 * hd * 2
    )
    out += [BuiltTensor("model.norm.weight", "bfloat16", (h,), 2 * h), replace(rope, buffer=True)]
    out.append(BuiltTensor("lm_head.weight", "bfloat16", (vocab, h), vocab * h * 2))
    return BuiltWeights("0.32.0", 1, "bfloat16", "fp8", spec.architecture, tuple(out))


def test_what_an_installed_vllm_built_adds_up_by_its_names() -> None:
    """``--weights-from vllm``: vLLM's own tensors by their names, a module holding fp8
    in its scheme's method, over PP 1 and 2 (each stage its own rotary cache) and with
    ``--cpu-offload-gb``."""
    fp8 = {"quant_method": "fp8", "activation_scheme": "static"}
    spec = spec_from_config({**FAMILIES["llama"], "quantization_config": fp8}, name="llama-fp8")
    built = _built_llama(spec)
    spec = replace(spec, built=built)
    for options in (
        ServeOptions(max_model_len=512),
        ServeOptions(max_model_len=512, pipeline_parallel_size=2),
        ServeOptions(max_model_len=512, cpu_offload_gb=0.0001),
    ):
        result = assert_exact(spec, options)
        assert result.weights_source.startswith("vLLM 0.32.0")
    groups = assert_exact(spec, ServeOptions(max_model_len=512)).worst.weights_by_group.by_group()
    attention = [t.num_bytes for t in built.tensors if ".self_attn." in t.name and not t.buffer]
    assert groups["attention"] == {"fp8": sum(attention)}
    assert set(groups["mlp"]) == {"fp8"} and set(groups["lm_head"]) == {"bfloat16"}
    assert groups["other"]["bfloat16"] > 4096 * spec.head_dim * 2  # the rotary cache, the norms
