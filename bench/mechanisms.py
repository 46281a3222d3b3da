"""Each memory flag gatekeeper models, measured through the CLI and checked by hand.

For every mechanism (LoRA slots, speculative decoding, CPU offload, expert and decode
context parallelism, multimodal limits, block override, CUDA-graph capture, pooling,
sleep mode) one or more rows: a scenario (a catalog model, a GPU, flags), the figure that
the flag changes read from ``gatekeeper estimate MODEL ... --json`` without the flag and
with it (the installed console script, as an operator runs it), their difference, and
an independent hand computation of that difference from vLLM's own allocation rules
(the vLLM source file named in each row's formula). ``agree`` is within 1% for bytes
(exact when the hand figure is 0) and exact for counts (tokens, blocks, GPUs, B/token). Rows marked ``[with]`` check the figure with the flag rather
than the difference (``--num-gpu-blocks-override``, ``-O0``: the hand rule gives the
value, not the delta).

Drafts that are not in the catalog (the EAGLE head) are written as local checkpoint
directories (a config.json) in a temporary directory; nothing touches the network.

    python bench/mechanisms.py [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
BF16 = 2

Unit = Literal["GiB", "B/token", "tokens", "blocks", "GPUs"]


def gatekeeper_command() -> list[str]:
    """The installed console script: next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "gatekeeper"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("gatekeeper")
    if found:
        return [found]
    return [sys.executable, "-m", "gatekeeper"]


def run_estimate(model: str, gpu: str, flags: Sequence[str]) -> dict[str, Any]:
    """``gatekeeper estimate MODEL --gpu GPU FLAGS --json``, parsed."""
    cmd = [*gatekeeper_command(), "estimate", model, "--gpu", gpu, *flags, "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode not in (0, 1):  # 1: it does not fit, the figures are still there
        raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip()}")
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# --- the figures read from the JSON ------------------------------------------------


def weights(d: dict[str, Any]) -> int:
    return int(d["weights_bytes"])


def kv_per_token(d: dict[str, Any]) -> int:
    return int(d["kv_bytes_per_token"])


def kv_bytes(d: dict[str, Any]) -> int:
    return int(d["kv_cache_bytes"])


def graph_bytes(d: dict[str, Any]) -> int:
    return int(d["cuda_graph_bytes"])


def capture(d: dict[str, Any]) -> int:
    return int(d["options"]["cuda_graph_capture_size"])


def blocks_per_request(d: dict[str, Any]) -> int:
    return int(d["blocks_per_request"])


def gpus(d: dict[str, Any]) -> int:
    return int(d["gpus"])


def non_kv(d: dict[str, Any]) -> int:
    """Everything in the budget but the KV cache."""
    return int(
        d["weights_bytes"]
        + d["non_torch_bytes"]
        + d["activation_peak_bytes"]
        + d["cuda_graph_bytes"]
    )


# --- hand computations from vLLM's rules -------------------------------------------


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Dense:
    """A dense Llama-style decoder (the few config.json fields the rules use)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    vocab: int
    tied: bool
    max_pos: int


LLAMA_8B = Dense(4096, 32, 8, 128, 14336, 32, 128256, False, 131072)
LLAMA_1B = Dense(2048, 32, 8, 64, 8192, 16, 128256, True, 131072)
LLAMA_70B = Dense(8192, 64, 8, 128, 28672, 80, 128256, False, 131072)


def lora_linear_elements(m: Dense, rank: int, tp: int, fully_sharded: bool) -> int:
    """Per layer and slot, the ``lora_a_stacked`` + ``lora_b_stacked`` elements of
    ``create_lora_weights`` (lora/layers/base_linear.py:104-150 and the merged
    column-parallel override, lora/layers/column_parallel_linear.py:88-125).
    Column-parallel: a ``[rank(/tp), input]`` per slice, b ``[out_slice/tp, rank]``;
    row-parallel: a ``[rank, input/tp]``, b ``[out(/tp), rank]``."""
    rank_a = rank // tp if fully_sharded else rank
    h = m.hidden
    kv = max(1, m.kv_heads // tp) * m.head_dim
    q = m.heads * m.head_dim // tp
    qkv = 3 * rank_a * h + (q + 2 * kv) * rank
    o_out = h // tp if fully_sharded else h
    o = rank * (m.heads * m.head_dim // tp) + o_out * rank
    gate_up = 2 * rank_a * h + 2 * (m.inter // tp) * rank
    down = rank * (m.inter // tp) + o_out * rank
    return qkv + o + gate_up + down


def lora_vocab_elements(m: Dense, rank: int) -> int:
    """Per slot, the embedding and LM-head wrappers LlamaForCausalLM's
    ``embedding_modules`` (models/llama.py:479) bring in: VocabParallelEmbeddingWithLoRA
    a ``[org_vocab, rank]`` + b ``[H, rank]`` (lora/layers/vocab_parallel_embedding.py:31-47)
    and LogitsProcessorWithLoRA a ``[rank, H]`` + b ``[vocab, rank]``
    (lora/layers/logits_processor.py:93-110); neither is split by TP."""
    return 2 * rank * (m.vocab + m.hidden)


def hand_lora(loras: int, rank: int) -> int:
    m = LLAMA_8B
    per_slot = m.layers * lora_linear_elements(m, rank, 1, False) + lora_vocab_elements(m, rank)
    return loras * per_slot * BF16


def hand_fully_sharded(loras: int, rank: int, tp: int) -> int:
    m = LLAMA_8B
    sharded = lora_linear_elements(m, rank, tp, True)
    plain = lora_linear_elements(m, rank, tp, False)
    return loras * m.layers * (sharded - plain) * BF16  # vocab wrappers are the same


def llama_layer_params(m: Dense, tp: int) -> list[int]:
    """Per-rank parameter elements of one LlamaDecoderLayer in ``named_parameters``
    order: qkv_proj, o_proj, gate_up_proj, down_proj, input_layernorm,
    post_attention_layernorm."""
    kv = max(1, m.kv_heads // tp) * m.head_dim
    q = m.heads * m.head_dim // tp
    return [
        m.hidden * (q + 2 * kv),
        q * m.hidden,
        2 * (m.inter // tp) * m.hidden,
        (m.inter // tp) * m.hidden,
        m.hidden,
        m.hidden,
    ]


def dense_weights(m: Dense, tp: int = 1) -> int:
    """All weights of a dense Llama at TP ``tp`` plus its rotary cos/sin cache
    (``max_pos x head_dim`` in the model dtype)."""
    vocab = cdiv(m.vocab, 64) * 64 // tp
    embed = vocab * m.hidden * (1 if m.tied else 2)
    layers = m.layers * sum(llama_layer_params(m, tp))
    return (embed + layers + m.hidden + m.max_pos * m.head_dim) * BF16


def hand_offload(gib: float) -> int:
    """UVAOffloader._maybe_offload_to_cpu (model_executor/offloader/uva.py:84-124): layer
    by layer, parameter by parameter, a whole parameter moves while the running total is
    below the limit, so the last one overshoots it."""
    limit = int(gib * GIB)
    moved = 0
    for _ in range(LLAMA_70B.layers):
        for p in llama_layer_params(LLAMA_70B, 2):
            if moved >= limit:
                return -moved
            moved += p * BF16
    return -moved


def hand_eagle_weights() -> int:
    """llama_eagle.py:93-118: one LlamaDecoderLayer (layer 0 without input_layernorm),
    ``fc`` 2H -> H replicated, no final norm; embed_tokens and lm_head shared with the
    target (v1/spec_decode/llm_base_proposer.py:1416-1575)."""
    m = Dense(4096, 32, 8, 128, 14336, 1, 128256, False, 131072)
    layer = sum(llama_layer_params(m, 1)) - m.hidden  # no input_layernorm on layer 0
    return (layer + 2 * m.hidden * m.hidden) * BF16


def hand_draft_weights() -> int:
    """v1/spec_decode/draft_model.py:115-122: a draft model shares nothing; all of
    Llama-3.2-1B (tied embedding, 16 layers, final norm, its own rotary cache)."""
    return dense_weights(LLAMA_1B)


def fp8_block(out_f: int, in_f: int) -> int:
    """An fp8 linear with 128x128 fp32 ``weight_scale_inv`` (quantization/fp8.py)."""
    return out_f * in_f + cdiv(out_f, 128) * cdiv(in_f, 128) * 4


def hand_mtp_weights(tp: int) -> int:
    """deepseek_mtp.py:80-110: per MTP layer a DeepseekV2DecoderLayer (MLA + MoE, fp8
    block-quantized as the checkpoint), ``enorm``/``hnorm``/``shared_head.norm`` and
    ``eh_proj`` (a plain nn.Linear 2H -> H in bf16); embedding and ``shared_head.head``
    shared with the target (llm_base_proposer.py:1470, 1546-1575). DeepSeek-V3: H 7168,
    128 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, 256 experts of 2048."""
    h, heads, e, inter = 7168, 128, 256, 2048
    n = heads // tp
    attn = fp8_block(1536, h)  # q_a_proj, replicated
    attn += fp8_block(n * 192, 1536)  # q_b_proj
    attn += fp8_block(576, h)  # kv_a_proj_with_mqa, replicated
    attn += fp8_block(n * 256, 512)  # kv_b_proj
    attn += fp8_block(h, n * 128)  # o_proj
    attn += (1536 + 512) * BF16  # q_a_layernorm, kv_a_layernorm
    attn += 2 * n * 128 * 512 * BF16  # W_UK_T and W_UV, dequantized (mla_attention.py)
    i = inter // tp
    experts = e * (2 * i * h + cdiv(2 * i, 128) * cdiv(h, 128) * 4)  # w13 + scales
    experts += e * (h * i + cdiv(h, 128) * cdiv(i, 128) * 4)  # w2 + scales
    shared = fp8_block(2 * i, h) + fp8_block(h, i)
    gate = e * h * BF16 + e * 4  # GateLinear (bf16) + e_score_correction_bias (fp32)
    norms = 2 * h * BF16  # input_layernorm, post_attention_layernorm
    layer = attn + experts + shared + gate + norms
    return layer + 3 * h * BF16 + 2 * h * h * BF16


def hand_ep_dp2() -> int:
    """fused_moe/layer.py: with expert parallelism over dp x tp = 2 ranks each holds
    128 / 2 whole experts instead of all 128 at full width (TP=1):
    Qwen3-30B-A3B, 48 layers, H 2048, moe_intermediate 768."""
    per_expert = 3 * 2048 * 768 * BF16
    return -48 * (128 - 64) * per_expert


def vl_vision_per_rank(tp: int) -> int:
    """Qwen2_5_VisionTransformer (models/qwen2_5_vl.py) of Qwen2.5-VL-72B: patch_embed
    Conv3d 3x2x14x14 -> 1280 (replicated), 32 blocks (2 RMSNorms, qkv 1280 -> 3840 +
    bias, proj 1280 -> 1280 + bias, gate_up 1280 -> 2x3456 + bias, down 3456 -> 1280 +
    bias), merger (ln_q, 5120 -> 5120 + bias, 5120 -> 8192 + bias); column weights and
    biases split by TP, row weights split, row biases and norms replicated."""
    h, inter = 1280, 3456
    block = 2 * h  # norms
    block += (h * 3 * h + 3 * h) // tp + h * h // tp + h  # qkv (col) + proj (row)
    block += (h * 2 * inter + 2 * inter) // tp + inter * h // tp + h  # gate_up + down
    merger = h + (5120 * 5120 + 5120) // tp + 5120 * 8192 // tp + 8192
    return (3 * 2 * 14 * 14 * h + 32 * block + merger) * BF16


def capture_sizes(max_size: int, max_tokens: int, max_num_seqs: int) -> list[int]:
    """config/vllm.py::_set_cudagraph_sizes (2341-2500) for an explicit
    ``--max-cudagraph-capture-size`` and no speculative decoding."""
    cap = min(max_tokens, max_size)
    sizes = [i for i in (1, 2, 4) if i <= cap]
    if cap >= 8:
        sizes += list(range(8, min(cap + 1, 256), 8))
    if cap >= 256:
        sizes += list(range(256, cap + 1, 16))
    if max_tokens <= cap and max_tokens not in sizes:
        sizes.append(max_tokens)
    return sorted(set(sizes))


# --- the scenarios -----------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    mechanism: str
    model: str
    gpu: str
    base: tuple[str, ...]
    """Flags on both sides."""
    flag: tuple[str, ...]
    """The flags added on the 'with' side."""
    component: str
    unit: Unit
    read: Callable[[dict[str, Any]], int]
    hand: Callable[[], int]
    formula: str
    check: Literal["difference", "with"] = "difference"


@dataclass(frozen=True)
class Row:
    scenario: Scenario
    without: int
    with_: int
    hand: int

    @property
    def difference(self) -> int:
        return self.with_ - self.without

    @property
    def checked(self) -> int:
        return self.difference if self.scenario.check == "difference" else self.with_

    @property
    def agree(self) -> bool:
        if self.hand == 0 or self.scenario.unit != "GiB":
            return self.checked == self.hand  # whole counts: exact
        return abs(self.checked - self.hand) <= 0.01 * abs(self.hand)


EAGLE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "torch_dtype": "float16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
}
"""yuhuili/EAGLE-LLaMA3.1-Instruct-8B's shape (a 1-layer Llama head)."""


def write_eagle(directory: Path) -> Path:
    head = directory / "EAGLE-LLaMA3.1-Instruct-8B"
    head.mkdir(parents=True, exist_ok=True)
    (head / "config.json").write_text(json.dumps(EAGLE_CONFIG, indent=2))
    return head


L8 = "meta-llama/Llama-3.1-8B-Instruct"
H100 = "H100-80GB"
H200 = "H200-141GB"
LORA = ("--enable-lora", "--max-loras", "8", "--max-lora-rank", "256")


def scenarios(eagle_dir: Path) -> list[Scenario]:
    spec = json.dumps
    eagle = spec({"method": "eagle", "model": str(eagle_dir), "num_speculative_tokens": 3})
    draft = spec({"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4})
    ngram = spec({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    mtp = spec({"method": "deepseek_mtp", "num_speculative_tokens": 1})
    bs16 = LLAMA_8B.layers * 16 * 2 * LLAMA_8B.kv_heads * LLAMA_8B.head_dim * BF16
    return [
        Scenario("LoRA slots", L8, H100, (), LORA, "weights", "GiB", weights,
                 lambda: hand_lora(8, 256),
                 "8 x 256 x 2 B x [32 x 81,920 linear (lora/layers/base_linear.py:133-150)"
                 " + 2 x (128,256 + 4,096) embed_tokens + lm_head wrappers"
                 " (vocab_parallel_embedding.py:31, logits_processor.py:93)]"),
        Scenario("fully-sharded LoRA", L8, H100, ("-tp", "2", *LORA),
                 ("--fully-sharded-loras",), "weights/rank", "GiB", weights,
                 lambda: hand_fully_sharded(8, 256, 2),
                 "8 x 32 x 2 B x 256 x -(5 x 4096/2 [qkv, gate_up lora_a rank/tp]"
                 " + 2 x 4096/2 [o, down lora_b out/tp]) (base_linear.py:115-129)"),
        Scenario("max_cpu_loras", L8, H100, LORA, ("--max-cpu-loras", "32"), "KV cache",
                 "GiB", kv_bytes, lambda: 0,
                 "0: a host-side LRU of adapters (lora/model_manager.py:335 capacity)"),
        Scenario("ngram", L8, H100, (), ("--speculative-config", ngram), "non-KV in budget",
                 "GiB", non_kv, lambda: 0,
                 "0: NgramProposer matches on CPU numpy (v1/spec_decode/ngram_proposer.py);"
                 " capture max min(2x1024x4, 512) = 512 unchanged"),
        Scenario("EAGLE head", L8, H100, (), ("--speculative-config", eagle), "weights",
                 "GiB", weights, hand_eagle_weights,
                 "2 B x (4096x6144 + 4096^2 + 3x4096x14336 + 4096 [one layer, no"
                 " input_layernorm] + 8192x4096 fc) (models/llama_eagle.py:93-118)"),
        Scenario("EAGLE head", L8, H100, (), ("--speculative-config", eagle),
                 "KV bytes/token", "B/token", kv_per_token,
                 lambda: 1 * 2 * 8 * 128 * BF16,
                 "1 layer x 2 x 8 KV heads x 128 x 2 B (FullAttentionSpec)"),
        Scenario("MTP", "deepseek-ai/DeepSeek-V3", H200, ("-tp", "8"),
                 ("--speculative-config", mtp), "weights/rank", "GiB", weights,
                 lambda: hand_mtp_weights(8),
                 "1 fp8 MLA+MoE layer /tp8 (256 experts x 3 x 7168 x 256 + 128x128 scales)"
                 " + W_UK_T/W_UV bf16 + eh_proj 14336x7168x2 B (models/deepseek_mtp.py:85-110)"),
        Scenario("MTP", "deepseek-ai/DeepSeek-V3", H200, ("-tp", "8"),
                 ("--speculative-config", mtp), "KV bytes/token", "B/token", kv_per_token,
                 lambda: (512 + 64) * BF16,
                 "1 MTP layer x (kv_lora 512 + rope 64) x 2 B (MLAAttentionSpec, not / tp)"),
        Scenario("draft model", L8, H100, (), ("--speculative-config", draft), "weights",
                 "GiB", weights, hand_draft_weights,
                 "Llama-3.2-1B whole: 2 B x (128,256x2048 tied + 16 x 60,821,504 + 2048"
                 " + 131072x64 rotary) (v1/spec_decode/draft_model.py:115-122)"),
        Scenario("draft model", L8, H100, (), ("--speculative-config", draft),
                 "KV bytes/token", "B/token", kv_per_token,
                 lambda: LLAMA_1B.layers * 2 * 8 * 64 * BF16,
                 "16 draft layers x 2 x 8 KV heads x 64 x 2 B"),
        Scenario("cpu offload", "meta-llama/Llama-3.3-70B-Instruct", H100, ("-tp", "2"),
                 ("--cpu-offload-gb", "10"), "weights/rank", "GiB", weights,
                 lambda: hand_offload(10),
                 "-(whole parameters, layer order, until >= 10 GiB): 12 layers + qkv + o"
                 " + gate_up = 10,384 MiB (model_executor/offloader/uva.py:84-124)"),
        Scenario("expert parallel", "Qwen/Qwen3-30B-A3B", H100, ("-dp", "2"),
                 ("--enable-expert-parallel",), "weights/rank", "GiB", weights, hand_ep_dp2,
                 "-48 layers x 64 experts x 3 x 2048 x 768 x 2 B (128 -> 64 local experts)"),
        Scenario("expert parallel", "Qwen/Qwen3-30B-A3B", H100, ("-tp", "2"),
                 ("--enable-expert-parallel",), "weights/rank", "GiB", weights, lambda: 0,
                 "0: 128 experts x I/2 (TP) = 64 experts x I (EP)"),
        Scenario("expert parallel", "Qwen/Qwen3-30B-A3B", H100, ("-dp", "2"),
                 ("--enable-expert-parallel",), "GPUs needed", "GPUs", gpus, lambda: 0,
                 "0: dp x tp = 2 either way (EP reuses the DP x TP ranks)"),
        Scenario("decode context parallel", "deepseek-ai/DeepSeek-V2-Lite", H100,
                 ("-tp", "2", "--max-model-len", "32768"), ("-dcp", "2"),
                 "blocks/request", "blocks", blocks_per_request,
                 lambda: cdiv(32768, 64 * 2) - cdiv(32768, 64),
                 "cdiv(L, bs x dcp) - cdiv(L, bs), bs 64 (v1/core/kv_cache_utils.py:728-730)"),
        Scenario("limit-mm image 0", "Qwen/Qwen2.5-VL-72B-Instruct", H100, ("-tp", "4"),
                 ("--limit-mm-per-prompt", '{"image": 0}'), "weights/rank", "GiB", weights,
                 lambda: 0,
                 "0: the tower is skipped only if image AND video are 0; video defaults to"
                 " 999 (models/interfaces.py:380, config/multimodal.py:702-706)"),
        Scenario("limit-mm image+video 0", "Qwen/Qwen2.5-VL-72B-Instruct", H100,
                 ("-tp", "4"), ("--limit-mm-per-prompt", '{"image": 0, "video": 0}'),
                 "weights/rank", "GiB", weights, lambda: -vl_vision_per_rank(4),
                 "-(ViT 32 blocks + merger)/tp4 x 2 B, StageMissingLayer"
                 " (models/interfaces.py:373-380, qwen2_5_vl.py:1434)"),
        Scenario("num-gpu-blocks-override", L8, H100, (),
                 ("--num-gpu-blocks-override", "1000"), "KV cache [with]", "GiB", kv_bytes,
                 lambda: 1000 * bs16,
                 "1000 x 32 layers x 16 x 2 x 8 x 128 x 2 B (kv_cache_utils.py:2620)",
                 check="with"),
        Scenario("max capture size 256", L8, H100, (),
                 ("--max-cudagraph-capture-size", "256"), "capture size [with]", "tokens",
                 capture,
                 lambda: capture_sizes(256, 8192, 1024)[-1],
                 "largest of [1,2,4]+range(8,256,8)+range(256,257,16) = 256"
                 " (config/vllm.py:2473-2484)", check="with"),
        Scenario("max capture size 100", L8, H100, (),
                 ("--max-cudagraph-capture-size", "100"), "capture size [with]", "tokens",
                 capture,
                 lambda: capture_sizes(100, 8192, 1024)[-1],
                 "largest of [1,2,4]+range(8,101,8) = 96; the flag is truncated to it"
                 " (config/vllm.py:2473-2478, 2502-2525)", check="with"),
        Scenario("capture sizes 1..16", L8, H100, (),
                 ("--cudagraph-capture-sizes", "1", "2", "4", "8", "16"), "capture size [with]",
                 "tokens", capture, lambda: 16,
                 "max(dedup sizes <= max_num_batched_tokens) = 16 (config/vllm.py:2454-2465)",
                 check="with"),
        Scenario("-O0", L8, H100, (), ("-O0",), "CUDA graphs [with]", "GiB", graph_bytes,
                 lambda: 0, "0: -O0 -> cudagraph_mode NONE, profile_cudagraph_memory skipped",
                 check="with"),
        Scenario("cudagraph_mode NONE", L8, H100, (),
                 ("--compilation-config", '{"cudagraph_mode": "NONE"}'),
                 "CUDA graphs [with]", "GiB", graph_bytes, lambda: 0,
                 "0: _set_cudagraph_sizes captures nothing (config/vllm.py:2341-2345)",
                 check="with"),
        Scenario("pooling (convert embed)", L8, H100, (), ("--convert", "embed"), "weights",
                 "GiB", weights, lambda: -cdiv(128256, 64) * 64 * 4096 * BF16,
                 "-128,256 x 4096 x 2 B: lm_head left uninitialised as StageMissingLayer"
                 " (models/adapters.py:143-148)"),
        Scenario("sleep mode", L8, H100, (), ("--enable-sleep-mode",), "KV cache", "GiB",
                 kv_bytes, lambda: 0,
                 "0 awake: CuMemAllocator pools the same tensors (device_allocator/cumem.py)"),
    ]  # fmt: skip


def measure(s: Scenario) -> Row:
    without = s.read(run_estimate(s.model, s.gpu, s.base))
    with_ = s.read(run_estimate(s.model, s.gpu, (*s.base, *s.flag)))
    return Row(s, without, with_, s.hand())


def fmt(value: int, unit: Unit) -> str:
    if unit == "GiB":
        return f"{value / GIB:+.3f}" if value < 0 else f"{value / GIB:.3f}"
    return str(value)


def render(rows: Sequence[Row]) -> str:
    head = (
        f"{'mechanism':<25} {'component':<18} {'unit':<7} {'without':>9} {'with':>9} "
        f"{'diff':>9} {'hand':>9} agree"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r.scenario
        lines.append(
            f"{s.mechanism:<25} {s.component:<18} {s.unit:<7} {fmt(r.without, s.unit):>9} "
            f"{fmt(r.with_, s.unit):>9} {fmt(r.difference, s.unit):>9} "
            f"{fmt(r.hand, s.unit):>9} {'yes' if r.agree else 'NO'}"
        )
        base = " ".join(s.base)
        lines.append(f"    {s.model} on {s.gpu} {base} + {' '.join(s.flag)}".rstrip())
        lines.append(f"    hand: {s.formula}")
        if not r.agree:
            lines.append(
                f"    DISAGREES: gatekeeper {r.checked} vs hand {r.hand} "
                f"({r.checked - r.hand:+d} {'B' if s.unit == 'GiB' else s.unit})"
            )
    agreeing = sum(r.agree for r in rows)
    lines.append(f"{agreeing} of {len(rows)} rows agree within 1%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="rows whose mechanism contains this text")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [
            s
            for s in scenarios(write_eagle(Path(tmp)))
            if not args.only or args.only.lower() in s.mechanism.lower()
        ]
        rows = [measure(s) for s in chosen]
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
