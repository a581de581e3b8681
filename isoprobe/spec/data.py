"""The ``data`` section: batches from the user's own dataset, and the rule that picks the worst one.

A real epoch pads each batch to its longest sample, so the batch that runs out
of memory is the one that draws the longest samples, often thousands of steps
in. With a ``data`` section every trial trains on that batch: the B longest
samples of the dataset, collated as the user's loader collates them.

Which samples those are is decided here, by two pure rules that both sides
apply (the environment check to report them, a trial to rebuild them when the
list is too long to send): ``scanned_indices`` (whose lengths are computed:
all, or a seeded sample) and ``worst_first`` (longest first, ties by index).
Pure stdlib; no torch.
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field, model_validator

from isoprobe.spec.base import SpecSection

#: Lengths are computed for every sample of a dataset up to this size, else for a seeded sample of this size.
#: One length is one ``dataset[i]`` and one call of the length function: a few microseconds for samples held
#: in memory (200 000 take seconds, within the environment check's time), milliseconds for samples decoded
#: from disk (raise search.trial_timeout, or lower data.scan_limit, for those).
DEFAULT_SCAN_LIMIT = 200_000
#: The seed of the sample drawn when the dataset is larger than ``scan_limit``: the same samples every run.
SAMPLE_SEED = 0
#: A trial's request carries the indices of its batch up to this many (about 40 KB of JSON); a larger batch
#: is rebuilt by the trial itself with the same two rules, and checked against the first ones sent.
INDICES_IN_REQUEST = 4096

#: A callable a spec names: 'package.module:function' or 'path/to/file.py:function' (``spec.model`` uses it too).
CALLABLE_REFERENCE = re.compile(r"[^:]+:[A-Za-z_][A-Za-z0-9_]*")
#: The fields of the section that name a callable: 'module:function' or 'file.py:function'.
DATA_CALLABLE_FIELDS = ("dataset", "collate_fn", "length")


class DataSpec(SpecSection):
    """Batches from your dataset: every trial trains on the B longest samples, collated as your loader does."""

    dataset: str = Field(
        description=(
            "A function returning a map-style torch.utils.data.Dataset (len() and dataset[i]), written "
            "'package.module:function' or 'path/to/file.py:function' (relative to the spec file), called as "
            "f(**data.kwargs). Each trial's batch of B is the B longest samples (by data.length; ties by index), "
            "so the answer holds for the worst batch an epoch can draw. An IterableDataset cannot be indexed: "
            "materialise its longest samples into a map-style dataset, or make batches with model.batch."
        ),
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for data.dataset.")
    collate_fn: str | None = Field(
        None,
        description=(
            "The collate function your DataLoader uses, 'module:function' or 'file.py:function', called with a "
            "list of samples. It returns a tensor (model(batch)), a pair (inputs, targets) or a dict of "
            "keyword arguments (model(**batch), as a Hugging Face model takes it). Unset: torch's default_collate."
        ),
    )
    length: str | None = Field(
        None,
        description=(
            "A function 'module:function' or 'file.py:function' called with one sample and returning its length "
            "(a number). Unset: the number of elements of the sample's largest tensor."
        ),
    )
    scan_limit: int = Field(
        DEFAULT_SCAN_LIMIT,
        ge=1,
        le=1 << 30,
        description=(
            "The environment check computes the length of every sample of a dataset up to this size; of a larger "
            "one, of a seeded random sample of this many (the result's data.sampled says so: a longer sample "
            "outside it is then not seen). Each length is one dataset[i]: lower this for samples read from disk."
        ),
    )

    @model_validator(mode="after")
    def _references(self) -> DataSpec:
        for name in DATA_CALLABLE_FIELDS:
            value = getattr(self, name)
            if value is not None and not CALLABLE_REFERENCE.fullmatch(value):
                raise ValueError(f"{name}: {value!r} must look like 'package.module:function' or 'file.py:function'")
        return self


def scanned_indices(total: int, limit: int, seed: int = SAMPLE_SEED) -> list[int]:
    """The samples whose lengths are computed: all of them up to ``limit``, else a seeded sample of ``limit``.

    Sorted, so that the dataset is read in order (a file-backed one reads faster so).
    """
    if total <= limit:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), limit))


def worst_first(indices: list[int], lengths: list[float]) -> list[int]:
    """``indices`` ordered longest first, ties by the smaller index: the first B are the worst batch of B.

    Ties by index so that the parent, which reports the batch, and a trial, which rebuilds it, agree.
    """
    if len(indices) != len(lengths):
        raise ValueError(f"{len(indices)} indices but {len(lengths)} lengths")
    return [index for _, index in sorted(zip(lengths, indices, strict=True), key=lambda pair: (-pair[0], pair[1]))]
