"""A pooling class's heads read from the names table and sized from the config."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.errors import ModelSpecError
from gatekeeper.models.hf_config import spec_from_config
from gatekeeper.models.pooling_heads import pooling_heads, pooling_lm_head
from gatekeeper.models.spec import HeadTensor


def test_bert_classifier_heads_follow_hidden_size_and_the_labels():
    config = {"hidden_size": 8, "id2label": {"0": "a", "1": "b", "2": "c"}}
    heads, notes = pooling_heads(config, "BertForSequenceClassification")
    assert set(heads) == {
        HeadTensor("bert.pooler.dense.weight", 64, "head"),
        HeadTensor("bert.pooler.dense.bias", 8, "head"),
        HeadTensor("classifier.weight", 24, "head"),
        HeadTensor("classifier.bias", 3, "head"),
    }
    assert notes == ()


def test_no_labels_named_is_transformers_two():
    heads, _ = pooling_heads({"hidden_size": 8}, "BertForSequenceClassification")
    assert HeadTensor("classifier.weight", 16, "head") in heads


def test_a_class_that_is_no_pooling_one_has_no_heads():
    # LlamaForCausalLM and the classifier vLLM converts it into (Qwen3's, by suffix)
    assert pooling_heads({"hidden_size": 8}, "LlamaForCausalLM") == ((), ())
    assert pooling_heads({"hidden_size": 8}, "Qwen3ForSequenceClassification") == ((), ())
    assert pooling_heads({"hidden_size": 8}, "BertModel") == ((), ())


def test_only_a_pooling_class_that_builds_one_keeps_its_lm_head():
    assert pooling_lm_head("JambaForSequenceClassification")
    for arch in ("BertForSequenceClassification", "LlamaForCausalLM", "Qwen3ForSequenceClassification"):  # fmt: skip
        assert not pooling_lm_head(arch)


def test_a_field_the_config_lacks_leaves_the_head_out_and_says_so():
    heads, notes = pooling_heads({"text_config": {"hidden_size": 8}}, "SiglipModel")
    assert heads == ()
    assert "text_config.projection_size" in notes[0]


def test_a_head_dimension_that_is_no_number_is_refused():
    with pytest.raises(ModelSpecError, match="hidden_size"):
        pooling_heads({"hidden_size": "8"}, "BertForSequenceClassification")


def test_head_dtype_is_read_as_vllm_reads_it():
    config: dict[str, Any] = {
        "model_type": "bert", "architectures": ["BertForSequenceClassification"]
    }  # fmt: skip
    config |= {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}
    config |= {"intermediate_size": 16, "vocab_size": 10}
    assert spec_from_config(config, name="m").head_dtype == ""
    assert spec_from_config({**config, "head_dtype": "Float"}, name="m").head_dtype == "float32"
    assert spec_from_config({**config, "head_dtype": "model"}, name="m").head_dtype == "model"
    with pytest.raises(ModelSpecError, match="head_dtype"):
        spec_from_config({**config, "head_dtype": "int8"}, name="m")
