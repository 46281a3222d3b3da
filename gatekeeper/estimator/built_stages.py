"""The weights an installed vLLM built (``ModelSpec.built``), split into pipeline stages.

vLLM built every layer as one rank of the deployment's TP size (pipeline stage 0 of 1).
Under pipeline parallelism each stage holds its own decoder layers (``get_pp_indices``,
``weights.pp_partition``), the first stage the embedding (and the vision tower), the last
the final norm and the LM head; a tied LM head is its own tensor on the last stage when
it is not the first; and every stage builds its own rotary caches (``get_rope`` caches
one per process). A decoder layer is ``{layers_path}.N.`` as the model class names it
(``module_names``: ``model.layers``, BERT's ``encoder.layer``), which keeps a vision tower's own ``layers.N`` apart.
"""

from __future__ import annotations

from dataclasses import replace

from gatekeeper.estimator.rank_weights import RankWeights
from gatekeeper.models.built_weights import BuiltTensor, BuiltWeights

__all__ = ["built_shares", "built_stages", "tensor_stage"]


def _layer(t: BuiltTensor, prefix: str) -> int | None:
    if not t.name.startswith(prefix):
        return None
    index = t.name[len(prefix) :].split(".", 1)[0]
    return int(index) if index.isdigit() else None


def tensor_stage(c: RankWeights, t: BuiltTensor, stage_of: dict[int, int], last: int) -> int:
    """The pipeline stage that holds tensor ``t``."""
    layer = _layer(t, f"{c.names.layers_path}.")
    if layer is not None:
        return stage_of.get(layer, last)
    if "lm_head" in t.name:
        return last
    inside = not c.names.model or t.name.startswith(f"{c.names.model}.")
    if inside and "norm" in t.name and "embed" not in t.name:
        return last  # the decoder's final norm
    return 0


def built_shares(
    c: RankWeights, built: BuiltWeights, stages: list[range]
) -> list[tuple[int, BuiltTensor]]:
    """Each tensor with the pipeline stage that holds it, in vLLM's registration order,
    then what the other stages hold beside them: their own rotary caches and a tied LM
    head on the last stage when it is not the first (named ``lm_head.weight``)."""
    stage_of = {i: k for k, layers in enumerate(stages) for i in layers}
    last = len(stages) - 1
    out = [(tensor_stage(c, t, stage_of, last), t) for t in built.tensors]
    if last > 0:
        ropes = [(k, t) for k, t in out if t.buffer and "rotary" in t.name]
        holder = ropes[0][0] if ropes else 0
        out += [(k, t) for k in range(len(stages)) if k != holder for _, t in ropes]
        has_head = any("lm_head" in t.name for t in built.tensors)
        if c.spec.tie_word_embeddings and not has_head and c.opts.lm_head:
            embed = next((t for t in built.tensors if "embed_tokens" in t.name), None)
            if embed is not None:
                out.append((last, replace(embed, name="lm_head.weight")))
    return out


def built_stages(
    c: RankWeights, built: BuiltWeights, stages: list[range]
) -> tuple[tuple[int, ...], list[list[int]]]:
    """(bytes per stage, each stage's decoder-layer parameters in vLLM's registration
    order: what ``--cpu-offload-gb`` walks) from what vLLM built."""
    totals = [0] * len(stages)
    parts: list[list[int]] = [[] for _ in stages]
    prefix = f"{c.names.layers_path}."
    for k, t in built_shares(c, built, stages):
        totals[k] += t.num_bytes
        if _layer(t, prefix) is not None and not t.buffer and not t.after_loading:
            parts[k].append(t.num_bytes)
    return tuple(totals), parts
