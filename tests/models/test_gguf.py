"""GGUF files built here with the ``gguf`` package's writer: the architecture from the
metadata, the weights exact from the tensor table, as vLLM's GGUF loader holds them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from gatekeeper.errors import ModelSpecError
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.models.source import resolve_model
from gatekeeper.units import GIB

Q4_K, Q6_K, Q8_0 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K, GGMLQuantizationType.Q8_0
H, INTER, VOCAB, LAYERS, MAX_POS = 256, 512, 1000, 2, 512
HEAD_DIM = 64  # 4 heads of 64; 2 KV heads: k and v have 128 rows


def quantized(rows: int, cols: int, kind: GGMLQuantizationType) -> np.ndarray:
    """Raw GGML blocks of a ``rows x cols`` weight (uint8, bytes per row as the type says)."""
    block, size = GGML_QUANT_SIZES[kind]
    return np.zeros((rows, cols // block * size), np.uint8)


def write_gguf(path: Path, *, tied: bool = False, arch: str = "llama") -> Path:
    """A two-layer Llama in the Q4_K_M manner: Q4_K with attn_v, ffn_down and the
    output in Q6_K, norms in F32."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_embedding_length(H)
    w.add_context_length(MAX_POS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_vocab_size(VOCAB)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)

    def add(name: str, data: np.ndarray, kind: GGMLQuantizationType | None = None) -> None:
        w.add_tensor(name, data, raw_dtype=kind)

    add("token_embd.weight", quantized(VOCAB, H, Q4_K), Q4_K)
    add("output_norm.weight", np.ones(H, np.float32))
    if not tied:
        add("output.weight", quantized(VOCAB, H, Q6_K), Q6_K)
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
        add(f"blk.{i}.attn_q.weight", quantized(H, H, Q4_K), Q4_K)
        add(f"blk.{i}.attn_k.weight", quantized(128, H, Q4_K), Q4_K)
        add(f"blk.{i}.attn_v.weight", quantized(128, H, Q6_K), Q6_K)
        add(f"blk.{i}.attn_output.weight", quantized(H, H, Q4_K), Q4_K)
        add(f"blk.{i}.ffn_gate.weight", quantized(INTER, H, Q4_K), Q4_K)
        add(f"blk.{i}.ffn_up.weight", quantized(INTER, H, Q4_K), Q4_K)
        add(f"blk.{i}.ffn_down.weight", quantized(H, INTER, Q6_K), Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Bytes per row: Q4_K 144 per 256 weights, Q6_K 210 per 256.
EMBED = 1024 * 144  # vocab padded to 64: 1,024 rows
LM_HEAD = 1024 * 210
QKV = (256 + 128 + 128) * 210  # merged, every shard padded to the widest row (v's Q6_K)
O_PROJ = 256 * 144
GATE_UP = 1024 * 144
DOWN = 256 * 2 * 210
NORMS = 2 * H * 2  # F32 in the file, bf16 parameters in vLLM
ROPE = MAX_POS * HEAD_DIM * 2
WEIGHTS = EMBED + LM_HEAD + H * 2 + LAYERS * (QKV + O_PROJ + GATE_UP + DOWN + NORMS) + ROPE


def test_metadata_gives_the_architecture(tmp_path: Path) -> None:
    spec = resolve_model(str(write_gguf(tmp_path / "tiny-Q4_K_M.gguf")))
    assert spec.name == "tiny-Q4_K_M.gguf"
    assert spec.serve_reference == str((tmp_path / "tiny-Q4_K_M.gguf").resolve())
    assert (spec.architecture, spec.num_layers, spec.hidden_size) == ("LlamaForCausalLM", 2, H)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim) == (4, 2, HEAD_DIM)
    assert (spec.intermediate_size, spec.vocab_size, spec.max_position_embeddings) == (
        INTER,
        VOCAB,
        MAX_POS,
    )
    assert not spec.tie_word_embeddings
    assert spec.quantization is not None and spec.quantization.method == "gguf"
    assert spec.quantization.removed_in == "0.32"


OLD = ServeOptions(vllm_version="0.21.0")  # a release that still loads GGUF


def test_weights_are_exact_from_the_tensor_table(tmp_path: Path) -> None:
    spec = resolve_model(str(write_gguf(tmp_path / "m.gguf")))
    assert spec.checkpoint is not None
    by_type = spec.checkpoint.bytes_by_dtype()
    assert by_type["F32"] == (1 + 2 * LAYERS) * H * 4  # the norms, as stored
    assert by_type["gguf:Q6_K"] == VOCAB * 210 + LAYERS * (128 * 210 + DOWN)
    # q and k are Q4_K but held at the merged qkv's padded width (210 bytes a row)
    assert by_type["gguf:Q4_K"] == VOCAB * 144 + LAYERS * (384 * 210 + O_PROJ + GATE_UP)
    e = estimate(spec, OLD, GpuTarget(total_bytes=16 * GIB))
    assert e.fits
    assert e.dtype == "bfloat16"  # no torch dtype in GGUF: served in bf16, as vLLM does
    assert e.weights_source == "GGUF tensor table (m.gguf, 21 tensors)"
    assert e.worst.weights_bytes == WEIGHTS


def test_kv_heads_and_vocab_are_sharded_as_vllm_shards_them(tmp_path: Path) -> None:
    spec = resolve_model(str(write_gguf(tmp_path / "m.gguf")))
    options = ServeOptions(tensor_parallel_size=2, vllm_version="0.21.0")
    e = estimate(spec, options, GpuTarget(total_bytes=16 * GIB))
    q_o_gate_up_down = (256 * 210 + O_PROJ + GATE_UP + DOWN) // 2
    kv = 2 * 128 * 210 // 2  # one of the two KV heads on each rank
    per_rank = (EMBED + LM_HEAD) // 2 + H * 2 + LAYERS * (q_o_gate_up_down + kv + NORMS) + ROPE
    assert e.worst.weights_bytes == per_rank


def test_tied_embeddings_when_there_is_no_output_tensor(tmp_path: Path) -> None:
    spec = resolve_model(str(write_gguf(tmp_path / "tied.gguf", tied=True)))
    assert spec.tie_word_embeddings
    e = estimate(spec, OLD, GpuTarget(total_bytes=16 * GIB))
    assert e.worst.weights_bytes == WEIGHTS - LM_HEAD


def test_a_file_that_is_not_gguf_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 10)
    with pytest.raises(ModelSpecError, match=r"cannot be read as GGUF .* truncated or not GGUF"):
        resolve_model(str(bad))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelSpecError, match="a file that is not GGUF"):
        resolve_model(str(tmp_path / "notes.txt"))
    with pytest.raises(ModelSpecError, match=r"GGUF file .* does not exist"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_an_architecture_not_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match=r"architecture 'rwkv6'.*reads .*llama"):
        resolve_model(str(write_gguf(tmp_path / "r.gguf", arch="rwkv6")))


def test_estimate_of_a_gguf_file_with_its_tokenizer(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny-Q4_K_M.gguf")
    out = subprocess.run(
        [
            *(sys.executable, "-m", "gatekeeper", "estimate", str(path)),
            *("--tokenizer", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory", "16GiB"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out.stderr  # DOES NOT FIT: the default release cannot load it
    assert "gguf (checkpoint)" in out.stdout and "GGUF tensor table" in out.stdout
    assert "no longer loads gguf" in out.stdout  # the default release, 0.33, cannot
    assert "--tokenizer" not in out.stderr  # accepted: it does not change memory
    old = subprocess.run(
        [sys.executable, "-m", "gatekeeper", "estimate", str(path), "--vllm-version", "0.21.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert old.returncode == 0 and "verdict: FITS" in old.stdout, old.stderr
