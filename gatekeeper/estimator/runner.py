"""``--runner`` and ``--convert`` resolved as vLLM resolves them, and what follows in memory.

Pure. vLLM 0.32's ``ModelConfig`` (``vllm/config/model.py``):

- ``_get_runner_type``: an explicit runner is kept; ``auto`` with a ``--convert`` other
  than auto/none is ``pooling``; else ``_get_default_runner_type``: ``pooling`` when the
  checkpoint has a sentence-transformers Pooling module (``ModelSpec.sentence_transformers``),
  then the registry's verdict for a registered architecture, then the suffix table
  (``_SUFFIX_TO_DEFAULTS``), then ``generate``;
- ``_get_convert_type``: an explicit convert is kept; else ``none`` when the registry
  says the architecture is natively of the runner's kind, else the suffix table's convert
  for that runner, else ``embed`` for pooling and ``none`` otherwise;
- the checks after them: a pooling-only model refuses ``--runner generate|draft``; a
  pooling runner on a generative model needs ``--convert embed|classify``.

A pooling runner loads no LM head and samples nothing (``weights.WeightOptions.lm_head``,
the sampler's activation), and ``--dtype auto`` prefers float16 for its float32
checkpoints (``dtype.resolve_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.vllm_registry import GENERATIVE_OTHER_SUFFIX, POOLING_ARCHITECTURES
from gatekeeper.models.spec import ModelSpec

__all__ = ["CONVERTS", "RUNNERS", "SUFFIX_DEFAULTS", "Runner", "resolve_runner"]

RUNNERS = ("auto", "generate", "pooling", "draft")
CONVERTS = ("auto", "none", "embed", "classify")
"""vLLM 0.32's ``RunnerOption`` and ``ConvertOption``."""

SUFFIX_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("ForCausalLM", "generate", "none"),
    ("ForConditionalGeneration", "generate", "none"),
    ("ChatModel", "generate", "none"),
    ("LMHeadModel", "generate", "none"),
    ("ForTextEncoding", "pooling", "embed"),
    ("EmbeddingModel", "pooling", "embed"),
    ("ForSequenceClassification", "pooling", "classify"),
    ("ForTokenClassification", "pooling", "classify"),
    ("ForAudioClassification", "pooling", "classify"),
    ("ForImageClassification", "pooling", "classify"),
    ("ForVideoClassification", "pooling", "classify"),
    ("ClassificationModel", "pooling", "classify"),
    ("ForRewardModeling", "pooling", "embed"),
    ("RewardModel", "pooling", "embed"),
    ("Model", "pooling", "embed"),
)
"""vLLM's ``_SUFFIX_TO_DEFAULTS`` (suffix, runner, convert), first match wins."""


@dataclass(frozen=True, slots=True)
class Runner:
    runner: str
    """``generate``, ``pooling`` or ``draft``."""
    convert: str
    """``none``, ``embed`` or ``classify``."""

    @property
    def pooling(self) -> bool:
        return self.runner == "pooling"


def _suffix(arch: str, runner: str | None = None) -> tuple[str, str] | None:
    """``try_match_architecture_defaults``: (runner, convert) of the first matching suffix."""
    for suffix, default_runner, convert in SUFFIX_DEFAULTS:
        if (runner is None or runner == default_runner) and arch.endswith(suffix):
            return default_runner, convert
    return None


def _native(arch: str) -> str | None:
    """What the registry says the architecture is natively (None: the suffix decides)."""
    if arch in POOLING_ARCHITECTURES:
        return "pooling"
    if arch in GENERATIVE_OTHER_SUFFIX:
        return "generate"
    return None


def _default_runner(spec: ModelSpec) -> str:
    if spec.sentence_transformers:
        return "pooling"
    native = _native(spec.architecture)
    if native is not None:
        return native
    match = _suffix(spec.architecture)
    return match[0] if match else "generate"


def _natively(arch: str) -> str:
    match = _suffix(arch)
    return _native(arch) or (match[0] if match else "generate")


def _default_convert(spec: ModelSpec, runner: str) -> str:
    arch = spec.architecture
    if _native(arch) == runner:
        return "none"
    match = _suffix(arch, runner)
    if match:
        return match[1]
    return "embed" if runner == "pooling" else "none"


def _bad(flag: str, value: str, text: str) -> ServeOptionsError:
    return ServeOptionsError(f"{flag}: {text}", field=flag, value=value)


def resolve_runner(spec: ModelSpec, runner: str = "auto", convert: str = "auto") -> Runner:
    """vLLM's runner and convert types for ``spec`` under ``--runner`` / ``--convert``."""
    if runner not in RUNNERS:
        raise _bad("runner", runner, f"{runner!r} is not one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise _bad("convert", convert, f"{convert!r} is not one of {', '.join(CONVERTS)}")
    if runner != "auto":
        chosen = runner
    elif convert in ("auto", "none"):
        chosen = _default_runner(spec)
    else:
        chosen = "pooling"
    conv = convert if convert != "auto" else _default_convert(spec, chosen)
    native = _natively(spec.architecture)
    if native == "pooling" and chosen in ("generate", "draft"):
        raise _bad(
            "runner",
            runner,
            f"{spec.architecture} is an embedding model, which vLLM does not run with "
            f"--runner {chosen}; use --runner pooling or auto",
        )
    if chosen == "pooling" and native != "pooling" and conv not in ("embed", "classify"):
        raise _bad(
            "convert",
            convert,
            f"{spec.architecture} is not a pooling model; vLLM runs it with --runner pooling "
            "only with --convert embed or classify",
        )
    return Runner(chosen, conv)
