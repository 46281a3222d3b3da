"""A pooling class's heads, against a hand computation from vLLM's model classes.

Each figure is written out from the tiny config and the class that builds the head (the
file named next to it), not from gatekeeper's functions: the heads are plain ``nn.Linear``
(no quantization config asks about them), whole on every rank, the classifiers in
``ModelConfig.head_dtype`` (float32 for a pooling model, ``config/model.py``
``_get_head_dtype``), the rest in the model dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gatekeeper.estimator.options import ServeOptions
from gatekeeper.estimator.vllm_method import GpuTarget, estimate
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.spec import ModelSpec

GPU = GpuTarget(total_bytes=80 * 2**30, name="80 GiB")
H, LAYERS, VOCAB, LABELS = 64, 2, 1000, 3
BERT: dict[str, Any] = {
    "model_type": "bert",
    "hidden_size": H,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "intermediate_size": 4 * H,
    "vocab_size": VOCAB,
    "max_position_embeddings": 128,
    "torch_dtype": "bfloat16",
    "id2label": {str(i): f"L{i}" for i in range(LABELS)},
}


def weights(spec: ModelSpec, **flags: Any) -> int:
    options = ServeOptions(max_model_len=128, enforce_eager=True, **flags)
    return estimate(spec, options, GPU).worst.weights_bytes


def heads_bytes(config: dict[str, Any], **flags: Any) -> int:
    """What the heads add: the estimate less the same spec without them."""
    spec = spec_from_config(config, name="m")
    assert spec.pooling_heads
    return weights(spec, **flags) - weights(dataclasses.replace(spec, pooling_heads=()), **flags)


def test_bert_sequence_classifier_holds_its_pooler_and_classifier_in_float32():
    # bert.py BertForSequenceClassification: BertPooler's dense (hidden x hidden, bias) and
    # the classifier (num_labels x hidden, bias), both nn.Linear in head_dtype
    config = {**BERT, "architectures": ["BertForSequenceClassification"]}
    assert heads_bytes(config) == (H * H + H + LABELS * H + LABELS) * 4


def test_head_dtype_model_holds_them_in_the_model_dtype():
    # --hf-overrides '{"head_dtype": "model"}' (config/model.py ModelConfig.head_dtype)
    config = {**BERT, "architectures": ["BertForSequenceClassification"], "head_dtype": "model"}
    assert heads_bytes(config) == (H * H + H + LABELS * H + LABELS) * 2


def test_roberta_classifier_is_dense_and_out_proj():
    # roberta.py RobertaClassificationHead: dense (hidden x hidden) and out_proj (labels x
    # hidden), both biased, in head_dtype
    config = {
        **BERT,
        "model_type": "roberta",
        "architectures": ["RobertaForSequenceClassification"],
    }
    assert heads_bytes(config) == (H * H + H + LABELS * H + LABELS) * 4


def test_bert_masked_lm_holds_an_mlm_head_of_its_own_in_the_model_dtype():
    # bert.py BertMLMHead: dense (hidden x hidden, bias), LayerNorm (weight, bias), decoder
    # nn.Linear(hidden, vocab, bias=True): every row, unpadded, in bf16; no LM head
    config = {**BERT, "architectures": ["BertForMaskedLM"]}
    assert heads_bytes(config) == (H * H + H + 2 * H + VOCAB * H + VOCAB) * 2


def test_siglip_text_head_follows_projection_size():
    # siglip.py SiglipTextTransformer: head = nn.Linear(hidden, projection_size), bf16
    text = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": 4}
    text |= {"intermediate_size": 4 * H, "vocab_size": VOCAB, "projection_size": 48}
    config = {"model_type": "siglip", "architectures": ["SiglipModel"], "text_config": text}
    config |= {"torch_dtype": "bfloat16"}
    assert heads_bytes(config) == (48 * H + 48) * 2


def test_jambas_sequence_classifier_keeps_its_lm_head_beside_the_score():
    # jamba.py JambaForSequenceClassification(JambaForCausalLM): the causal LM whole, its
    # lm_head included, and score = nn.Linear(hidden, num_labels, bias=False) in head_dtype
    config: dict[str, Any] = {
        "model_type": "jamba", "architectures": ["JambaForSequenceClassification"]
    }  # fmt: skip
    config |= {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": 4}
    config |= {"num_key_value_heads": 2, "intermediate_size": 4 * H, "vocab_size": VOCAB}
    config |= {"torch_dtype": "bfloat16", "num_experts": 1, "tie_word_embeddings": False}
    config |= {"id2label": {str(i): f"L{i}" for i in range(LABELS)}}
    spec = spec_from_config(config, name="m")
    generating = dataclasses.replace(spec, architecture="JambaForCausalLM", pooling_heads=())
    assert weights(spec) - weights(generating) == LABELS * H * 4
