"""Read a vLLM command line out of a container's shell script, as the shell would split it.

Pure: the tokens of a container's ``command`` and ``args`` and its literal ``env`` in, the
words after ``vllm serve`` (or ``-m vllm.entrypoints.openai.api_server``, ``-m dynamo.vllm``)
out. The script
of ``sh -c SCRIPT [$0 ARGS...]`` (also ``bash -lc``, ``bash -ec`` …) is split with
``shlex``, the way the shell splits words, then:

- ``$(...)`` and ``$((...))`` stay whole words, never split at their parentheses (the
  shell runs them when the pod starts; their text is kept for the reader to report);
- ``eval "exec vllm serve ..."`` is split again, as ``eval`` has the shell do
  (KServe's LLMInferenceService writes its vllm serve line so);
- ``$VAR`` and ``${VAR:-default}`` come from the container's literal environment; a word
  that is one such expansion and nothing else is split again at whitespace, as the shell
  splits an unquoted expansion (``exec vllm serve $MODEL $EXTRA_ARGS`` with
  ``EXTRA_ARGS="--max-model-len 8192 --enforce-eager"`` is three flags, not one word);
  ``$@`` and ``$*`` are the script's positional arguments;
- an expansion the environment does not give (set by the script or the controller at run
  time) stays as written, for the reader to report as unreadable.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

__all__ = [
    "after_launcher",
    "expand_shell_vars",
    "launcher_ends",
    "script_arguments",
    "script_index",
    "shell_script",
]

API_SERVER = "vllm.entrypoints.openai.api_server"
DYNAMO_WORKER = "dynamo.vllm"
_MODULES = frozenset({API_SERVER, DYNAMO_WORKER})
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_LONG_WITH_ARGUMENT = frozenset({"--rcfile", "--init-file"})
"""bash's long options that take the next word."""
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "\n", "(", ")", ";;"})
_SHELL_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?:(:?)-([^}]*))?\}|\$([A-Za-z_]\w*)")
_SUBSTITUTION = re.compile(r"\$\(\([^()]*\)\)|\$\([^()]*\)")
"""``$((arithmetic))`` and ``$(command)`` without nested parentheses."""
_HOLE = "\x00{}\x00"
_LAUNCHER_TEXT = re.compile(
    r"(?:^|(?<=[\s;&|(]))(?:(?:\S*/)?vllm\s+serve|-m\s+(?:"
    + "|".join(re.escape(m) for m in sorted(_MODULES))
    + r"))(?=\s|$)"
)
"""``after_launcher``'s launchers in a script's text: ``vllm serve`` (any path), ``-m`` and
one of its modules."""


def after_launcher(tokens: Sequence[str]) -> list[str] | None:
    """The arguments after ``vllm serve``, ``-m vllm.entrypoints.openai.api_server`` or
    ``-m dynamo.vllm`` (NVIDIA Dynamo's worker, which takes vLLM's engine arguments)."""
    for i, token in enumerate(tokens):
        name = token.rsplit("/", 1)[-1]
        if name == "vllm" and i + 1 < len(tokens) and tokens[i + 1] == "serve":
            return list(tokens[i + 2 :])
        if token == "-m" and i + 1 < len(tokens) and tokens[i + 1] in _MODULES:
            return list(tokens[i + 2 :])
    return None


def launcher_ends(script: str) -> list[int]:
    """Where each launcher ``after_launcher`` knows ends in a script's text, in order. The
    text is not the shell's reading: one may be in a comment or an echoed string
    (``echo "starting vllm serve"``), so a writer tries them in turn."""
    return [found.end() for found in _LAUNCHER_TEXT.finditer(script)]


def script_index(tokens: Sequence[str]) -> int | None:
    """The index of SCRIPT in ``sh -c SCRIPT`` (also ``bash -lc``, ``bash --login -c``,
    ``bash -o pipefail -c``, ``bash -eo pipefail -c`` …), else None. The shell's options
    before ``-c`` are skipped with their arguments: ``-o``/``+o`` and bash's ``-O``/``+O``
    take the next word (one each in a cluster: ``-eo pipefail``), as do ``--rcfile`` and
    ``--init-file``; ``--`` ends the options (a word after it is a script file)."""
    if not tokens or tokens[0].rsplit("/", 1)[-1] not in _SHELLS:
        return None
    i = 1
    while i < len(tokens):
        token = tokens[i]
        if token == "--" or not token.startswith(("-", "+")) or len(token) < 2:
            return None
        if token.startswith("--"):
            i += 2 if token in _LONG_WITH_ARGUMENT else 1
            continue
        if token.startswith("-") and "c" in token[1:]:
            return i + 1 if i + 1 < len(tokens) else None
        i += 1 + token.count("o") + token.count("O")
    return None


def shell_script(tokens: Sequence[str]) -> tuple[str, list[str]] | None:
    """The script of ``sh -c SCRIPT`` (``script_index``) and its positional arguments (the
    words after ``$0``), else None."""
    at = script_index(tokens)
    return (tokens[at], list(tokens[at + 2 :])) if at is not None else None


def expand_shell_vars(text: str, env: Mapping[str, str]) -> str:
    """``$VAR``, ``${VAR}``, ``${VAR-default}`` and ``${VAR:-default}`` from ``env`` (a
    value set empty is empty, but for ``:-``); names it lacks stay as written."""

    def sub(m: re.Match[str]) -> str:
        name, colon, default = m.group(1) or m.group(4), m.group(2), m.group(3)
        value = env.get(name)
        if value is not None and not (colon and not value):
            return value
        return default if default is not None else m.group(0)

    return _SHELL_VAR.sub(sub, text)


def script_arguments(
    script: str, positional: Sequence[str], env: Mapping[str, str], depth: int = 0
) -> list[str] | None:
    """The words after the launcher in ``script``, expanded; None when the script runs no
    vLLM or cannot be split (an unbalanced quote: the shell would fail too)."""
    holes: list[str] = []

    def hole(m: re.Match[str]) -> str:
        holes.append(m.group(0))
        return _HOLE.format(len(holes) - 1)

    tokens = _split(_SUBSTITUTION.sub(hole, script.replace("\\\n", " ")))
    if tokens is None:
        return None
    tokens = [re.sub("\x00(\\d+)\x00", lambda m: holes[int(m.group(1))], t) for t in tokens]
    found = after_launcher(tokens)
    if found is None:
        evals = [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "eval"]
        for text in evals if depth < 2 else ():
            again = script_arguments(text, positional, env, depth + 1)
            if again is not None:
                return again
        return None
    end = next((i for i, t in enumerate(found) if t in _SEPARATORS), len(found))
    return [word for token in found[:end] for word in _words(token, positional, env)]


def _split(text: str) -> list[str] | None:
    lex = shlex.shlex(text, posix=True, punctuation_chars="();<>|&\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    try:
        return list(lex)
    except ValueError:
        return None


def _words(token: str, positional: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """A token expanded; split at whitespace when it is one expansion the environment
    gives (the shell splits an unquoted expansion so)."""
    if token in ("$@", "$*"):
        return list(positional)
    expanded = expand_shell_vars(token, env)
    if expanded != token and _SHELL_VAR.fullmatch(token):
        return expanded.split()
    return [expanded]
