"""GGUF files (``vllm serve ./model-Q4_K_M.gguf --tokenizer ORG/NAME``): the architecture
from the metadata, the weights exact from the tensor table.

Read with the ``gguf`` package (llama.cpp's, NumPy only; imported here alone, lazily:
about 0.2 s with NumPy). ``GGUFReader`` maps the file and parses the header, the
key/value metadata and the tensor table; no tensor data is read.

- **Config**: the llama.cpp keys ``{arch}.block_count``, ``embedding_length``,
  ``feed_forward_length``, ``attention.head_count[_kv]``, ``attention.key_length``,
  ``context_length``, ``expert_count`` ... become the Hugging Face ``config.json`` keys
  transformers' ``GGUF_CONFIG_MAPPING`` gives them (``integrations/ggml.py``, which is what
  vLLM's config loading runs for a GGUF file); the vocabulary is ``{arch}.vocab_size``, else
  the tokenizer's token list, else the embedding's rows; ``tie_word_embeddings`` is the
  absence of ``output.weight``, as transformers decides it. The file has no torch dtype, so
  the config says float32 and ``--dtype auto`` serves bf16, as vLLM does.
- **Weights**: each tensor's bytes from its GGML type (``GGML_QUANT_SIZES``: Q4_0 18 B per
  32 weights, Q8_0 34 per 32, Q4_K 144 per 256, Q6_K 210 per 256, F16 2 per 1 ...).
  vLLM holds every 2-D tensor as the file stores it, embeddings and the LM head included
  (``GGUFLinearMethod``, ``GGUFEmbeddingMethod``): those tensors are tagged ``gguf:TYPE``
  so the estimator takes their bytes as they are. 1-D tensors (norms, biases) are plain
  parameters in the model dtype: they keep their float type names (``F32``), which the
  estimator converts. vLLM merges q/k/v and gate/up into one parameter per layer and pads
  the shards' rows to the widest (``_create_padded_weight_param``: shards of different
  types, Q4_K next to Q6_K, have rows of different byte widths); each merged shard is
  counted at that width.
- **Names**: vLLM maps GGUF names back to the Hugging Face model's
  (``gguf_loader``); so does this module, for the parts whose sharding differs
  (``token_embd`` -> ``model.embed_tokens``, ``output`` -> ``lm_head``, ``blk.N.attn_k`` ->
  ``model.layers.N.self_attn.k_proj``, experts, the router). Other names keep their GGUF
  suffix under ``model.layers.N.``.

GGUF loading is gone from vLLM 0.32 (RFC vllm-project/vllm#39583): the spec's
quantization says so (``removed_in``), and the estimate for such a release refuses it
with what to do; ``--vllm-version 0.21.0`` sizes it for a release that loads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import CheckpointTensor, CheckpointWeights, ModelSpec

__all__ = ["is_gguf_file", "load_gguf", "read_gguf"]

_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen2moe": ("Qwen2MoeForCausalLM", "qwen2_moe"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
    "gemma2": ("Gemma2ForCausalLM", "gemma2"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
    "starcoder2": ("Starcoder2ForCausalLM", "starcoder2"),
    "stablelm": ("StableLmForCausalLM", "stablelm"),
    "falcon": ("FalconForCausalLM", "falcon"),
    "gpt2": ("GPT2LMHeadModel", "gpt2"),
    "nemotron": ("NemotronForCausalLM", "nemotron"),
    "deci": ("DeciLMForCausalLM", "deci"),
}
"""llama.cpp's ``general.architecture`` -> (vLLM's class, transformers' model type), for
the architectures transformers reads from GGUF (``GGUF_SUPPORTED_ARCHITECTURES``)."""

_CONFIG_KEYS: dict[str, str] = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "context_length": "max_position_embeddings",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.sliding_window": "sliding_window",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "expert_count": "num_experts",
    "expert_used_count": "num_experts_per_tok",
    "expert_feed_forward_length": "moe_intermediate_size",
    "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
}
"""llama.cpp key (after ``{arch}.``) -> Hugging Face config key."""

_NAMES: dict[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm"}
_MERGED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))
"""The shards vLLM merges into one parameter per layer (``qkv_proj``, ``gate_up_proj``)."""
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)\.(weight|bias)$")
_FLOATS = ("F32", "F16", "BF16", "F64")


def is_gguf_file(path: Path) -> bool:
    """A file vLLM would take for GGUF: ``.gguf`` by name, or the ``GGUF`` magic."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def read_gguf(path: Path) -> tuple[dict[str, Any], CheckpointWeights]:
    """(a Hugging Face style config, the exact tensors) of one GGUF file."""
    try:
        import gguf

        reader = gguf.GGUFReader(path, "r")
    except (ValueError, OSError, KeyError, IndexError, TypeError) as e:
        raise ModelSpecError(
            f"model: {path} cannot be read as GGUF ({type(e).__name__}: {e}); the file is "
            "truncated or not GGUF. Re-download it, or give a checkpoint directory",
            field="gguf",
            value=str(path),
        ) from e
    raw = [
        (t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), int(t.n_bytes))
        for t in reader.tensors
    ]
    names = {name for name, *_ in raw}
    config = _config(path, reader.fields, names, raw)
    tensors = tuple(_tensors(raw))
    checkpoint = CheckpointWeights(
        total_bytes=sum(t.num_bytes for t in tensors),
        tensors=tensors,
        source=f"GGUF tensor table ({path.name}, {len(tensors)} tensors)",
    )
    return config, checkpoint


def load_gguf(path: Path, overrides: Mapping[str, Any] | None = None) -> ModelSpec:
    """A ``ModelSpec`` for one GGUF file: what ``vllm serve FILE.gguf`` would hold."""
    config, checkpoint = read_gguf(path)
    spec = spec_from_config(
        config,
        name=path.name,
        source=f"GGUF file {path}",
        checkpoint=checkpoint,
        reference=str(path.resolve()),
        overrides=overrides,
    )
    return replace(spec, quantization=_quant(checkpoint))


def _field(fields: Mapping[str, Any], key: str) -> Any:
    field = fields.get(key)
    if field is None:
        return None
    value = field.contents()
    if isinstance(value, list):  # per-layer values (head_count_kv of some files)
        numbers = [v for v in value if isinstance(v, int | float)]
        return max(numbers) if numbers else None
    return value


def _config(
    path: Path, fields: Mapping[str, Any], names: set[str], raw: list[tuple[str, str, Any, int]]
) -> dict[str, Any]:
    arch = _field(fields, "general.architecture")
    if not isinstance(arch, str) or arch not in _ARCHITECTURES:
        known = ", ".join(sorted(_ARCHITECTURES))
        raise ModelSpecError(
            f"model: {path} is a GGUF file of architecture {arch!r}, which gatekeeper does not "
            f"read (it reads {known}); give the Hugging Face checkpoint directory instead",
            field="general.architecture",
            value=str(arch),
        )
    architecture, model_type = _ARCHITECTURES[arch]
    config: dict[str, Any] = {"architectures": [architecture], "model_type": model_type}
    for key, hf_key in _CONFIG_KEYS.items():
        value = _field(fields, f"{arch}.{key}")
        if value is not None:
            config[hf_key] = value
    if "vocab_size" not in config:
        tokens = fields.get("tokenizer.ggml.tokens")
        embedding = next((shape for name, _, shape, _ in raw if name == "token_embd.weight"), None)
        if tokens is not None:
            config["vocab_size"] = len(tokens.data)
        elif embedding is not None:
            config["vocab_size"] = embedding[0]
    if "num_experts" in config and model_type in ("llama", "mistral"):
        config["architectures"], config["model_type"] = ["MixtralForCausalLM"], "mixtral"
        config["num_local_experts"] = config.pop("num_experts")
    config["tie_word_embeddings"] = "output.weight" not in names
    config["torch_dtype"] = "float32"
    return config


def _hf_name(name: str) -> str:
    if m := _BLOCK_RE.fullmatch(name):
        layer, base, kind = m.groups()
        return f"model.layers.{layer}.{_NAMES.get(base, base)}.{kind}"
    base, _, kind = name.rpartition(".")
    return f"{_TOP_NAMES.get(base, base)}.{kind}" if base else name


def _tensors(raw: Iterable[tuple[str, str, tuple[int, ...], int]]) -> list[CheckpointTensor]:
    """Tensors named as vLLM's model names them, merged shards at the padded width."""
    items = list(raw)
    padded = _padded_bytes(items)
    out = []
    for name, kind, shape, num_bytes in items:
        held = len(shape) >= 2 or kind not in _FLOATS
        out.append(
            CheckpointTensor(
                name=_hf_name(name),
                dtype=f"gguf:{kind}" if held else kind,
                shape=shape,
                num_bytes=padded.get(name, num_bytes),
            )
        )
    return out


def _padded_bytes(items: list[tuple[str, str, tuple[int, ...], int]]) -> dict[str, int]:
    """Bytes of each shard of a merged parameter, its rows padded to the widest shard's
    bytes per row, as vLLM concatenates them."""
    shards = {
        name: (shape[0], num_bytes // shape[0])
        for name, _, shape, num_bytes in items
        if len(shape) == 2 and shape[0] > 0
    }
    out: dict[str, int] = {}
    layers = {m.group(1) for name in shards if (m := _BLOCK_RE.fullmatch(name))}
    for layer in layers:
        for group in _MERGED:
            members = [f"blk.{layer}.{base}.weight" for base in group]
            present = [n for n in members if n in shards]
            if len(present) < 2:
                continue
            width = max(shards[n][1] for n in present)
            out.update({n: shards[n][0] * width for n in present})
    return out


def _quant(checkpoint: CheckpointWeights) -> QuantSpec:
    """``gguf`` with the mean bits per weight of the stored 2-D tensors (for the simple
    method's P x Q/8; the estimate itself takes the tensors' bytes)."""
    import gguf

    bits = elements = 0
    for t in checkpoint.tensors:
        if not t.dtype.startswith("gguf:"):
            continue
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.dtype[5:]]]
        n = 1
        for d in t.shape:
            n *= d
        elements += n
        bits += n * size * 8 // block
    return QuantSpec(
        method="gguf",
        weight_bits=max(1, round(bits / elements)) if elements else 16,
        source="checkpoint",
        removed_in="0.32",
    )
