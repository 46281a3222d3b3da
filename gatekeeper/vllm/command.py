"""Read a vLLM command line out of a container: the model and the serving flags.

Pure: a container's ``command``, ``args``, ``image`` and literal ``env`` in, a
``VllmCommand`` (or None when the container does not run vLLM) out. Recognised:

- ``vllm serve MODEL [flags]`` (also ``--model MODEL``), in ``command`` and/or ``args``;
- ``python -m vllm.entrypoints.openai.api_server --model MODEL [flags]``;
- ``python3 -m dynamo.vllm --model MODEL [flags]``: NVIDIA Dynamo's worker takes vLLM's
  engine arguments (its own are unknown flags); its image's tag is Dynamo's release, so
  the configured default release applies;
- either of those inside a shell script, ``sh -c "… && exec vllm serve …"``, also
  behind ``eval`` (split as the shell would: ``gatekeeper.vllm.shell``; ``$VAR`` and
  ``${VAR:-default}`` expanded from the container's literal environment, an expansion
  it does not give named among the problems);
- the ``vllm/vllm-openai`` image's own entrypoint, when the container gives only ``args``.

Kubernetes' ``$(VAR)`` references are expanded first. With no model on the command
line the model comes from ``VLLM_MODEL``, ``MODEL`` or ``MODEL_NAME``.

The release whose flags (and accounting) apply is the image's tag's
(``image_release``): ``vllm/vllm-openai:v0.8.5`` is read with 0.8.5's flag table and
judged with 0.8.5's accounting. ``latest``, a digest, or a tag that names no release:
the configured default, said in ``version_note``.

Finding the command is this module's; the flags are read by vLLM's own table, as
every door reads them (``gatekeeper.vllm.serve_args.parse_serve_args``, then
``gatekeeper.vllm.flags.serve_options``): every spelling, ``--flag=value``,
underscores, ``-O3``, dotted JSON fields, each value in vLLM's grammar. What a strict
reading would refuse is set aside and the rest read again:

- a flag vLLM's table lacks is *unknown* (the message names the nearest spellings;
  the webhook warns and checks without it: the image may run a newer vLLM);
- a value vLLM would refuse is a *problem* (the flag, the value and vLLM's grammar)
  and the flag keeps vLLM's default;
- ``--config FILE`` is a problem too: the file is in the pod, and is never opened here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import ServeOptionsError
from gatekeeper.estimator.accounting import DEFAULT_VLLM_VERSION
from gatekeeper.estimator.options import ServeOptions
from gatekeeper.vllm.flags import FlagTable, flag_table, serve_options
from gatekeeper.vllm.serve_args import ServeCommand, parse_serve_args
from gatekeeper.vllm.shell import after_launcher, script_arguments, shell_script

__all__ = [
    "MODEL_ENV_VARS",
    "VllmCommand",
    "expand_k8s_vars",
    "image_release",
    "parse_vllm_command",
]

MODEL_ENV_VARS = ("VLLM_MODEL", "MODEL", "MODEL_NAME")
"""Environment variables a model may come from when the command line names none."""

_IMAGE_ENTRYPOINT = re.compile(r"(^|/)vllm-openai([:@]|$)")
_K8S_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_RELEASE_TAG = re.compile(r"v?(\d+\.\d+(?:\.\d+){0,2})(?:[-+._]?(?:rc|post|dev)\d*)?(?:[-+_].*)?")
"""A tag that is a vLLM release: ``v0.8.5``, ``0.11.0``, ``v0.9.0.1``, ``v0.10.1rc1``,
``v0.8.5-cu126``."""
_EMBEDDED_RELEASE = re.compile(r"vllm[-_]v?(\d+\.\d+(?:\.\d+){0,2})", re.IGNORECASE)
"""A release inside a longer tag: ``rocm6.3.1_vllm_0.8.5_20250513``."""


@dataclass(frozen=True, slots=True)
class VllmCommand:
    """What a vLLM container asks for."""

    model: str | None
    """The model reference, or None when it cannot be read (``model_from`` says why)."""
    model_from: str
    """Where the model came from: ``command line``, ``--model``, ``env VLLM_MODEL`` …
    (empty when there is none)."""
    options: ServeOptions
    """Every modelled flag, read with vLLM's table (``serve_options``); TP, PP and DP
    (``options.data_parallel_size``) included."""
    vllm_version: str = DEFAULT_VLLM_VERSION
    """The release whose flags the command line was read with (and whose accounting
    ``options.vllm_version`` names): the image tag's, else the configured default."""
    version_note: str = ""
    """Why the default release applies (the image's tag names none); empty when the tag
    names it."""
    max_model_len_auto: bool = False
    """``--max-model-len auto`` (or -1): vLLM picks the longest length that fits."""
    problems: tuple[str, ...] = field(default=())
    """Flags whose values could not be read, each with what vLLM accepts."""
    unknown: tuple[str, ...] = field(default=())
    """Flags vLLM's table does not have (each naming the nearest spellings), or stray
    words; read without them."""


def expand_k8s_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` in command and args; ``$$`` escapes, unknown names stay."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _K8S_VAR.sub(sub, text)


def parse_vllm_command(
    command: Sequence[str],
    args: Sequence[str],
    image: str,
    env: Mapping[str, str],
    *,
    default_release: str | None = None,
) -> VllmCommand | None:
    """The vLLM serving command of a container, or None when it does not run vLLM; read
    with the flags of the release the image's tag names (``image_release``), else of
    ``default_release`` (the configured default vLLM version)."""
    cmd = [expand_k8s_vars(t, env) for t in command]
    arg = [expand_k8s_vars(t, env) for t in args]
    rest = _vllm_arguments(cmd, arg, image, env)
    if rest is None:
        return None
    release = image_release(image)
    note = ""
    if release is None:
        release = default_release or DEFAULT_VLLM_VERSION
        note = (
            f"image {image.strip()!r} names no vLLM release: read as vLLM {release} (the "
            "configured default); tag it :vX.Y.Z to read its own"
        )
    return _parse_arguments(rest, env, release, note)


def image_release(image: str) -> str | None:
    """The vLLM release an image reference names: the tag of an image whose name (the
    last part of its path) starts with ``vllm`` when the tag is a version
    (``vllm/vllm-openai:v0.8.5``, ``registry:5000/mirror/vllm-openai:0.11.0-cu126``), or
    ``vllm_X.Y.Z`` inside any tag (``rocm/vllm:rocm6.3.1_vllm_0.8.5_20250513``). None
    for ``latest``, a digest alone, no tag, a tag that names no release, or NVIDIA Dynamo's
    ``ai-dynamo/vllm-runtime`` (its tag is Dynamo's release)."""
    name, _, _digest = image.strip().partition("@")
    path, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag (a colon before is a registry's port)
        return None
    embedded = _EMBEDDED_RELEASE.search(tag)
    if embedded:
        return embedded.group(1)
    matched = _RELEASE_TAG.fullmatch(tag)
    dynamo = "ai-dynamo/" in path.lower()  # nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.7.1
    if matched and path.rsplit("/", 1)[-1].lower().startswith("vllm") and not dynamo:
        return matched.group(1)
    return None


def _vllm_arguments(
    command: list[str], args: list[str], image: str, env: Mapping[str, str]
) -> list[str] | None:
    tokens = [*command, *args]
    found = after_launcher(tokens)
    if found is not None:
        return found
    script = shell_script(tokens)
    if script is not None:
        return script_arguments(*script, env)
    if not command and _IMAGE_ENTRYPOINT.search(image.strip()):
        return args[1:] if args[:1] == ["serve"] else args
    return None


# -- flags: vLLM's table, through gatekeeper.vllm.serve_args -----------------------------

_WHERE = "vllm serve"
_MAX_SKIPPED = 16
"""Unreadable flags skipped before giving up on a command line (each costs a re-read)."""
_NEGATIVE_NUMBER = re.compile(r"-\d+$|-\d*\.\d+$")
"""What argparse takes as a value, not a flag, although it starts with a dash."""
_UNRESOLVED = (
    "a shell expansion the container's literal env does not give (the script, the image or "
    "a controller sets it when the pod starts), so what it adds cannot be read; read without it"
)
_ARGPARSE_ARGUMENT = re.compile(r"argument (-[^\s/:]+)")


@dataclass(slots=True)
class _Reading:
    """A command line being read: what is left of it, and what was skipped."""

    args: list[str]
    unknown: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _parse_arguments(
    tokens: Sequence[str], env: Mapping[str, str], release: str, note: str
) -> VllmCommand:
    table = flag_table(release)
    reading = _Reading(list(tokens))
    _without_config_file(reading)
    read = _read_flags(reading, table)
    values = {**read.values, "vllm_version": release}
    auto = values.get("max_model_len") == -1
    options = _options(values, reading.problems)
    model, model_from = _model(read.model, reading.args, env)
    return VllmCommand(
        model,
        model_from,
        options,
        vllm_version=release,
        version_note=note,
        max_model_len_auto=auto,
        problems=tuple(reading.problems),
        unknown=tuple(reading.unknown),
    )


def _without_config_file(reading: _Reading) -> None:
    """``--config FILE`` names a file in the pod, not here: named as unread, never opened."""
    args = reading.args
    while "--config" in args:
        i = args.index("--config")
        path = args[i + 1] if i + 1 < len(args) else ""
        del args[i : i + 2]
        reading.problems.append(
            f"--config {path!r}: flags in a config file cannot be read at admission; "
            "only the command line is checked"
        )


def _read_flags(reading: _Reading, table: FlagTable) -> ServeCommand:
    """The flags as vLLM reads them; each flag vLLM's table lacks or whose value vLLM
    would refuse is set aside (in ``reading``) and the rest read again."""
    last = f"more than {_MAX_SKIPPED} flags cannot be read"
    for _ in range(_MAX_SKIPPED):
        try:
            return parse_serve_args(reading.args, table, where=_WHERE)
        except ServeOptionsError as e:
            if not _set_aside(reading, e, table):
                last = _text(e)
                break
    reading.problems.append(f"{last}; no flag was checked")
    first = reading.args[0] if reading.args and not reading.args[0].startswith("-") else None
    return ServeCommand(first, {}, table.vllm)


def _text(e: ServeOptionsError) -> str:
    return str(e).removeprefix(f"{_WHERE}: ")


def _set_aside(reading: _Reading, e: ServeOptionsError, table: FlagTable) -> bool:
    """Drop what ``e`` is about from ``reading.args``; False when that cannot be told."""
    name, args = e.field, reading.args
    if name == "model" and "unexpected argument" in str(e):
        at = [j for j, a in enumerate(args) if a == e.value and args[j - 1 : j] != ["--model"]]
        if at:
            del args[at[-1]]
            stray = str(e.value)
            if "$" in stray:  # the shell expands it when the pod starts, not here
                reading.problems.append(f"{stray!r}: {_UNRESOLVED}")
            else:
                reading.unknown.append(_text(e))
            return True
    if isinstance(name, str) and name.startswith("-"):  # not a flag of the table
        _drop(args, {name}, table)
        reading.unknown.append(_text(e))
        return True
    flag = table.flags.get(name) if isinstance(name, str) else None
    if flag is None:  # argparse's own errors name the argument in the text
        found = _ARGPARSE_ARGUMENT.search(str(e))
        flag = table.find(found.group(1)) if found else None
    if flag is None or not _drop(args, set(flag.options), table):
        return False
    reading.problems.append(_text(e))
    return True


def _spelling(token: str, table: FlagTable) -> str | None:
    """The option a token spells, as vLLM normalises it (``--max_model_len=8k`` ->
    ``--max-model-len``, ``--hf-overrides.a.b`` -> ``--hf-overrides``, ``-O3`` ->
    ``--optimization-level``, ``--max-num-seq`` -> ``--max-num-seqs``); None for a value."""
    if not token.startswith("-") or _NEGATIVE_NUMBER.match(token) or token == "--":
        return None
    if token.startswith("--"):
        spelled = "--" + token[2:].partition("=")[0].partition(".")[0].replace("_", "-")
        return table.option_of(spelled) or spelled
    if token.startswith("-O"):
        return "--optimization-level"
    return token.partition("=")[0]


def _drop(args: list[str], spellings: set[str], table: FlagTable) -> bool:
    """Remove every use of the spelled options (with their values) from ``args``."""
    model_flag = any(a == "--model" or a.startswith("--model=") for a in args)
    found, i = False, 0
    while i < len(args):
        spelling = _spelling(args[i], table)
        if spelling not in spellings:
            i += 1
            continue
        found = True
        del args[i : i + _extent(args, i, table, model_flag)]
    return found


def _extent(args: Sequence[str], i: int, table: FlagTable, model_flag: bool) -> int:
    """How many tokens the option at ``i`` takes, its values included."""
    token = args[i]
    inline = "=" in token or (
        token.startswith("-O") and not token.startswith("--") and token != "-O"
    )
    flag = table.find(_spelling(token, table) or "")
    if inline or (flag is not None and flag.switch):
        return 1
    values = 0
    while i + 1 + values < len(args) and _spelling(args[i + 1 + values], table) is None:
        values += 1
    if flag is None:  # a flag vLLM lacks: its value is the next word, unless that is the model
        if "." in token:
            return 1 + min(values, 1)
        return 1 + (0 if i == 0 and not model_flag else min(values, 1))
    if flag.nargs in ("+", "*"):
        return 1 + values
    return 1 + min(values, flag.nargs if isinstance(flag.nargs, int) else 1)


def _model(read: str | None, args: Sequence[str], env: Mapping[str, str]) -> tuple[str | None, str]:
    if read:
        by_flag = any(a == "--model" or a.startswith("--model=") for a in args)
        return read, "--model" if by_flag else "command line"
    for name in MODEL_ENV_VARS:
        if env.get(name):
            return env[name], f"env {name}"
    return None, ""


def _options(values: dict[str, Any], problems: list[str]) -> ServeOptions:
    """``serve_options`` of the values; a value the estimator's options refuse keeps
    vLLM's default, named among the problems."""
    for _ in range(len(values) + 1):
        try:
            return serve_options(values)
        except ServeOptionsError as e:
            problems.append(str(e))
            if e.field not in values:
                break
            del values[e.field]
    return ServeOptions()
