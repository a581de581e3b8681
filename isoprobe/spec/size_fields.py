"""The spec's size fields: text such as ``'8GiB'`` read into bytes before pydantic checks the type.

``base.SpecSection`` is strict (no coercion between types), yet a size is
written as a person writes it: ``memory_budget: 16 GB``,
``recommendation.headroom: 2GiB``, ``search.edge_spread: 0``. These annotated
types run their parser first (``units.parse_bytes``), so every size field reads
text the same way and names the same errors, whichever section holds it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator

from isoprobe.errors import shown
from isoprobe.spec.units import MAX_BYTES, parse_bytes

ByteCount = Annotated[int, BeforeValidator(parse_bytes)]
#: A size where 0 means "none" (search.edge_spread: 0 turns the spread rule off).
ByteCountOrZero = Annotated[int, BeforeValidator(lambda value: 0 if value == 0 or value == "0" else parse_bytes(value))]


def _parse_headroom(value: Any) -> float | int:
    """A number in [0, 1) is a fraction of memory; an integer >= 1 or a size string is bytes (at most 1 PiB).

    Integers are compared as integers: one of 400 digits overflows ``float()``.
    """
    if isinstance(value, bool):
        raise ValueError("expected a fraction such as 0.1 or a size such as '2GiB'")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is neither a fraction in [0, 1) nor a whole number of bytes")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"headroom cannot be negative, got {shown(value)}")
        if 0 <= value < 1:
            return float(value)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value} is neither a fraction in [0, 1) nor a whole number of bytes")
        count = int(value)
    else:
        count = parse_bytes(value)
    if count > MAX_BYTES:
        raise ValueError(f"{shown(value)} is more than 1 PiB: not a memory size")
    return count


Headroom = Annotated[float | int, BeforeValidator(_parse_headroom)]
