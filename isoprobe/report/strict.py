"""The base of every report document's models: a field nobody declared is refused, not ignored.

A result or frontier read back (from the cache, ``isoprobe plot``, a sweep) with a field it does
not know is another version's or a forged one, so each model is ``extra="forbid"``, from one place.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
