"""One TP rank's weight bytes by module group and storage format: what is quantized.

Groups (``GROUPS``): ``attention`` (MLA included), ``mlp`` (dense MLPs and shared
experts), ``experts`` (routed experts and their router), ``mixer`` (Mamba, GatedDeltaNet
and other state mixers), ``embedding``, ``lm_head``, ``vision`` (tower and projector),
``drafter`` (an EAGLE/MTP/draft model's weights), ``lora`` (LoRA slots), ``other``
(norms, the rotary cache). A format is the model dtype (``bfloat16``) or the method of
the scheme that holds the module (``QuantSpec.method``: ``modelopt:nvfp4``, ``fp8``,
``awq``, ``compressed-tensors:w4a16`` ...), or ``float32`` for a buffer vLLM keeps so.

The groups add up exactly to ``weight_plan``'s bytes per stage: each decoder layer's
parts come from ``rank_weights.layer_parts`` (each sized by the estimate's own function,
every linear's scheme recorded as it is asked), the rest from ``weights.stage_parts``;
with a checkpoint, each tensor is classified by its name (``module_group``; so are the
tensors an installed vLLM built, ``--weights-from vllm``, by vLLM's names), or, when
only the index's ``total_size`` is known, the architecture's split is scaled to it as
``weight_plan`` scales it. ``--cpu-offload-gb`` takes the offloaded bytes out of the
decoder layers' groups in proportion (the offloader moves whole layers, first first).

Worked example: Qwen3-30B-A3B with ModelOpt NVFP4 ignoring ``lm_head``,
``model.layers.*.self_attn*`` and the routers, bf16, TP 1: attention 1,811,963,904 B
bfloat16 (48 layers of qkv 2048 -> 5120 and o 4096 -> 2048 in bf16, q/k norms); experts
16,307,601,408 B ``modelopt:nvfp4`` (48 x 128 experts of 3 x 2048 x 768 at 4.5 bits and
their fp32 scales) + 25,165,824 B bfloat16 (the routers, 48 x 2048 x 128 x 2 B);
embedding and lm_head 622,329,856 B bfloat16 each; other 10,883,072 B (norms, the
rotary cache): 19,400,273,920 B, the estimate's weights. Attention stayed bf16.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from gatekeeper.errors import ModelSpecError
from gatekeeper.estimator.built_stages import built_shares
from gatekeeper.estimator.rank_weights import (
    RankWeights,
    WeightOptions,
    layer_parts,
    moe_prefix,
)
from gatekeeper.estimator.weights import WeightPlan, pp_partition, stage_parts, tensor_shares
from gatekeeper.models.built_weights import BuiltWeights
from gatekeeper.models.quantization import QuantSpec
from gatekeeper.models.spec import DTYPE_BYTES, ModelSpec

__all__ = ["GROUPS", "WeightGroups", "module_group", "weight_groups"]

GROUPS = (
    "attention",
    "mlp",
    "experts",
    "mixer",
    "embedding",
    "lm_head",
    "vision",
    "drafter",
    "lora",
    "other",
)


class WeightGroups:
    """Bytes by (module group, format), in ``GROUPS`` order, no zero entries.

    Computed when first read (``later``): the breakdown costs as much as the rest of an
    estimate on a large MoE, and placement's searches make many estimates whose groups
    nobody reads; ``plus`` and ``scaled_to`` stay lazy too."""

    __slots__ = ("_entries", "_make")

    def __init__(
        self,
        entries: tuple[tuple[str, str, int], ...] = (),
        *,
        make: Callable[[], tuple[tuple[str, str, int], ...]] | None = None,
    ) -> None:
        self._entries = None if make is not None else tuple(entries)
        self._make = make

    @classmethod
    def later(cls, make: Callable[[], WeightGroups]) -> WeightGroups:
        """The groups ``make`` returns, made on the first read."""
        return cls(make=lambda: make().entries)

    @property
    def entries(self) -> tuple[tuple[str, str, int], ...]:
        entries = self._entries
        if entries is not None:
            return entries
        make = self._make
        if make is None:  # another thread made them between the two reads
            assert self._entries is not None
            return self._entries
        entries = make()  # two threads may both make them: the same tuple either way
        self._entries = entries
        self._make = None  # after _entries: a reader seeing None here finds them made
        return entries

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WeightGroups) and self.entries == other.entries

    def __hash__(self) -> int:
        return hash(self.entries)

    def __repr__(self) -> str:
        return f"WeightGroups(entries={self.entries!r})"

    @classmethod
    def of(cls, counts: Mapping[tuple[str, str], int]) -> WeightGroups:
        rows = [(g, f, b) for (g, f), b in counts.items() if b]
        return cls(tuple(sorted(rows, key=lambda r: (GROUPS.index(r[0]), -r[2], r[1]))))

    @property
    def total_bytes(self) -> int:
        return sum(b for _, _, b in self.entries)

    def plus(self, group: str, fmt: str, num_bytes: int) -> WeightGroups:
        def make() -> WeightGroups:
            counts = Counter({(g, f): b for g, f, b in self.entries})
            counts[(group, fmt)] += num_bytes
            return WeightGroups.of(counts)

        return WeightGroups.later(make)

    def scaled_to(self, total_bytes: int) -> WeightGroups:
        """The same split scaled to ``total_bytes`` (a calibrated weights figure)."""

        def make() -> WeightGroups:
            counts = {(g, f): b for g, f, b in self.entries}
            return WeightGroups.of(_scaled(counts, total_bytes)) if counts else self

        return WeightGroups.later(make)

    def by_group(self) -> dict[str, dict[str, int]]:
        """``{group: {format: bytes}}``, as ``estimate --json`` prints it."""
        out: dict[str, dict[str, int]] = {}
        for group, fmt, num_bytes in self.entries:
            out.setdefault(group, {})[fmt] = num_bytes
        return out


@dataclass(frozen=True, slots=True)
class _Recorder(RankWeights):
    """A ``RankWeights`` that notes every linear (name, format, bytes) and every vector
    (no name, the model dtype) the sizing functions ask it for."""

    log: list[tuple[str | None, str, int]] = field(default_factory=list)

    def fused(
        self, name: str, in_f: int, outs: tuple[int, ...], *, quantizable: bool = True
    ) -> int:
        # RankWeights.fused, asking scheme_for once (it is most of the cost)
        scheme = self.quant.scheme_for(name) if self.quant is not None and quantizable else None
        if scheme is None:
            size = in_f * sum(outs) * self.dtype_bytes
        else:
            size = scheme.module_bytes(in_f, outs, self.dtype_bytes)
        self.log.append((name, scheme.method if scheme else "", size))
        return size

    def vec(self, numel: int) -> int:
        size = RankWeights.vec(self, numel)
        self.log.append((None, "", size))
        return size


ARCHITECTURE = "architecture (config.json)"
"""``WeightPlan.source`` when the bytes come from the config alone."""
_K = TypeVar("_K")
_Key = tuple[str, str, bool]
"""(group, format, inside a decoder layer); format ``""`` is the model dtype."""


def _layer(c: _Recorder, i: int, out: Counter[_Key]) -> None:
    """Layer ``i`` by group and format: what each part's linears and vectors were, the
    rest of the part (routed experts, MLA's copies, a mixer sized whole) in the experts'
    scheme for the experts, else the model dtype."""
    moe = moe_prefix(c, i)
    shared = f"{moe}.{c.names.shared_experts}"
    for group, size in layer_parts(c, i):
        c.log.clear()
        rest = size(c, i)
        for name, fmt, num_bytes in c.log:
            in_shared = name is not None and name.startswith(shared)
            out[("mlp" if in_shared else group, fmt, True)] += num_bytes
            rest -= num_bytes
        if rest and group == "experts" and c.quant is not None:
            experts = c.quant.scheme_for(f"{moe}.experts", experts=True)
            out[(group, experts.method if experts is not None else "", True)] += rest
        elif rest:
            out[(group, "", True)] += rest


def _architecture(c: _Recorder, stages: list[range]) -> list[Counter[_Key]]:
    out = []
    for k, layers in enumerate(stages):
        counts: Counter[_Key] = Counter()
        for i in layers:
            _layer(c, i, counts)
        for group, fmt, num_bytes in stage_parts(c, first=k == 0, last=k == len(stages) - 1):
            counts[(group, fmt, False)] += num_bytes
        out.append(counts)
    return out


_LAYER = re.compile(r"(?:layers|h|blocks)\.\d+\.")
_OUTSIDE_LAYERS = (
    (re.compile(r"rotary_emb"), "other"),  # a rotary cache, wherever the class registers it
    (
        re.compile(r"visual\.|vision_tower|vision_model|multi_modal_projector|mm_projector"),
        "vision",
    ),
    # Whisper's audio encoder (BERT's model.encoder.layer.N is a decoder's layers)
    (re.compile(r"^model\.encoder\.(conv[12]|embed_positions|layer_norm|layers)\."), "vision"),
    (re.compile(r"lm_head"), "lm_head"),
    (
        re.compile(r"embed_tokens|\.embedding\.|word_embeddings|wte\.|wpe\.|embed_positions"),
        "embedding",
    ),
)
_IN_LAYERS = (
    (re.compile(r"shared_expert"), "mlp"),
    (
        re.compile(r"\.experts\.|\.router\.|(mlp|moe|feed_forward)\.gate\."),
        "experts",
    ),
    # an attention module with its own norms (q/k norms, MLA's q_a/kv_a norms)
    (
        re.compile(r"\.(self_attn|attn|attention|self_attention|cross_attn|encoder_attn)\."),
        "attention",
    ),
    (
        re.compile(
            r"linear_attn|mamba|\.ssm|conv1d|\.conv\.|A_log|\.D$|dt_bias|dt_proj|x_proj|in_proj"
            r"|short_conv"
        ),
        "mixer",
    ),
    (re.compile(r"norm"), "other"),
    (re.compile(r"[qkv]_proj|qkv|kv_[ab]_|q_[ab]_|\.o_proj|sinks"), "attention"),  # Nemotron-H
    (re.compile(r"mlp|feed_forward|ffn|_proj|fc1|fc2"), "mlp"),
)


def module_group(name: str) -> str:
    """The group of a checkpoint tensor (or a vLLM parameter) by its name: the first
    pattern that matches, outside the decoder layers then inside them."""
    for pattern, group in _OUTSIDE_LAYERS:
        if pattern.search(name):
            return group
    if not _LAYER.search(name):
        return "other"
    return next((group for pattern, group in _IN_LAYERS if pattern.search(name)), "other")


def _stored(c: RankWeights, name: str) -> str:
    """The scheme a checkpoint tensor stored as-is (packed weights, scales) belongs to."""
    q = c.quant
    if q is None:
        return "checkpoint"
    scheme = q.scheme_for(c.names.to_vllm(name.rsplit(".", 1)[0]))
    return (scheme or q).method


def _checkpoint(c: RankWeights, stages: list[range]) -> list[Counter[_Key]]:
    assert c.spec.checkpoint is not None
    out: list[Counter[_Key]] = [Counter() for _ in stages]
    for share in tensor_shares(c, c.spec.checkpoint, stages):
        fmt = _stored(c, share.name) if share.form == "stored" else share.form
        key = (module_group(share.name), fmt, share.layer is not None)
        out[share.stage][key] += share.rank_bytes
    return out


def _built(c: RankWeights, built: BuiltWeights, stages: list[range]) -> list[Counter[_Key]]:
    """What an installed vLLM built (``--weights-from vllm``), by vLLM's names: a module
    holding a tensor in no float dtype (packed weights, fp8) is quantized, all its tensors
    in its scheme's method; the others in their own dtype."""
    quantized = {t.name.rsplit(".", 1)[0] for t in built.tensors if t.dtype not in DTYPE_BYTES}
    prefix = f"{c.names.model}.layers."
    out: list[Counter[_Key]] = [Counter() for _ in stages]
    for k, t in built_shares(c, built, stages):
        module = t.name.rsplit(".", 1)[0]
        fmt = _built_scheme(c, built, module) if module in quantized else t.dtype
        in_layer = t.name.startswith(prefix) and not t.buffer and not t.after_loading
        out[k][(module_group(t.name), fmt, in_layer)] += t.num_bytes
    return out


def _built_scheme(c: RankWeights, built: BuiltWeights, module: str) -> str:
    try:
        scheme = (
            c.quant.scheme_for(module, experts=module.endswith(".experts")) if c.quant else None
        )
    except ModelSpecError:
        scheme = None
    return scheme.method if scheme is not None else built.quantization or "quantized"


def _scaled(counts: Mapping[_K, int], target: int) -> Counter[_K]:
    """``counts`` scaled to add up to ``target`` exactly (largest remainders)."""
    total = sum(counts.values())
    if not total:
        return Counter()
    exact = {k: v * target / total for k, v in counts.items()}
    out: Counter[_K] = Counter({k: int(v) for k, v in exact.items()})
    short = target - sum(out.values())
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:short]:
        out[k] += 1
    return out


def _offloaded(counts: Counter[_Key], moved: int) -> Counter[_Key]:
    """The decoder layers' groups less ``moved`` bytes, in proportion."""
    taken = _scaled({k: v for k, v in counts.items() if k[2]}, moved)
    counts = Counter(counts)
    counts.subtract(taken)
    return counts


def weight_groups(
    spec: ModelSpec,
    plan: WeightPlan,
    dtype: str,
    *,
    tp: int,
    quant: QuantSpec | None,
    opts: WeightOptions | None = None,
) -> tuple[WeightGroups, ...]:
    """Each pipeline stage's rank's weights (``plan``, from ``weight_plan`` with the same
    arguments, in the model dtype ``dtype``) by module group and format."""
    c = _Recorder.of(spec, tp, DTYPE_BYTES[dtype], quant, opts)
    assert isinstance(c, _Recorder)
    stages = pp_partition(spec.num_layers, len(plan.stage_bytes))
    ckpt = spec.checkpoint
    offloaded = plan.offloaded_bytes or (0,) * len(stages)
    if spec.built is not None and plan.source == spec.built.source:
        counts = _built(c, spec.built, stages)
    elif ckpt is not None and ckpt.tensors and plan.source == ckpt.source:
        counts = _checkpoint(c, stages)
    elif plan.source == ARCHITECTURE:
        counts = _architecture(c, stages)
    else:  # the index's total_size only (or another source of the totals): the
        # architecture's split scaled to each stage's total, as weight_plan scales it
        counts = [
            _scaled(arch, kept + off)
            for arch, kept, off in zip(
                _architecture(c, stages), plan.stage_bytes, offloaded, strict=True
            )
        ]
    return tuple(
        _named(_offloaded(stage, off), dtype) for stage, off in zip(counts, offloaded, strict=True)
    )


def _named(counts: Counter[_Key], dtype: str) -> WeightGroups:
    merged: Counter[tuple[str, str]] = Counter()
    for (group, fmt, _), num_bytes in counts.items():
        merged[(group, fmt or dtype)] += num_bytes
    return WeightGroups.of(merged)
