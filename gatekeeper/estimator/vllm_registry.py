"""vLLM's model registry as its runner detection reads it (vLLM 0.32,
``vllm/model_executor/models/registry.py``).

``ModelConfig._get_default_runner_type`` asks the registry first and falls back to the
architecture's suffix (``_SUFFIX_TO_DEFAULTS``); the two disagree only for the names
below, which ``runner`` consults before the suffix:

- ``POOLING_ARCHITECTURES``: registered as pooling models only (the embedding, late
  interaction, reward, token and sequence classification tables, less the names the
  text-generation tables also hold, whose class generates);
- ``GENERATIVE_OTHER_SUFFIX``: registered as generative models under a name whose suffix
  says pooling or nothing (``ChatGLMModel``, the ``*MTPModel`` drafts, ``MiniCPMV``), and
  the pooling tables' names whose class generates (``LlamaModel``, ``MistralModel``,
  ``Qwen2Model``, ``Gemma2Model``, ``DeepseekV3BidirectionalModel``: the registry asks the
  class, ``LlamaForCausalLM``, which is no pooling model, so without a sentence-transformers
  Pooling module vLLM 0.32 serves them as generative models, LM head included).

``tests/models/test_auto_detection.py`` checks both against vLLM's registry.
"""

from __future__ import annotations

__all__ = ["GENERATIVE_OTHER_SUFFIX", "POOLING_ARCHITECTURES"]

POOLING_ARCHITECTURES = frozenset(
    {
        "BertForMaskedLM", "BertForSequenceClassification",
        "BertForTokenClassification", "BertModel", "BertSpladeSparseEmbeddingModel",
        "BgeM3EmbeddingModel", "CLIPModel", "ClefOmniForJointSchema",
        "ColBERTJinaRobertaModel", "ColBERTLfm2Model", "ColBERTModernBertModel",
        "ColModernVBertForRetrieval", "ColPaliForRetrieval", "ColQwen3", "ColQwen3_5",
        "EmbeddingGemma2Model", "GPT2ForSequenceClassification", "Gemma3TextModel",
        "GteModel", "GteNewForSequenceClassification", "GteNewModel", "HF_ColBERT",
        "InternLM2ForRewardModel", "JambaForSequenceClassification",
        "JinaEmbeddingsV5Model", "JinaForRanking", "JinaVLForRanking",
        "LlamaBidirectionalForSequenceClassification", "LlamaBidirectionalModel",
        "LlamaNemotronVLForSequenceClassification", "LlamaNemotronVLModel",
        "ModernBertForSequenceClassification", "ModernBertForTokenClassification",
        "ModernBertModel", "NomicBertModel",
        "OpenAIPrivacyFilterForTokenClassification", "OpsColQwen3Model",
        "Qwen2ForProcessRewardModel", "Qwen2ForRewardModel",
        "Qwen3ASRForcedAlignerForTokenClassification", "Qwen3VLNemotronEmbedModel",
        "RobertaForMaskedLM", "RobertaForSequenceClassification",
        "RobertaForTokenClassification", "RobertaModel", "SiglipModel", "Terratorch",
        "VoyageQwen3BidirectionalEmbedModel", "XLMRobertaForSequenceClassification",
        "XLMRobertaForTokenClassification", "XLMRobertaModel"
    }
)  # fmt: skip
GENERATIVE_OTHER_SUFFIX = frozenset(
    {
        "BailingMoeV25MTPModel", "BailingMoeV3MTPModel", "ChatGLMModel",
        "DFlash2DraftModel", "DFlashDraftModel", "DFlashMuseGlimmerAssistantModel",
        "DSparkDraftModel", "DSparkV41DraftModel", "DeepSeekMTPModel",
        "DeepSeekV4MTPModel", "DeepseekV32MTPModel", "DeepseekV3BidirectionalModel",
        "DiffusionGemmaForBlockDiffusion", "Dots3NoteMTPModel", "EagleDeepSeekMTPModel",
        "ErnieMTPModel", "Exaone4_5_MTP", "ExaoneMoeMTP", "ExtractHiddenStatesModel",
        "Gemma2Model", "Gemma4DSparkModel", "Gemma4MTPModel", "Glm4MoeLiteMTPModel",
        "Glm4MoeMTPModel", "Glm5NextMTPModel", "GlmOcrMTPModel", "HYV3MTPModel",
        "HYV4MTPModel", "HfMoondream", "InklingMTPModel", "InternS2MobiusMTP",
        "K3DSparkModel", "KimiK3MTPModel", "LiLiCorrDraftModel",
        "LlamaForCausalLMEagle3", "LlamaModel", "Llama_Nemotron_Nano_VL",
        "LongCatFlashMTPModel", "MedusaModel", "MiDashengLMModel", "MiMoMTPModel",
        "MiMoV2MTPModel", "MiMoV2OmniMTPModel", "MiniCPMO", "MiniCPMV", "MiniMaxM3MTP",
        "MistralModel", "MossAudioModel", "MuseGlimmerAssistantModel", "NVLM_D",
        "NemotronHMTPModel", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2",
        "NemotronH_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3",
        "OpenPanguMTPModel", "OpenVLAForActionPrediction", "Ovis", "Ovis2_5",
        "PEagleDraftModel", "Phi4ForCausalLMV", "Qwen2Model", "Qwen2_5OmniModel",
        "Qwen3ASRRealtimeGeneration", "Qwen3DSparkModel", "Qwen3NextMTP",
        "Qwen3OmniDSparkModel", "Qwen3_5MTP", "Qwen3_5MoeMTP", "Qwen4ExpMTP",
        "Step3p5MTP", "UltravoxModel", "VoxtralRealtimeGeneration"
    }
)  # fmt: skip
