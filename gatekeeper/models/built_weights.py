"""What an installed vLLM allocates for a model, as it built the model on the meta device.

``gatekeeper estimate --weights-from vllm`` asks the vLLM environment the sidecar
launches (``gatekeeper.vllm.meta_weights`` runs ``gatekeeper/vllm/meta_build.py`` under
its Python): vLLM's own model class, quantization config and ``create_weights`` for
every module, at the deployment's TP size, with nothing allocated. The result is pure
data: each tensor one rank holds, under vLLM's names, in the order vLLM registered them
(which is the order its CPU offloader walks), and what ``process_weights_after_loading``
adds or frees beside them. The estimator splits it into pipeline stages
(``estimator.weights``); it is exact for the release that built it, including families
newer than gatekeeper's own tables.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BuiltTensor", "BuiltWeights"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class BuiltTensor:
    """One parameter or buffer of one rank, as vLLM built it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    num_bytes: int
    buffer: bool = False
    """A buffer (a rotary cache), not a parameter: vLLM's CPU offloader moves parameters only."""
    after_loading: bool = False
    """Not a tensor ``create_weights`` made but what ``process_weights_after_loading``
    adds (MLA's dequantized ``W_UK_T``/``W_UV`` of a quantized ``kv_b_proj``: positive
    bytes) or frees (Quark int8 zero points, unused AutoGPTQ MoE biases: negative bytes),
    named after the module it belongs to."""


@dataclass(frozen=True, slots=True)
class BuiltWeights:
    """One TP rank's weights as a vLLM release built the model (pipeline stage 0 of 1:
    every layer; ``estimator.weights`` assigns them to stages)."""

    vllm_version: str
    tensor_parallel_size: int
    dtype: str
    """The model dtype vLLM resolved (``bfloat16`` ...)."""
    quantization: str | None
    """The quantization method vLLM resolved, None when unquantized."""
    architecture: str
    tensors: tuple[BuiltTensor, ...]
    seconds: float = 0.0
    """How long the look-up took, vLLM's import included (0 when read from the cache)."""
    cached: bool = False

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES.get(self.dtype, 0)

    @property
    def total_bytes(self) -> int:
        return sum(t.num_bytes for t in self.tensors)

    @property
    def source(self) -> str:
        how = "from the cache" if self.cached else f"built in {self.seconds:.1f} s"
        return (
            f"vLLM {self.vllm_version}'s own construction on the meta device "
            f"(TP {self.tensor_parallel_size}, {how})"
        )
