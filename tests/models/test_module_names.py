"""vLLM's module names, read from the table scripts/vllm-model-table.py writes from vLLM's code.

The expectations are what vLLM 0.32's model files build (named beside each); the table is
checked against vLLM itself by tests/vllm/test_model_table.py (regenerated and compared).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gatekeeper.models.module_names import (
    TABLE_RELEASE,
    known_architecture,
    module_names,
    registered_architecture,
    unknown_architecture_warning,
)

ROOT = Path(__file__).resolve().parents[2]
_QKV = ("qkv_proj", ("q_proj", "k_proj", "v_proj"))
_GATE_UP = ("gate_up_proj", ("gate_proj", "up_proj"))


def test_the_table_holds_every_architecture_vllm_registers():
    data = json.loads(
        (ROOT / "gatekeeper" / "data" / "vllm_models" / f"{TABLE_RELEASE}.json").read_text()
    )
    assert data["vllm"] == TABLE_RELEASE
    assert data["generated_by"] == "scripts/vllm-model-table.py"
    assert len(data["models"]) == 391  # vllm.model_executor.models.registry._VLLM_MODELS
    assert all(row["how"] in ("import", "source") for row in data["models"].values())


@pytest.mark.parametrize(
    ("arch", "model", "lm_head", "attention", "mlp"),
    [
        ("LlamaForCausalLM", "model", "lm_head", "self_attn", "mlp"),
        ("OPTForCausalLM", "model.decoder", "lm_head", "self_attn", "mlp"),  # opt.py
        ("GptOssForCausalLM", "model", "lm_head", "attn", "mlp"),  # gpt_oss.py
        ("MixtralForCausalLM", "model", "lm_head", "self_attn", "block_sparse_moe"),
        ("Llama4ForCausalLM", "model", "lm_head", "self_attn", "feed_forward"),
        (
            "Gemma3ForConditionalGeneration",
            "language_model.model",
            "language_model.lm_head",
            "self_attn",
            "mlp",
        ),
        (
            "Llama4ForConditionalGeneration",
            "language_model.model",
            "language_model.lm_head",
            "self_attn",
            "feed_forward",
        ),
        (
            "Qwen2_5_VLForConditionalGeneration",
            "language_model.model",
            "language_model.lm_head",
            "self_attn",
            "mlp",
        ),
        (
            "Mistral3ForConditionalGeneration",
            "language_model.model",
            "language_model.lm_head",
            "self_attn",
            "mlp",
        ),
        (
            "LlavaForConditionalGeneration",
            "language_model.model",
            "language_model.lm_head",
            "self_attn",
            "mlp",
        ),
    ],
)
def test_decoder_names(arch, model, lm_head, attention, mlp):
    names = module_names(arch)
    assert names.known
    assert (names.model, names.lm_head, names.attention, names.mlp) == (
        model,
        lm_head,
        attention,
        mlp,
    )
    assert names.layer(3) == f"{model}.layers.3"


def test_moe_names_of_the_families_written_by_hand_before():
    mixtral = module_names("MixtralForCausalLM")  # FusedMoE(ckpt_names=("w1", "w2", "w3"))
    assert mixtral.expert_projections == ("w1", "w3", "w2")
    assert mixtral.packed == (_QKV,)
    assert mixtral.to_vllm("model.layers.0.block_sparse_moe.experts.0.gate_proj.weight") == (
        "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    )
    assert module_names("Qwen3MoeForCausalLM").quantized_router  # GateLinear(quant_config=)
    assert not module_names("Qwen2MoeForCausalLM").quantized_router
    assert not module_names("DeepseekV3ForCausalLM").quantized_router
    assert module_names("Qwen2MoeForCausalLM").shared_experts == "shared_expert"
    assert module_names("DeepseekV3ForCausalLM").shared_experts == "shared_experts"
    assert module_names("Llama4ForCausalLM").shared_experts == "shared_expert"


def test_deepseek_fuses_q_a_and_kv_a_only_with_q_lora_rank():
    fused = ("fused_qkv_a_proj", ("q_a_proj", "kv_a_proj_with_mqa"))
    for arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        assert fused in module_names(arch, q_lora_rank=1536).packed
        assert fused not in module_names(arch).packed
        assert _GATE_UP in module_names(arch).packed


def test_phi3_and_the_mappers_of_the_wrappers():
    assert module_names("Phi3ForCausalLM").packed == (
        ("qkv_proj", ("qkv_proj",)),
        ("gate_up_proj", ("gate_up_proj",)),
    )
    for arch in ("Gemma3ForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"):
        names = module_names(arch)
        assert names.to_vllm("model.language_model.layers.2.mlp.down_proj") == (
            "language_model.model.layers.2.mlp.down_proj"
        )
        assert names.to_vllm("lm_head") == "lm_head"  # "lm_head." needs the dot
    # mistral3.py and qwen2_5_vl.py map a bare "model." too; gemma3_mm.py does not
    assert module_names("Mistral3ForConditionalGeneration").to_vllm("model.layers.0.mlp") == (
        "language_model.model.layers.0.mlp"
    )
    assert module_names("Gemma3ForConditionalGeneration").to_vllm("model.layers.0.mlp") == (
        "model.layers.0.mlp"
    )
    assert module_names("GptOssForCausalLM").to_vllm("model.layers.0.self_attn.q_proj") == (
        "model.layers.0.attn.q_proj"
    )


@pytest.mark.parametrize(
    "arch", ["Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"]
)
def test_qwen3_5_names_the_language_model_and_its_gated_delta_net(arch):
    names = module_names(arch)  # qwen3_5.py, qwen3_vl.py's mapper
    assert names.to_vllm("model.language_model.layers.3.linear_attn.in_proj_qkv") == (
        "language_model.model.layers.3.linear_attn.in_proj_qkv"
    )
    assert names.layer(3) == "language_model.model.layers.3"
    assert names.lm_head == "language_model.lm_head"
    assert names.mixer == "linear_attn"
    packed = dict(names.packed)
    assert packed["in_proj_qkvz"] == ("in_proj_qkv", "in_proj_z")
    assert packed["in_proj_ba"] == ("in_proj_b", "in_proj_a")
    assert packed["qkv_proj"] == _QKV[1]


def test_qwen3_5_moe_experts():
    names = module_names("Qwen3_5MoeForConditionalGeneration")
    assert (names.mlp, names.experts, names.shared_experts) == ("mlp", "experts", "shared_expert")
    assert names.expert_projections == ("gate_proj", "up_proj", "down_proj")


def test_gemma4_and_minimax_m3():
    gemma = module_names("Gemma4ForConditionalGeneration")  # gemma4_mm.py
    assert gemma.to_vllm("model.language_model.layers.0.self_attn.q_proj") == (
        "language_model.model.layers.0.self_attn.q_proj"
    )
    assert gemma.layer(0) == "language_model.model.layers.0"
    minimax = module_names("MiniMaxM3SparseForConditionalGeneration")
    assert minimax.layer(0) == "language_model.model.layers.0"
    assert minimax.mlp == "block_sparse_moe"
    # its experts layer keeps the default names; get_expert_mapping() reads w1/w3/w2
    assert minimax.expert_projections == ("gate_proj", "up_proj", "down_proj")
    assert minimax.checkpoint_expert_projections == ("w1", "w3", "w2")


def test_nemotron_h_names_every_block_mixer():
    # nemotron_h.py: each layer type builds its block as self.mixer (Mamba2, attention,
    # MLP or MoE); its MoE experts are not gated (FusedMoE(ckpt_names=("up_proj", "down_proj", None)))
    names = module_names("NemotronHForCausalLM")
    assert (names.mixer, names.attention, names.mlp, names.moe) == ("mixer",) * 4
    assert dict(names.mixer_linears) == {"conv1d": False, "in_proj": True, "out_proj": True}
    assert names.expert_projections == ("up_proj", "None", "down_proj")


def test_the_names_vllm_asks_with_where_they_are_not_the_paths():
    # each linear's prefix as vLLM built it (get_quant_method(layer, prefix))
    opt = module_names("OPTForCausalLM")  # opt.py: fc1/fc2 on the layer, out_proj
    assert (opt.layer(0), opt.qkv, opt.o_proj, opt.up, opt.down) == (
        "model.decoder.layers.0",
        "self_attn.qkv_proj",
        "self_attn.out_proj",
        "fc1",
        "fc2",
    )
    gpt2 = module_names("GPT2LMHeadModel")  # gpt2.py: Conv1D names
    assert (gpt2.qkv, gpt2.o_proj, gpt2.up, gpt2.down) == (
        "attn.c_attn",
        "attn.c_proj",
        "mlp.c_fc",
        "mlp.c_proj",
    )
    # bert.py builds BertSelfAttention with the prefix of the attention's output
    assert module_names("BertModel").qkv == "attention.output.qkv_proj"
    # roberta.py: self.roberta = BertModel(prefix=maybe_prefix(prefix, "bert"))
    roberta = module_names("RobertaForSequenceClassification")
    assert (roberta.model, roberta.layer(1)) == ("roberta.encoder", "bert.encoder.layer.1")
    # gemma3.py: Gemma3Model(prefix="") builds f"{prefix}.layers"
    assert module_names("Gemma3TextModel").layer(2) == ".layers.2"
    # exaone_moe.py: ParallelLMHead(...) with no prefix
    assert module_names("ExaoneMoeForCausalLM").lm_head == ""
    # granitemoehybrid.py: self.mamba = MambaMixer2(..., prefix=f"{prefix}.mixer")
    assert module_names("GraniteMoeHybridForCausalLM").mixer == "mixer"
    # falcon_h1.py: the attention's linears hang off the layer's prefix
    assert module_names("FalconH1ForCausalLM").qkv == "qkv_proj"
    llama = module_names("LlamaForCausalLM")
    assert (llama.layer(0), llama.qkv, llama.up) == (
        "model.layers.0",
        "self_attn.qkv_proj",
        "mlp.gate_up_proj",
    )


def test_a_converted_architecture_is_its_base_class():
    # registry._normalize_arch: *ForSequenceClassification is *ForCausalLM converted
    assert registered_architecture("Qwen3ForSequenceClassification") == "Qwen3ForCausalLM"
    assert known_architecture("Qwen3ForSequenceClassification")
    assert unknown_architecture_warning("Qwen3ForSequenceClassification") is None


def test_an_unknown_architecture_is_a_plain_decoder_and_a_warning():
    names = module_names("FooBarForCausalLM")
    assert not names.known and names.layer(0) == "model.layers.0"
    warning = unknown_architecture_warning("FooBarForCausalLM")
    assert warning is not None and "FooBarForCausalLM" in warning and TABLE_RELEASE in warning
    assert unknown_architecture_warning("LlamaForCausalLM") is None


def _config(tmp_path: Path, arch: str) -> Path:
    config = {
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _gatekeeper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gatekeeper", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_estimate_and_check_warn_of_an_architecture_vllm_does_not_register(tmp_path: Path):
    model = str(_config(tmp_path, "FooBarForCausalLM"))
    text = _gatekeeper("estimate", model)
    assert text.returncode == 0, text.stderr
    assert "FooBarForCausalLM is not in vLLM 0.32.0's model registry" in text.stdout
    as_json = json.loads(_gatekeeper("estimate", model, "--json").stdout)
    assert any("FooBarForCausalLM" in w for w in as_json["warnings"]), as_json["warnings"]
    check = _gatekeeper("check", model, "--node", "1xH100-80GB", "--json")
    assert "FooBarForCausalLM is not in vLLM" in check.stdout, check.stdout[-2000:]


def test_a_registered_architecture_gets_no_such_warning(tmp_path: Path):
    as_json = json.loads(
        _gatekeeper("estimate", str(_config(tmp_path, "LlamaForCausalLM")), "--json").stdout
    )
    assert not any("model registry" in w for w in as_json["warnings"]), as_json["warnings"]


def test_the_rows_read_one_at_a_time_are_the_file_read_whole():
    """``module_names`` parses a row when it is asked for (#39), by the file's layout of
    one row to a line; every row, and the keys beside ``models``, read so are the file's."""
    from gatekeeper.models import module_names

    whole = json.loads(
        (ROOT / "gatekeeper" / "data" / "vllm_models" / f"{TABLE_RELEASE}.json").read_text()
    )
    rows, rest = module_names._file()
    assert sorted(rows) == sorted(whole["models"])
    assert rest == {k: v for k, v in whole.items() if k != "models"}
    assert all(module_names._parsed(name) == row for name, row in whole["models"].items())


def test_a_start_parses_only_the_rows_it_asks_for():
    """In a fresh process (no row cached by another test), naming one class's modules
    parses that row and the few it points to, not the table."""
    code = (
        "from gatekeeper.models import module_names as m\n"
        "m.module_names('LlamaForCausalLM')\n"
        "print(m._parsed.cache_info().currsize, len(m._file()[0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    parsed, rows = map(int, out.stdout.split())
    assert 1 <= parsed < 5 and rows == 391
