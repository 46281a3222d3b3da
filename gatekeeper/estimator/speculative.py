"""Speculative decoding: what ``--speculative-config`` adds to a worker's GPU memory.

The config is vLLM's JSON (``config/speculative.py``); the method is inferred as vLLM
infers it (``ngram`` for ``"model": "[ngram]"``, ``eagle``/``eagle3`` from the draft's
name, ``mtp`` for every ``*_mtp`` alias, else ``draft_model``). What each costs per rank:

- ``ngram``, ``ngram_gpu``, ``suffix``: proposals from the prompt; no weights, no KV.
- ``draft_model``: a second model in the same worker (``v1/spec_decode/draft_model.py``):
  all its weights at ``draft_tensor_parallel_size`` (default the target's TP), its own
  embedding and LM head, and a KV cache page for each of its layers.
- ``eagle``/``eagle3``: a head of a few decoder layers plus ``fc`` (2H, or 3H for
  EAGLE-3, to H, replicated); it shares the target's embedding and, unless it ships one
  (EAGLE-3's smaller ``draft_vocab_size`` head), the target's LM head
  (``llm_base_proposer.py::_maybe_share_embeddings``/``_maybe_share_lm_head``); KV for
  each of its layers.
- ``mtp``: the checkpoint's own ``num_nextn_predict_layers`` layers (a decoder layer of
  the target's last kind, ``eh_proj`` 2H to H and two norms each), sharing embedding and
  LM head; KV for each.

All drafts' layers join the target's KV blocks (one pool: ``bytes_per_block`` grows by
the draft's pages), the drafter's dummy forward runs over the same token budget during
the profile, and CUDA graphs are captured for decode batches of ``1 + k`` tokens per
request (``uniform_decode_query_len``), so the largest capture size becomes
``min(2 x max_num_seqs x (1 + k), 512)``. The profile's rejection-sampler run uses one
draft token per request, so the sampler peak does not grow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gatekeeper.errors import ServeOptionsError
from gatekeeper.models.spec import ModelSpec

__all__ = ["DRAFT_METHODS", "Speculative", "parse_speculative"]

Method = Literal["ngram", "ngram_gpu", "suffix", "draft_model", "eagle", "eagle3", "mtp"]
DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
"""Methods whose draft is a model of its own, named by ``"model"``."""
SUFFIX_TREE_DEPTH = 24
"""``suffix_decoding_max_tree_depth``'s default, suffix decoding's number of draft tokens."""
_FREE = ("ngram", "ngram_gpu", "suffix")
_UNMODELLED = ("medusa", "mlp_speculator", "dflash", "dspark", "custom_class",
               "extract_hidden_states")  # fmt: skip
_MTP_ALIASES = ("deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "ernie_mtp", "qwen3_next_mtp",
                "qwen3_5_mtp", "longcat_flash_mtp", "nemotron_h_mtp", "pangu_ultra_moe_mtp",
                "exaone_moe_mtp", "step3p5_mtp", "gemma4_mtp")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Speculative:
    """A speculative-decoding config as vLLM reads it."""

    text: str
    """The flag's JSON as given (canonical), written back at launch."""
    method: Method
    model: str | None
    """The draft's model reference (draft_model, eagle, eagle3)."""
    num_speculative_tokens: int | None
    """Draft tokens per step; None only for MTP (vLLM then uses the MTP layer count)."""
    draft_tensor_parallel_size: int | None = None

    @property
    def needs_draft(self) -> bool:
        """The estimate needs the draft model's spec (``estimate(..., draft=)``)."""
        return self.method in DRAFT_METHODS

    @property
    def on_gpu(self) -> bool:
        return self.method not in _FREE

    def tokens(self, spec: ModelSpec) -> int:
        """Draft tokens per step (MTP's default: one per MTP layer; suffix decoding's: its
        tree depth, 24)."""
        if self.num_speculative_tokens:
            return self.num_speculative_tokens
        return SUFFIX_TREE_DEPTH if self.method == "suffix" else max(1, spec.mtp_layers)


def _bad(text: str, why: str) -> ServeOptionsError:
    return ServeOptionsError(f"speculative_config: {why}", field="speculative_config", value=text)


def parse_speculative(data: Mapping[str, object], text: str) -> Speculative:
    """A ``--speculative-config`` (its JSON object, and that JSON's text) as vLLM reads
    it; ``ServeOptionsError`` names what vLLM would refuse or what gatekeeper cannot size."""
    k = data.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k <= 0):
        raise _bad(text, f"num_speculative_tokens {k!r} must be a positive whole number")
    draft_tp = data.get("draft_tensor_parallel_size")
    if draft_tp is not None and (not isinstance(draft_tp, int) or draft_tp <= 0):
        raise _bad(text, f"draft_tensor_parallel_size {draft_tp!r} must be a positive whole number")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(text, f"model {model!r} must be a model reference (a string)")
    method = _method(text, data.get("method"), model)
    if method in DRAFT_METHODS and not model:
        raise _bad(text, f'method {method} needs a draft "model"')
    if k is None and method not in ("mtp", "suffix"):
        raise _bad(text, "give num_speculative_tokens (how many tokens the drafter proposes)")
    return Speculative(text, method, model if method in DRAFT_METHODS else None, k, draft_tp)


def _method(text: str, method: object, model: str | None) -> Method:
    if method is None:
        if model in ("ngram", "[ngram]"):
            return "ngram"
        if model is None:
            raise _bad(
                text, 'give a "method" (ngram, eagle, eagle3, mtp, draft_model) or a "model"'
            )
        name = model.lower()
        return "eagle" if "eagle-" in name else "eagle3" if "eagle3" in name else "draft_model"
    if not isinstance(method, str):
        raise _bad(text, f"method {method!r} must be a string")
    if method == "[ngram]":
        return "ngram"
    if method in _MTP_ALIASES:
        return "mtp"
    if method in ("ngram", "ngram_gpu", "suffix", "draft_model", "eagle", "eagle3", "mtp"):
        return method  # type: ignore[return-value]
    if method in _UNMODELLED:
        raise _bad(
            text,
            f"method {method} is one vLLM runs but gatekeeper does not size yet; the methods "
            "it sizes are ngram, ngram_gpu, suffix, draft_model, eagle, eagle3 and mtp",
        )
    raise _bad(text, f"method {method!r} is not one of vLLM's speculative methods")
