"""Model facts in, ``ModelSpec`` out: what the estimator needs to know of a model.

Sources, in the order ``resolve_model`` (``source``) tries them, as vLLM resolves a
model: a local checkpoint directory (``config.json`` through ``hf_config``, exact weight
bytes from the safetensors headers through ``safetensors``) or a GGUF file (``gguf``);
the Hugging Face cache, offline (``hf_cache``); only when allowed, the Hugging Face hub
(``hub``: config and safetensors metadata, never weights, written into the cache); the
embedded catalog (``catalog``). ``spec`` holds the data (pure); ``quantization``,
``vision``, ``encoder_decoder`` (Whisper's decoder and audio encoder) and ``layer_kinds``
(each decoder layer's attention kind, MoE, MLA) read those parts of a config. ``docs/models.md`` has the order and the errors.

May import: ``gatekeeper.errors``, ``gatekeeper.units``, and the standard library
(``hub`` and ``hf_cache`` also ``huggingface_hub``, ``gguf`` the ``gguf`` package, lazily).
Nothing of the other wings.
"""

from typing import TYPE_CHECKING

from gatekeeper._lazy import face

if TYPE_CHECKING:
    from gatekeeper.models.catalog import CatalogEntry, catalog_entries, find_in_catalog
    from gatekeeper.models.hf_config import spec_from_config
    from gatekeeper.models.quantization import QuantSpec, quant_from_config, quant_from_flag
    from gatekeeper.models.safetensors import read_checkpoint, read_header
    from gatekeeper.models.source import load_model_dir, resolve_model
    from gatekeeper.models.spec import (
        DTYPE_BYTES,
        AttentionKind,
        CheckpointTensor,
        CheckpointWeights,
        MlaSpec,
        ModelSpec,
        MoeSpec,
        VisionSpec,
    )

__all__ = [
    "DTYPE_BYTES",
    "AttentionKind",
    "CatalogEntry",
    "CheckpointTensor",
    "CheckpointWeights",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "QuantSpec",
    "VisionSpec",
    "catalog_entries",
    "find_in_catalog",
    "load_model_dir",
    "quant_from_config",
    "quant_from_flag",
    "read_checkpoint",
    "read_header",
    "resolve_model",
    "spec_from_config",
]

__getattr__, __dir__ = face(globals())
