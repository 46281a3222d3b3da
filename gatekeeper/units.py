"""Sizes: integer bytes everywhere in code, GiB (2^30) only when shown to people.

``parse_size`` accepts what an operator types (``79.19GiB``, ``80GB``, ``512MiB``,
``1073741824``) and ``format_gib`` renders bytes for people, always labelled.
GB means 10^9 bytes and GiB means 2^30 bytes; the two are never mixed.
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
    "k": 1000,
    "kb": 1000,
    "kib": KIB,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, *, field: str = "size") -> int:
    """Parse ``'79.19GiB'``, ``'80GB'``, ``'512 MiB'`` or ``'1073741824'`` into bytes.

    Raises ``ValueError`` naming the field, the value and the accepted forms.
    """
    match = _SIZE_RE.match(text)
    suffix = match.group(2).lower() if match else ""
    if match is None or suffix not in _SUFFIXES:
        raise ValueError(
            f"{field}: {text!r} is not a size; use bytes (1073741824) or a number with a unit "
            "such as 79.19GiB, 512MiB or 80GB (GB = 10^9 bytes, GiB = 2^30 bytes)"
        )
    value = math.floor(float(match.group(1)) * _SUFFIXES[suffix])
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
