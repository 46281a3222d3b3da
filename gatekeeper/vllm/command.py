"""Read a vLLM command line out of a container: the model and the serving flags.

Pure: a container's ``command``, ``args``, ``image`` and literal ``env`` in, a
``VllmCommand`` (or None when the container does not run vLLM) out. Recognised:

- ``vllm serve MODEL [flags]`` (also ``--model MODEL``), in ``command`` and/or ``args``;
- ``python -m vllm.entrypoints.openai.api_server --model MODEL [flags]``;
- either of those inside a shell script, ``sh -c "… && exec vllm serve …"`` (split as
  the shell would, with ``shlex``; ``$VAR`` and ``${VAR:-default}`` expanded from the
  container's literal environment);
- the ``vllm/vllm-openai`` image's own entrypoint, when the container gives only ``args``.

Kubernetes' ``$(VAR)`` references are expanded first. With no model on the command
line the model comes from ``VLLM_MODEL``, ``MODEL`` or ``MODEL_NAME``. Flags take
vLLM's forms: ``--max-model-len 32768``, ``--max-model-len=32k`` (vLLM's human-readable
integers: ``k`` is 1000, ``K`` is 1024), underscores for dashes, and the short
``-tp``, ``-pp``, ``-dp``, ``-q``. A value that cannot be read becomes a *problem*
(the flag, the value and what vLLM accepts) and the flag keeps vLLM's default.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimate.options import ServeOptions
from gatekeeper.vllm.flags import human_readable_int

__all__ = [
    "MODEL_ENV_VARS",
    "VllmCommand",
    "expand_k8s_vars",
    "parse_vllm_command",
]

MODEL_ENV_VARS = ("VLLM_MODEL", "MODEL", "MODEL_NAME")
"""Environment variables a model may come from when the command line names none."""

_API_SERVER = "vllm.entrypoints.openai.api_server"
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "\n", "(", ")", ";;"})
_IMAGE_ENTRYPOINT = re.compile(r"(^|/)vllm-openai([:@]|$)")
_K8S_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SHELL_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")


@dataclass(frozen=True, slots=True)
class VllmCommand:
    """What a vLLM container asks for."""

    model: str | None
    """The model reference, or None when it cannot be read (``model_from`` says why)."""
    model_from: str
    """Where the model came from: ``command line``, ``--model``, ``env VLLM_MODEL`` …
    (empty when there is none)."""
    options: ServeOptions
    data_parallel_size: int = 1
    max_model_len_auto: bool = False
    """``--max-model-len auto`` (or -1): vLLM picks the longest length that fits."""
    problems: tuple[str, ...] = field(default=())
    """Flags whose values could not be read, each with what vLLM accepts."""


def expand_k8s_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` in command and args; ``$$`` escapes, unknown names stay."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _K8S_VAR.sub(sub, text)


def _expand_shell_vars(text: str, env: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        return env.get(name) or (default if default is not None else m.group(0))

    return _SHELL_VAR.sub(sub, text)


def parse_vllm_command(
    command: Sequence[str], args: Sequence[str], image: str, env: Mapping[str, str]
) -> VllmCommand | None:
    """The vLLM serving command of a container, or None when it does not run vLLM."""
    cmd = [expand_k8s_vars(t, env) for t in command]
    arg = [expand_k8s_vars(t, env) for t in args]
    rest = _vllm_arguments(cmd, arg, image, env)
    if rest is None:
        return None
    return _parse_arguments(rest, env)


def _vllm_arguments(
    command: list[str], args: list[str], image: str, env: Mapping[str, str]
) -> list[str] | None:
    tokens = [*command, *args]
    found = _after_launcher(tokens)
    if found is not None:
        return found
    script = _shell_script(tokens)
    if script is not None:
        return _from_script(script, env)
    if not command and _IMAGE_ENTRYPOINT.search(image.strip()):
        return args[1:] if args[:1] == ["serve"] else args
    return None


def _after_launcher(tokens: Sequence[str]) -> list[str] | None:
    """The arguments after ``vllm serve`` or ``-m vllm.entrypoints.openai.api_server``."""
    for i, token in enumerate(tokens):
        name = token.rsplit("/", 1)[-1]
        if name == "vllm" and i + 1 < len(tokens) and tokens[i + 1] == "serve":
            return list(tokens[i + 2 :])
        if token == "-m" and i + 1 < len(tokens) and tokens[i + 1] == _API_SERVER:
            return list(tokens[i + 2 :])
    return None


def _shell_script(tokens: Sequence[str]) -> str | None:
    """The script of ``sh -c SCRIPT`` (also ``bash -lc``, ``bash -ec`` …)."""
    if not tokens or tokens[0].rsplit("/", 1)[-1] not in _SHELLS:
        return None
    for i, token in enumerate(tokens[1:], start=1):
        if not token.startswith("-"):
            return None
        if "c" in token[1:] and not token.startswith("--") and i + 1 < len(tokens):
            return tokens[i + 1]
    return None


def _from_script(script: str, env: Mapping[str, str]) -> list[str] | None:
    lex = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars="();<>|&\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: the shell would fail too
        return None
    found = _after_launcher(tokens)
    if found is None:
        return None
    end = next((i for i, t in enumerate(found) if t in _SEPARATORS), len(found))
    return [_expand_shell_vars(t, env) for t in found[:end]]


# -- flags ------------------------------------------------------------------------------

_FLAG_NAMES = {
    "model": "model",
    "config": "config",
    "max-model-len": "max_model_len",
    "tensor-parallel-size": "tensor_parallel_size",
    "tp": "tensor_parallel_size",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "pp": "pipeline_parallel_size",
    "data-parallel-size": "data_parallel_size",
    "dp": "data_parallel_size",
    "quantization": "quantization",
    "q": "quantization",
    "dtype": "dtype",
    "kv-cache-dtype": "kv_cache_dtype",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "block-size": "block_size",
}
_BOOLEAN = {"enforce-eager": "enforce_eager"}
_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})


def _flag(token: str) -> tuple[str, str | None] | None:
    """``--max_model_len=32k`` -> (``max-model-len``, ``32k``); None for a non-flag."""
    if not token.startswith("-") or token in ("-", "--"):
        return None
    name, eq, value = token.lstrip("-").partition("=")
    return name.replace("_", "-"), (value if eq else None)


def _collect(tokens: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Raw values of the flags gatekeeper reads, and the leading positional model."""
    values: dict[str, str] = {}
    positional = [tokens[0]] if tokens and not tokens[0].startswith("-") else []
    i = len(positional)
    while i < len(tokens):
        parsed = _flag(tokens[i])
        i += 1
        if parsed is None:
            continue
        name, value = parsed
        if name in _BOOLEAN or name.removeprefix("no-") in _BOOLEAN:
            values[name] = "true" if value is None else value
        elif name in _FLAG_NAMES:
            if value is None and i < len(tokens):
                value, i = tokens[i], i + 1
            values[_FLAG_NAMES[name]] = value if value is not None else ""
    return values, positional


def _parse_arguments(tokens: Sequence[str], env: Mapping[str, str]) -> VllmCommand:
    values, positional = _collect(tokens)
    problems: list[str] = []
    model, model_from = _model(values, positional, env)
    fields: dict[str, Any] = {}
    auto = False
    for key, raw in values.items():
        if key == "max_model_len" and raw.strip().lower() in ("auto", "-1"):
            auto = True
        elif key in _CONVERTERS:
            converted = _convert(key, raw, problems)
            if converted is not None:
                fields[key] = converted
    if "config" in values:
        problems.append(
            f"--config {values['config']!r}: flags in a config file cannot be read at admission; "
            "only the command line is checked"
        )
    dp = fields.pop("data_parallel_size", 1)
    for name, key in _BOOLEAN.items():
        flag = _enforce(values, name, problems)
        if flag is not None:
            fields[key] = flag
    options = _options(fields, problems)
    return VllmCommand(model, model_from, options, dp, auto, tuple(problems))


def _model(
    values: Mapping[str, str], positional: Sequence[str], env: Mapping[str, str]
) -> tuple[str | None, str]:
    if positional:
        return positional[0], "command line"
    if values.get("model"):
        return values["model"], "--model"
    for name in MODEL_ENV_VARS:
        if env.get(name):
            return env[name], f"env {name}"
    return None, ""


def _enforce(values: Mapping[str, str], name: str, problems: list[str]) -> bool | None:
    if f"no-{name}" in values:
        return False
    raw = values.get(name)
    if raw is None:
        return None
    if raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    problems.append(f"--{name}={raw!r} is not a boolean; give --{name} or --no-{name}")
    return None


def _positive_int(raw: str) -> int:
    value = human_readable_int(raw)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _fraction(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 1:
        raise ValueError("must be in (0, 1]")
    return value


def _text(raw: str) -> str:
    if not raw.strip():
        raise ValueError("is empty")
    return raw.strip()


_CONVERTERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "max_model_len": (_positive_int, "a positive integer such as 32768 or 32k, or auto"),
    "tensor_parallel_size": (_positive_int, "a positive integer"),
    "pipeline_parallel_size": (_positive_int, "a positive integer"),
    "data_parallel_size": (_positive_int, "a positive integer"),
    "max_num_seqs": (_positive_int, "a positive integer"),
    "max_num_batched_tokens": (_positive_int, "a positive integer such as 8192 or 8k"),
    "kv_cache_memory_bytes": (_positive_int, "a positive number of bytes such as 20G"),
    "block_size": (_positive_int, "a positive integer"),
    "gpu_memory_utilization": (_fraction, "a fraction in (0, 1] such as 0.9"),
    "quantization": (_text, "a method name such as fp8 or awq"),
    "dtype": (_text, "auto, bfloat16, float16 or float32"),
    "kv_cache_dtype": (_text, "auto or fp8"),
}


def _convert(key: str, raw: str, problems: list[str]) -> Any:
    parse, accepted = _CONVERTERS[key]
    try:
        return parse(raw)
    except (ValueError, OverflowError):
        flag = key.replace("_", "-")
        problems.append(f"--{flag} {raw!r} cannot be read; vLLM takes {accepted}")
        return None


def _options(fields: dict[str, Any], problems: list[str]) -> ServeOptions:
    try:
        return ServeOptions(**fields)
    except ServeOptionsError as e:  # unreachable with the converters above; kept total
        problems.append(str(e))
        return ServeOptions()
