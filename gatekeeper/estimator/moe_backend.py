"""The MoE kernel backend vLLM runs MXFP4 experts with on a GPU, and what the experts
then hold.

Pure. vLLM 0.32 picks the backend when it builds the experts' quantize method, before
``create_weights``, and the backend decides the experts' shapes: ``create_weights``
allocates ``maybe_roundup_sizes(hidden, intermediate_per_rank)``, which is
``mxfp4_round_up_hidden_size_and_intermediate_size`` (``fused_moe/oracle/mxfp4.py``):
Marlin and FlashInfer TRT-LLM round the hidden width up to a multiple of 256 and the
intermediate per rank to 128; Triton and Humming leave the hidden width and round the
intermediate to 64. Per expert that is w13 (gate and up: ``2I x H/2`` bytes of packed
FP4 and ``2I x H/32`` e8m0 scales), w2 (``H x I/2`` and ``H x I/32``) and, for gpt-oss,
the biases (``2I + H`` in the model dtype).

The choice (``select_mxfp4_moe_backend`` for gpt-oss checkpoints, whose config vLLM reads
as ``GptOssMxfp4Config``; ``select_deepseek_v4_mxfp4_moe_backend`` for every other MXFP4
MoE), with the packages vLLM's CUDA wheel installs (``triton_kernels``, FlashInfer,
``humming-kernels``; not DeepGEMM) and ``--moe-backend auto`` (the flag, or
``quantization_config.moe``, picks another):

- gpt-oss: datacenter Blackwell (10.x) FlashInfer TRT-LLM with bf16 activations; Hopper
  and the rest of 9.0 <= cc < 13.0 but consumer Blackwell the OpenAI Triton kernels;
  consumer Blackwell (12.x, where vLLM ranks Triton after Marlin) and below Hopper Marlin;
- other MXFP4 MoEs: 10.x FlashInfer TRT-LLM with MXFP8 activations; 9.0 Humming (vLLM
  ranks it before Marlin there, ``humming/priority.py``); the rest Marlin.

On Hopper the Triton backend then re-lays the experts out for its kernel
(``process_weights_after_loading``: ``_swizzle_mxfp4``, triton_kernels'
``HopperMXValueLayout`` and ``HopperMXScaleLayout``), and what the GPU holds is that
layout, not ``create_weights``' tensors (which it frees): the packed values of a
``rows x in`` projection padded to ``round_up(in/2, 64) x round_up(rows, 256)`` bytes,
its scales (the groups first padded to a multiple of 4, vLLM's #47303) to
``round_up(rows, 256) x round_up(in/32, 4)``, and the biases in float32.

gpt-oss-120b (hidden and intermediate 2880) therefore holds 64.3 GiB on an H100 at TP 1
(``create_weights`` alone: 60.8 GiB; measured by vLLM on an H100: 64.38 GiB,
../shared/calibration vllm-obs-019), 65.9 GiB on an A100, L40S, RTX 5090 (Marlin) or B200
(TRT-LLM). An unknown GPU (``--gpu-memory`` alone) is sized with Marlin's padding, the
largest of ``create_weights``', and says so. tests/estimator/test_quant_conformance.py
checks every generation against vLLM's own chooser and construction
(tests/support/vllm_target_gpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import ModelSpec
from gatekeeper.units import round_up

__all__ = [
    "PLAIN_MXFP4",
    "ExpertsBackend",
    "experts_backend_label",
    "mxfp4_experts_backend",
    "wna16_experts",
]

MXFP4_GROUP = 32
"""Elements per e8m0 scale (OCP MX block)."""


@dataclass(frozen=True, slots=True)
class ExpertsBackend:
    name: str
    """vLLM's ``Mxfp4MoeBackend`` value."""
    hidden_multiple: int
    intermediate_multiple: int
    why: str
    """On what ground it was chosen (the GPU, or that none was known)."""
    hopper_layout: bool = False
    """The experts end in triton_kernels' Hopper layout (Triton on 9.x)."""

    def padded(self, hidden: int, intermediate_per_rank: int) -> tuple[int, int]:
        """The experts' (hidden, intermediate per rank) as ``create_weights`` makes them."""
        return (
            round_up(hidden, self.hidden_multiple),
            round_up(intermediate_per_rank, self.intermediate_multiple),
        )

    def expert_bytes(
        self, hidden: int, intermediate_per_rank: int, *, shards: int, bias_bytes: int
    ) -> int:
        """One expert's bytes on a rank once loaded: w13 (``shards`` of the intermediate)
        and w2, packed values and scales, and the biases (``bias_bytes`` per element;
        0: none)."""
        h, i = self.padded(hidden, intermediate_per_rank)
        rows = shards * i
        if self.hopper_layout:
            return (
                _hopper(rows, h)
                + _hopper(h, i)
                + (rows + h) * (4 if bias_bytes else 0)  # float32 biases
            )
        scales = rows * (h // MXFP4_GROUP) + h * (i // MXFP4_GROUP)
        return rows * h // 2 + h * i // 2 + scales + (rows + h) * bias_bytes

    @property
    def label(self) -> str:
        return f"{self.name} ({self.why})"


def _hopper(rows: int, in_features: int) -> int:
    """A ``rows x in`` MXFP4 projection in triton_kernels' Hopper layout: values and
    scales (the module docstring)."""
    values = round_up(in_features // 2, 64) * round_up(rows, 256)
    scales = round_up(rows, 256) * round_up(in_features // MXFP4_GROUP, 4)
    return values + scales


PLAIN_MXFP4 = ExpertsBackend("checkpoint", 1, 1, "as stored, unpadded")
"""The experts as a checkpoint stores them (what a padding is in proportion to)."""
_MARLIN = ("MARLIN", 256, 128)
_TRITON = ("TRITON", 1, 64)
_HUMMING = ("HUMMING", 1, 64)
_TRTLLM_BF16 = ("FLASHINFER_TRTLLM_MXFP4_BF16", 256, 128)
_TRTLLM_MXFP8 = ("FLASHINFER_TRTLLM_MXFP4_MXFP8", 256, 128)


def _choice(capability: tuple[int, int], gpt_oss: bool) -> tuple[str, int, int]:
    major = capability[0]
    if major == 10:
        return _TRTLLM_BF16 if gpt_oss else _TRTLLM_MXFP8
    if not gpt_oss:
        return _HUMMING if capability == (9, 0) else _MARLIN
    if (9, 0) <= capability < (13, 0) and major != 12:
        return _TRITON
    return _MARLIN


def mxfp4_experts_backend(capability: tuple[int, int] | None, *, gpt_oss: bool) -> ExpertsBackend:
    """The backend vLLM 0.32 runs MXFP4 experts with on a GPU of ``capability`` (None:
    unknown, sized with Marlin's padding, the largest of ``create_weights``')."""
    if capability is None:
        return ExpertsBackend(*_MARLIN, "GPU generation unknown: the largest padding")
    choice = _choice(capability, gpt_oss)
    why = f"vLLM's choice on compute capability {capability[0]}.{capability[1]}"
    hopper = choice == _TRITON and capability[0] == 9
    if hopper:
        why += ", in triton_kernels' Hopper layout"
    return ExpertsBackend(*choice, why, hopper_layout=hopper)


MARLIN_MOE_GROUPS = (0, 32, 64, 128)
"""Group sizes vLLM's Marlin MoE kernel runs (``check_moe_marlin_supports_config``: -1,
32, 64, 128; gatekeeper writes -1, one scale per output channel, as 0)."""


def wna16_experts(q: QuantSpec, hidden: int, intermediate_per_rank: int) -> QuantSpec:
    """The scheme a rank's GPTQ, AWQ or MoE-WNA16 experts are held in (others: ``q``).

    vLLM runs GPTQ and AWQ experts with Marlin (``AutoGPTQMoEMethod``,
    ``AutoAWQMoEMethod``: the scheme's own layout) where
    ``check_moe_marlin_supports_layer(..., allow_tile_padding=True)`` says it can: the
    hidden width a multiple of 128, the group one of -1/32/64/128 dividing the
    intermediate per rank. Elsewhere ``get_quant_method`` (auto_gptq.py, auto_awq.py)
    falls back to ``MoeWNA16Config.from_config(full_config)``, as ``--quantization
    moe_wna16`` does: ``MoeWNA16Method`` (moe_wna16.py), uint8-packed weights, model-dtype
    scales, zeros only where GPTQ is asymmetric or AWQ has zero points, no biases, and
    the group halved until it divides the hidden width and the intermediate per rank
    (gpt-oss' 2880 wide experts: GPTQ's 128 becomes 64)."""
    base = q.method
    if base in ("gptq", "awq"):
        group = q.group_size
        marlin = group in MARLIN_MOE_GROUPS and (group <= 0 or intermediate_per_rank % group == 0)
        if hidden % 128 == 0 and marlin:
            return q
        zero = q.zero_bits if base == "awq" else (0 if q.symmetric else q.weight_bits)
        q = replace(q, method="moe_wna16", zero_bits=zero, act_order=False)
    if q.method != "moe_wna16":
        return q
    group = q.group_size
    while group > 0 and (intermediate_per_rank % group or hidden % group):
        group //= 2
    return replace(q, group_size=group)


def experts_backend_label(
    spec: ModelSpec, quant: QuantSpec | None, capability: tuple[int, int] | None
) -> str:
    """What ``Estimate.experts_backend`` says: the MXFP4 experts' backend and why, or ""
    where no backend pads the experts (no MoE, not MXFP4)."""
    if spec.moe is None or quant is None or quant.method != "mxfp4":
        return ""
    return mxfp4_experts_backend(capability, gpt_oss=spec.model_type == "gpt_oss").label
