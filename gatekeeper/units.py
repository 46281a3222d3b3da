"""Sizes: integer bytes everywhere in code, GiB (2^30) only when shown to people.

``parse_size`` accepts what an operator types (``79.19GiB``, ``80GB``, ``512MiB``,
``1073741824``) and ``format_gib`` renders bytes for people, always labelled.
GB means 10^9 bytes and GiB means 2^30 bytes; the two are never mixed. A bare one-letter
suffix is read as vLLM reads it on the same command line (``human_readable_int`` in
vLLM's ``utils/argparse_utils.py``, e.g. ``--kv-cache-memory-bytes 20G``): uppercase
binary (``80G`` = 80 x 2^30), lowercase decimal (``80g`` = 80 x 10^9), and no decimals
with an uppercase one (vLLM refuses ``1.5G``), so ``--gpu-memory 80G`` means what
``--kv-cache-memory-bytes 80G`` means.
"""

from __future__ import annotations

import math
import re

__all__ = ["GIB", "KIB", "MIB", "cdiv", "format_gib", "gib", "parse_size", "round_up"]

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

_SUFFIXES: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "kib": KIB,
    "mb": 1000**2,
    "mib": MIB,
    "gb": 1000**3,
    "gib": GIB,
    "tb": 1000**4,
    "tib": 1 << 40,
}
"""Suffixes of two or more letters, in any case."""
_VLLM_SUFFIXES: dict[str, int] = {
    "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
    "K": KIB, "M": MIB, "G": GIB, "T": 1 << 40,
}  # fmt: skip
"""One-letter suffixes, case-sensitive, as vLLM's ``human_readable_int`` reads them."""
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, *, field: str = "size") -> int:
    """Parse ``'79.19GiB'``, ``'80GB'``, ``'512 MiB'`` or ``'1073741824'`` into bytes.

    Raises ``ValueError`` naming the field, the value and the accepted forms.
    """
    match = _SIZE_RE.match(text)
    suffix = match.group(2) if match else ""
    scale = _VLLM_SUFFIXES.get(suffix) or _SUFFIXES.get(suffix.lower())
    if match is None or scale is None:
        raise ValueError(
            f"{field}: {text!r} is not a size; use bytes (1073741824) or a number with a unit "
            "such as 79.19GiB, 512MiB or 80GB (GB = 10^9 bytes, GiB = 2^30 bytes; as in vLLM, "
            "80G = 80 x 2^30 and 80g = 80 x 10^9)"
        )
    number = match.group(1)
    if suffix.isupper() and len(suffix) == 1 and "." in number:
        raise ValueError(
            f"{field}: {text!r}: {suffix} is binary (2^{10 * ' KMGT'.index(suffix)}) as vLLM "
            f"reads it, which takes no decimals; write {number}{suffix}iB, or "
            f"{number}{suffix.lower()} for 10^{3 * ' KMGT'.index(suffix)}"
        )
    value = math.floor(float(number) * scale)
    if value <= 0:
        raise ValueError(f"{field}: {text!r} must be greater than zero")
    return value


def gib(num_bytes: int | float) -> float:
    """Bytes as GiB (2^30), unrounded."""
    return num_bytes / GIB


def format_gib(num_bytes: int | float, digits: int = 2) -> str:
    """Bytes as a labelled GiB string, e.g. ``'14.96 GiB'``."""
    return f"{num_bytes / GIB:.{digits}f} GiB"


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def round_up(value: int, multiple: int) -> int:
    """Round ``value`` up to a multiple of ``multiple``."""
    return cdiv(value, multiple) * multiple
