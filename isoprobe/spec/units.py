"""Byte sizes as people write them ("8GiB", "16 GB", 3221225472) and as people read them.

Decimal units (kB, MB, GB, TB) are powers of 1000 and binary units (KiB, MiB,
GiB, TiB) powers of 1024, as on a GPU data sheet versus ``nvidia-smi``: users
mix both, so both are accepted and neither is guessed from the other.
"""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
#: 1 PiB: no memory a trial can have comes near it; a larger size is a typo (the spec's bound too).
MAX_BYTES = 1 << 50


def parse_bytes(value: int | float | str) -> int:
    """Return a byte count; raise ValueError with a usable message otherwise.

    Never raises anything else, whatever the value: an integer of any length
    stays an integer, and a size too large for a float (``"1"`` and 400 zeros,
    ``GiB``) is refused, not turned into infinity. Finite sizes above
    ``MAX_BYTES`` are returned, for the caller's bound to name (the spec says
    "more than 1 PiB" for both).
    """
    if isinstance(value, bool):
        raise ValueError("expected a size such as '8GiB', '16 GB' or a number of bytes, got a boolean")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a size must be at least one byte, got {_shown(value)}; write e.g. '8GiB' or '512MiB'")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 1:
            raise ValueError(f"a size must be at least one byte, got {value}; write e.g. '8GiB' or '512MiB'")
        return int(value)
    match = _PATTERN.match(str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {_shown(value)} as a size; write e.g. '8GiB', '16 GB', '512MiB' or a number of bytes"
        )
    number = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if number < 1:
        raise ValueError(f"a size must be positive, got {_shown(value)}")
    if not math.isfinite(number):  # "1" and 400 zeros: beyond any float, let alone any memory
        raise ValueError(f"{_shown(value)} is more than 1 PiB: not a memory size")
    return int(number)


def _shown(value: object) -> str:
    """``repr`` shortened for a message (errors.shown; not imported: this module stays dependency-free)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def format_bytes(count: int | float | None) -> str:
    """Binary units with two decimals: the way memory is reported by torch and nvidia-smi."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
