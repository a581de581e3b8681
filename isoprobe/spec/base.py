"""The base of every section of the spec: unknown keys are errors, and so is a value of the wrong type.

One base for all the spec's models (``spec``, ``spec.distributed``), so that a
rule made here holds for every field, including fields added later:

- ``extra="forbid"``: a typo must never be silently ignored;
- ``allow_inf_nan=False``: a float must be finite;
- ``strict=True``: no coercion between types. In pydantic's lax mode ``true``
  is the integer 1 and the float 1.0, so ``distributed.world_size: true`` was
  one rank and ``max_batch_size: true`` a cap of one sample, and ``2.0`` or
  ``"4"`` were taken for an integer: a mistake read as a number instead of
  named. Every source gives plain data (YAML, ``--set``'s YAML, Python values;
  tuples become lists in ``spec.plain``), and the one flag given as text with a
  number in it (``--max-batch-size``) is read as a number in ``overrides``.
  Sizes (``memory_budget``, ``recommendation.headroom``) still take text such
  as ``'8GiB'``: their own validators run before the type is checked.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecSection(BaseModel):
    """A section of the spec (or the whole spec): strict types, finite floats, no unknown keys, frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)
