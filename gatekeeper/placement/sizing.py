"""How a rank's KV cache is sized, in the one wording every door uses.

Pure. ``check``, ``plan``, the sidecar's admission, the mutating webhook's claims and the
validating webhook's denials all say how much KV cache a rank was sized with through
``kv_text``: "KV cache 5.00 GiB sized for 8 sequences of 8192 tokens". The count is
read back from the bytes (``sequences_held``), the way vLLM reports "Maximum
concurrency for N tokens per request" at start-up (``vllm/v1/core/kv_cache_utils.py``,
``_report_kv_cache_config``): the KV blocks less vLLM's null block, over the blocks one
sequence of max_model_len holds. So the words follow the bytes, whichever rule chose
them (vLLM's least, one sequence; ``share_gpus``' ``shared_kv_sequences``; the request's
``min_sequences`` or ``min_kv_tokens``; the operator's own budget), and two doors that
size the same line the same way say the same thing.

Worked example: Llama-3.3-70B-Instruct, TP 2, --max-model-len 8192, fp8 KV (80 layers x
4 KV heads per rank x 128 x 2 x 1 byte = 80 KiB a token, blocks of 16 tokens): one
sequence is 512 blocks, 0.63 GiB with the null block, "sized for 1 sequence of 8192
tokens"; 5.00 GiB holds 4 097 blocks, "sized for 8 sequences of 8192 tokens".
"""

from __future__ import annotations

from gatekeeper.estimator.vllm_method import Estimate
from gatekeeper.units import format_gib

__all__ = ["kv_text", "need_text", "sequences_held", "sized_for"]


def sequences_held(e: Estimate, kv_bytes: int) -> int:
    """Sequences of max_model_len that ``kv_bytes`` of KV cache per rank hold at once
    (vLLM's null block set aside); 0 for a model without a KV cache."""
    if not e.kv_block_bytes or not e.blocks_per_request:
        return 0
    return max(0, kv_bytes // e.kv_block_bytes - 1) // e.blocks_per_request


def sized_for(sequences: int, tokens: int) -> str:
    """``sized for 8 sequences of 8192 tokens`` (one sequence: ``1 sequence``)."""
    noun = "sequence" if sequences == 1 else "sequences"
    return f"sized for {sequences} {noun} of {tokens} tokens"


def kv_text(e: Estimate, kv_bytes: int) -> str:
    """``KV cache 0.63 GiB sized for 1 sequence of 8192 tokens``: the bytes per rank and
    what they hold (a model without a KV cache: ``no KV cache``)."""
    if not e.kv_block_bytes:
        return "no KV cache"
    held = sequences_held(e, kv_bytes)
    return f"KV cache {format_gib(kv_bytes)} {sized_for(held, e.max_model_len)}"


def need_text(name: str, tp: int, pp: int, e: Estimate, rank_bytes: int, kv_bytes: int) -> str:
    """What one rank of a (TP, PP) shape needs on a GPU product (``rank_bytes``, the
    estimate ``e`` on that product with ``kv_bytes`` of KV cache), component by component,
    with its KV cache in ``kv_text``'s words: placement's rejections (``check``, ``plan``,
    the sidecar) and the mutating webhook's claims say it alike."""
    w = e.worst
    shape = f"TP={tp}" + (f" PP={pp}" if pp > 1 else "")
    return (
        f"{name} at {shape} needs {format_gib(rank_bytes)} per GPU "
        f"({e.gpu_total_bytes / 2**30:.2f} GiB GPUs): weights {format_gib(w.weights_bytes)}, "
        f"{kv_text(e, kv_bytes)}, activation {format_gib(w.activation_peak_bytes)}, "
        f"non-torch {format_gib(w.non_torch_bytes)}, CUDA graphs {format_gib(w.cuda_graph_bytes)}"
    )
