"""vLLM's names for a model class's modules, as its quantization config sees them.

vLLM asks a quantization config about each module by the name its own model class gives
it (``get_quant_method(layer, prefix)``), not by the checkpoint's name, and before that
it rewrites the config's lists the way the class maps checkpoint names
(``configure_quant_config`` in ``model_executor/model_loader/utils.py``: the class's
``hf_to_vllm_mapper.get_rename_mapper()`` applied by each config's
``apply_vllm_mapper``, and its ``packed_modules_mapping`` handed over so that a fused
module is matched through its checkpoint shards). So:

- a decoder layer is ``model.layers.N`` in a text model and ``language_model.model.layers.N``
  in the multimodal wrappers (Qwen2.5-VL, Gemma 3, Mistral 3, Llava, Llama 4, Qwen3.5),
  whose mappers turn the checkpoint's ``model.language_model.`` into
  ``language_model.model.``;
- attention's q/k/v are one ``qkv_proj`` and a dense MLP's gate/up one ``gate_up_proj``
  (``packed_modules_mapping``); DeepSeek's ``q_a_proj`` + ``kv_a_proj_with_mqa`` are one
  ``fused_qkv_a_proj`` when ``q_lora_rank`` is set;
- routed experts are one module, ``...mlp.experts`` (Mixtral ``block_sparse_moe.experts``,
  Llama 4 ``feed_forward.experts``), whose checkpoint projections are ``gate_proj``/
  ``up_proj``/``down_proj`` (Mixtral ``w1``/``w3``/``w2``).

Where the names come from: ``gatekeeper/data/vllm_models/<release>.json``, written from
vLLM's own code by ``scripts/vllm-model-table.py`` for every architecture vLLM's registry
holds (docs/upgrading-vllm.md says when to regenerate it; tests/vllm/test_model_table.py
regenerates part of it and compares). Each row holds the class's ``hf_to_vllm_mapper`` and
``packed_modules_mapping`` as the class defines them and, where vLLM could build the class
on the meta device (``names_from: build``), the names read off the built model: the
rename mappers vLLM applied to a quantization config and the packed mapping it ended
with, the decoder's prefix, each layer's attention, mixer, MLP and experts, and which
linears asked the config (an online-FP8 build), the names it asked with where they are
not the modules' paths (Gemma 3's bare model's ``.layers.N``, EXAONE MoE's lm_head ``""``),
the linears of attention and a dense MLP by role (GPT-2's ``attn.c_attn``, OPT's
``fc1`` on the layer) and a decoder's stacks of layers where it has more than one
(HRM-Text's ``L_module`` and ``H_module``); elsewhere (``names_from: source``) the
names are read from the source of the classes its ``__init__`` builds. An architecture the
table lacks gets the names of a plain decoder (``model.layers.N.self_attn``, ``...mlp``)
and ``unknown_architecture_warning`` says so; the doors print it with the estimate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "TABLE_RELEASE",
    "EncoderNames",
    "ModuleNames",
    "RenameMapper",
    "known_architecture",
    "mla_attention",
    "module_names",
    "output_projection",
    "registered_architecture",
    "rope_follows_max_model_len",
    "served_length_cap",
    "supports_pp",
    "ties_always",
    "ties_head",
    "unknown_architecture_warning",
]

TABLE_RELEASE = "0.32.0"
"""The vLLM release whose model table gatekeeper reads."""

_QKV = ("qkv_proj", ("q_proj", "k_proj", "v_proj"))
_GATE_UP = ("gate_up_proj", ("gate_proj", "up_proj"))

Renames = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RenameMapper:
    """A ``WeightsMapper`` as ``get_rename_mapper()`` leaves it (no renames to None)."""

    regex: Renames = ()
    substr: Renames = ()
    prefix: Renames = ()
    suffix: Renames = ()

    def apply(self, name: str) -> str:
        """``WeightsMapper._map_name_with_shard``: regexes, substrings, prefixes, then
        suffixes, each entry in turn."""
        for old, new in self.regex:
            if re.search(old, name):
                name = re.sub(old, new, name)
        for old, new in self.substr:
            if old in name:
                name = name.replace(old, new, 1)
        for old, new in self.prefix:
            if name.startswith(old):
                name = name.replace(old, new, 1)
        for old, new in self.suffix:
            if name.endswith(old):
                name = new.join(name.rsplit(old, 1))
        return name


@dataclass(frozen=True, slots=True)
class ModuleNames:
    """How one vLLM model class names the modules a quantization config is asked about."""

    model: str = "model"
    """The decoder's prefix (``model``, ``language_model.model``, ``model.decoder``)."""
    layers: str = "layers"
    """The attribute holding the decoder's layers (``layers``; BERT's encoder ``layer``)."""
    lm_head: str = "lm_head"
    attention: str = "self_attn"
    mlp: str = "mlp"
    """The MLP's attribute in a layer; for an MoE model, the module holding the experts."""
    dense_mlp: str = ""
    """A dense layer's MLP attribute where the class names it apart from the MoE module
    (MiniMax-M3: ``mlp`` in its first layers, ``block_sparse_moe`` in the rest); empty:
    ``mlp``."""
    experts: str = "experts"
    """The routed experts' attribute in the MoE module."""
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """An expert's gate, up and down projections as vLLM's experts layer names them
    (``RoutedExperts.ckpt_*_proj_name``, which vLLM's configs match experts by)."""
    checkpoint_expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """The same as the checkpoint names them (the class's ``get_expert_mapping()``:
    MiniMax-M3 and gpt-oss ``w1``/``w3``/``w2``), where the class says."""
    shared_experts: str = "shared_experts"
    packed: tuple[tuple[str, tuple[str, ...]], ...] = (_QKV, _GATE_UP)
    """``packed_modules_mapping``: a fused module and its checkpoint shards."""
    mappers: tuple[RenameMapper, ...] = ()
    """The rename mappers vLLM applies to a quantization config's lists, in order (the
    class's ``hf_to_vllm_mapper``; a wrapper's language model built through
    ``initialize_model`` applies its own after it)."""
    moe: str | None = None
    """The module holding the routed experts, relative to a layer (``mlp``,
    ``block_sparse_moe``; empty when they sit on the layer itself, Gemma 4's
    ``layers.N.experts``); None without routed experts in the table's build."""
    router: str = "gate"
    """The router's attribute beside the experts (``gate``; ``router`` in gpt-oss, Llama 4,
    Gemma 4)."""
    router_linear: str = ""
    """The router's linear inside it where the router is a module around one (Gemma 4's
    ``router.proj``); empty: the router is the linear."""
    quantized_router: bool = False
    """The MoE router (``GateLinear``) is built with the quantization config (Qwen3-MoE);
    elsewhere it is not, and stays in the model dtype whatever the config says."""
    mixer: str | None = None
    """The state mixer's attribute in a layer (Qwen3.5's ``linear_attn``, Mamba's ``mixer``)
    as vLLM asks the quantization config with it (Granite 4.0-H's ``mamba`` is built with
    the prefix ``mixer``)."""
    mixer_linears: tuple[tuple[str, bool], ...] = ()
    """The mixer's linears and whether each is built with the quantization config."""
    asked_layers: str = ""
    """The prefix vLLM asks a layer's modules with where it is not the layers' path
    (Gemma 3's bare model: ``.layers``, built from an empty prefix); empty: the path."""
    qkv: str = ""
    """Attention's input linear relative to a layer, where the table names it (GPT-2's
    ``attn.c_attn``; BERT's asks as ``attention.output.qkv_proj``; HRM-Text's
    ``self_attn.gqkv_proj``); empty: ``<attention>.qkv_proj``."""
    o_proj: str = ""
    """Attention's output linear relative to a layer (OPT's ``self_attn.out_proj``)."""
    up: str = ""
    """A dense MLP's input (gate/up) linear relative to a layer (OPT's ``fc1``, GPT-2's
    ``mlp.c_fc``); empty: ``<mlp>.gate_up_proj`` (``fc1`` ungated)."""
    down: str = ""
    """A dense MLP's output linear relative to a layer; empty: ``<mlp>.down_proj``."""
    asked_in_layer: str = ""
    """What vLLM puts between a layer's index and its modules' names when it asks the
    quantization config (Whisper: ``layers``, ``.decoder.layers.N.layers.self_attn.qkv_proj``:
    whisper.py builds each layer with ``.layers`` after the prefix ``make_layers`` hands
    it); empty: nothing."""
    encoder: EncoderNames | None = None
    """An encoder-decoder's encoder and cross-attention (Whisper), where the table has them."""
    stacks: tuple[str, ...] = ()
    """The decoder's layer lists in build order where it runs more than one stack of the
    same layers (HRM-Text: ``model.L_module.layers``, then ``model.H_module.layers``, as
    many layers each); empty: one, ``layers_path``."""
    known: bool = True
    """False when the table lacks the architecture (the names are a plain decoder's)."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """The table's whole row, for what the fields above do not carry."""

    @property
    def moe_module(self) -> str:
        """The module holding the routed experts and their router, relative to a layer:
        the table's ``moe`` (empty: on the layer itself, Gemma 4's ``layers.N.experts``
        beside its dense ``mlp``), else ``mlp``."""
        return self.moe if self.moe is not None else self.mlp

    @property
    def router_path(self) -> str:
        """The router's linear relative to the MoE module (``gate``; Gemma 4's
        ``router.proj``)."""
        return f"{self.router}.{self.router_linear}" if self.router_linear else self.router

    @property
    def layers_path(self) -> str:
        """The decoder layers' module path (``model.layers``; BERT's ``encoder.layer``;
        a bare model class's ``layers``), whatever vLLM asks them as."""
        return f"{self.model}.{self.layers}" if self.model else self.layers

    def layer(self, i: int, num_layers: int = 0) -> str:
        """Layer ``i`` as vLLM asks the quantization config about its modules; with
        ``stacks``, layer ``i`` of ``num_layers`` in its stack (the layers split evenly
        among the stacks, in order)."""
        if self.stacks and num_layers >= len(self.stacks):
            per_stack = num_layers // len(self.stacks)
            k = min(i // per_stack, len(self.stacks) - 1)
            return f"{self.stacks[k]}.{i - k * per_stack}"
        return f"{self.asked_layers or self.layers_path}.{i}" + _in(self.asked_in_layer)

    def to_vllm(self, name: str) -> str:
        """A checkpoint module name as the class's rename mappers write it."""
        for mapper in self.mappers:
            name = mapper.apply(name)
        return name


def _in(segment: str) -> str:
    return f".{segment}" if segment else ""


@dataclass(frozen=True, slots=True)
class EncoderNames:
    """An encoder-decoder's encoder layers as vLLM asks the quantization config about them
    (Whisper's ``.encoder.layers.N.layers``, as its decoder's), and the decoder layer's
    cross-attention. Whisper's encoder layers name their attention and MLP as its decoder
    layers do (whisper.py: ``self_attn``, ``mlp``), so the decoder's roles name theirs."""

    layers: str = "model.encoder.layers"
    asked_layers: str = ""
    asked_in_layer: str = ""
    cross_attention: str = "encoder_attn"

    def layer(self, i: int) -> str:
        """Encoder layer ``i`` as vLLM asks the quantization config about its modules."""
        return f"{self.asked_layers or self.layers}.{i}" + _in(self.asked_in_layer)


_WHISPER_ENCODER = EncoderNames()


def _encoder(row: dict[str, Any] | None) -> EncoderNames | None:
    if not row:
        return None
    return EncoderNames(
        layers=str(row.get("layers") or _WHISPER_ENCODER.layers),
        asked_layers=str(row.get("asked_layers") or ""),
        asked_in_layer=str(row.get("asked_in_layer") or ""),
        cross_attention=str(row.get("cross_attention") or _WHISPER_ENCODER.cross_attention),
    )


_TEXT = ModuleNames()


@cache
def _file() -> tuple[dict[str, str], dict[str, Any]]:
    """The table's rows by architecture, each as its JSON text, and the rest of the table.

    The file is JSON laid out one row to a line (``scripts/vllm-model-table.py`` writes
    it so): a start parses the rows it asks for, not the 391 rows (#39: 6-9 ms of every
    ``gatekeeper estimate``). ``tests/models/test_module_names.py`` holds the rows read
    this way to the file read whole."""
    path = resources.files("gatekeeper").joinpath(f"data/vllm_models/{TABLE_RELEASE}.json")
    rows: dict[str, str] = {}
    rest: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if line.startswith('  "'):  # a row of "models": a class name, no escapes
            name, _, text = line[3:].partition('": ')
            rows[name] = text.removesuffix(",")
        elif line.startswith(' "') and not line.endswith("{"):  # a key of the table
            rest.update(json.loads("{" + line.strip().removesuffix(",") + "}"))
    return rows, rest


@cache
def _parsed(architecture: str) -> dict[str, Any] | None:
    text = _file()[0].get(architecture)
    row: dict[str, Any] | None = json.loads(text) if text is not None else None
    return row


def registered_architecture(architecture: str) -> str | None:
    """The registry entry vLLM builds ``architecture`` with: itself, or the class whose
    name differs by the suffix vLLM converts (``registry._normalize_arch``: a
    ``Qwen3ForSequenceClassification`` is ``Qwen3ForCausalLM`` turned into a classifier,
    with the same modules); None when there is none."""
    models, rest = _file()
    if architecture in models:
        return architecture
    suffixes: list[str] = rest.get("suffixes") or []
    suffix = next((s for s in suffixes if architecture.endswith(s)), None)
    if suffix is None:
        return None
    return next((b for s in suffixes if (b := architecture.replace(suffix, s)) in models), None)


def known_architecture(architecture: str) -> bool:
    return registered_architecture(architecture) is not None


def unknown_architecture_warning(architecture: str) -> str | None:
    """The warning an estimate carries when vLLM's table lacks ``architecture``."""
    if not architecture or known_architecture(architecture):
        return None
    return (
        f"architecture {architecture} is not in vLLM {TABLE_RELEASE}'s model registry "
        "(vLLM runs it only through its Transformers backend, if at all): its modules are "
        "named as a plain decoder's (model.layers.N.self_attn, .mlp), so a quantization "
        "config's per-module lists may not match them as vLLM would"
    )


def _pairs(rows: list[list[Any]] | None) -> Renames:
    return tuple((str(old), str(new)) for old, new in rows or () if new is not None)


def _mapper(rows: dict[str, Any]) -> RenameMapper:
    return RenameMapper(*(_pairs(rows.get(kind)) for kind in ("regex", "substr", "prefix", "suffix")))  # fmt: skip


def _structure(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row's names and MoE names: vLLM's build where there is one, else the source's
    (the build's config may leave out routed experts a family can have: Gemma 4's)."""
    built: dict[str, Any] = row.get("built") or {}
    source: dict[str, Any] = row.get("names") or {}
    names = built if built.get("layers") else source
    moe: dict[str, Any] = names.get("moe") or source.get("moe") or {}
    return names, moe


def _from_row(row: dict[str, Any]) -> ModuleNames:
    names, moe = _structure(row)
    built: dict[str, Any] = row.get("built") or {}
    if "quant_mappers" in built:  # what vLLM applied, in order
        mappers = tuple(_mapper(m) for m in built["quant_mappers"])
    else:
        mappers = (_mapper(row["mapper"]),) if row.get("mapper") else ()
    packed_rows = built["quant_packed"] if "quant_packed" in built else row.get("packed")
    packed = tuple((str(k), tuple(v)) for k, v in packed_rows or ())
    mixer = (names.get("mixer") or [None])[0]
    mixer_linears = tuple(
        (str(attr), bool(quantized))
        for attr, *rest in ((names.get("linears") or {}).get("mixer") or {}).get(mixer, ())
        for quantized in rest[-1:]
    )
    mlps = [m for m in names.get("mlp") or () if m]
    module = moe.get("module")
    roles: dict[str, str] = names.get("linear_roles") or {}
    lm_head = names.get("asked_lm_head")  # "" where vLLM builds the head with no prefix
    return ModuleNames(
        model=names.get("model", "model") if names.get("layers") else "model",
        layers=names.get("layers") or "layers",
        lm_head=lm_head if lm_head is not None else names.get("lm_head") or "lm_head",
        asked_layers=names.get("asked_layers") or "",
        asked_in_layer=names.get("asked_in_layer") or "",
        encoder=_encoder(names.get("encoder")),
        qkv=roles.get("qkv", ""),
        o_proj=roles.get("o", ""),
        up=roles.get("up", ""),
        down=roles.get("down", ""),
        attention=(names.get("attention") or ["self_attn"])[0],
        mlp=module or (mlps or ["mlp"])[0],
        dense_mlp=next((m for m in mlps if m != module), ""),
        experts=moe.get("experts") or "experts",
        # a non-gated experts layer has no up projection: vLLM's compressed-tensors looks
        # its scheme up as "<experts>.0.None" (an f-string of None), and so does this
        expert_projections=tuple(
            map(str, moe.get("expert_projections") or _TEXT.expert_projections)
        ),  # type: ignore[arg-type]
        checkpoint_expert_projections=tuple(  # type: ignore[arg-type]
            map(
                str,
                moe.get("checkpoint_projections")
                or moe.get("expert_projections")
                or _TEXT.expert_projections,
            )
        ),
        shared_experts=moe.get("shared_experts") or "shared_experts",
        packed=packed,
        mappers=mappers,
        moe=module if moe else None,
        router=moe.get("router") or "gate",
        router_linear=moe.get("router_linear") or "",
        quantized_router=bool(moe.get("quantized_router")),
        mixer=names.get("asked_mixer") or mixer,  # Granite 4.0-H's mamba asks as mixer
        mixer_linears=mixer_linears,
        stacks=tuple(map(str, names.get("stacks") or ())),
        extra=row,
    )


@cache
def _known(architecture: str) -> ModuleNames | None:
    row = _parsed(architecture)
    return _from_row(row) if row is not None else None


def module_names(architecture: str, *, q_lora_rank: int | None = None) -> ModuleNames:
    """vLLM's names for ``architecture``'s modules (a plain decoder's when the table lacks
    it: ``unknown_architecture_warning`` says so). The packed entries the class's
    ``__init__`` adds under a condition count, but for those that need ``q_lora_rank``
    (DeepSeek's ``fused_qkv_a_proj``) when it is not set: the others name fused modules
    that a config failing their condition does not build (Qwen2-MoE's ``gate_up_proj``,
    packed when there is a shared expert or a dense layer), so they change nothing there."""
    registered = registered_architecture(architecture)
    names = _known(registered) if registered is not None else None
    if names is None:
        return replace(_TEXT, known=False)
    when = [p for p in names.extra.get("packed_when") or () if "module" in p]
    lora = {str(p["module"]) for p in when if p.get("fields") == ["q_lora_rank"]}
    packed = [(k, v) for k, v in names.packed if q_lora_rank or k not in lora]
    packed += [
        (str(p["module"]), tuple(p["shards"]))
        for p in when
        if all(k != p["module"] for k, _ in packed) and (q_lora_rank or p["module"] not in lora)
    ]
    return replace(names, packed=tuple(packed)) if tuple(packed) != names.packed else names


def _row(architecture: str) -> dict[str, Any]:
    registered = registered_architecture(architecture)
    row: dict[str, Any] = (_parsed(registered) or {}) if registered is not None else {}
    return row


def ties_head(architecture: str) -> bool | None:
    """Whether vLLM's class ties its LM head to the input embedding when the config says
    tied (``tie_word_embeddings``), as the table's ``probe`` found (the class built with it
    true: is the head the embedding's tensor): False where the class builds a head of its
    own whatever the config says (DeepSeek-V2's ``ParallelLMHead``, so Kimi K2.5's
    language model); a wrapper without a probe of its own answers as its language model
    (``names.language_model``); None when the table cannot say."""
    row = _row(architecture)
    found = (row.get("probe") or {}).get("ties_head")
    inner = (row.get("names") or {}).get("language_model")
    if found is None and inner and inner != architecture:
        return ties_head(str(inner))
    return bool(found) if found is not None else None


def ties_always(architecture: str) -> bool:
    """Whether vLLM's class ties its LM head to the input embedding even when the config
    says untied (zamba2.py and whisper.py call ``tie_weights`` unconditionally), as the
    table's ``probe`` found (the class built again with ``tie_word_embeddings`` false); a
    wrapper without a probe of its own answers as its language model."""
    row = _row(architecture)
    probe = row.get("probe") or {}
    inner = (row.get("names") or {}).get("language_model")
    if not probe and inner and inner != architecture:
        return ties_always(str(inner))
    return bool(probe.get("ties_always"))


def output_projection(architecture: str) -> str | None:
    """The linear the class projects its final hidden state with, by vLLM's name, where it
    builds one outside its decoder layers (EmbeddingGemma2's
    ``language_model.embedding_projection``, hidden -> ``embedding_dim``: the table's
    ``outside_linears``); None elsewhere."""
    outside = (_row(architecture).get("built") or {}).get("outside_linears") or ()
    return next((str(n) for n in outside if str(n).endswith(".embedding_projection")), None)


def served_length_cap(architecture: str) -> int | None:
    """The length vLLM serves the class at, at most, when ``--max-model-len`` is not given
    (a class's ``verify_and_update_config`` in ``models/config.py``: EmbeddingGemma2's
    8,192), as the table's ``probe`` found (``VllmConfig`` without a length); None where
    vLLM serves the config's own length."""
    cap = (_row(architecture).get("probe") or {}).get("default_max_model_len")
    return int(cap) if cap else None


def supports_pp(architecture: str) -> bool | None:
    """Whether vLLM runs the class under pipeline parallelism (the registry's
    ``supports_pp``: the ``SupportsPP`` interface); False where ``ModelConfig`` refuses
    ``--pipeline-parallel-size`` above 1 (Whisper, HRM-Text, the encoders); None when the
    table cannot say (a class this build cannot import)."""
    found = _row(architecture).get("supports_pp")
    return bool(found) if found is not None else None


def mla_attention(architecture: str) -> bool | None:
    """Whether the decoder's attention is vLLM's ``MLAAttention`` (the table's build:
    ``attention_layers``), which keeps MLA's latent cache and derives ``W_UK_T``/``W_UV``
    from ``kv_b_proj``; False where a class builds MLA's projections around a plain
    ``Attention`` on full heads (MiniCPM3); None when the table has no build."""
    layers = (_row(architecture).get("built") or {}).get("attention_layers")
    return "MLAAttention" in layers if layers else None


def rope_follows_max_model_len(architecture: str) -> bool:
    """Whether the class sizes its decoder's rotary cache by ``--max-model-len`` instead
    of the config's positions (EmbeddingGemma2: ``min(max_position_embeddings,
    max_model_len)``), as the table's ``probe`` found (built at a length no config has)."""
    return (_row(architecture).get("probe") or {}).get("rope_positions") == "max_model_len"
