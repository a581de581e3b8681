"""The spec's ``recommendation`` and ``plan`` sections: what the answer advises, once the maximum is found.

Neither changes the edge the search finds; both turn it into advice: the
batch to use with headroom below the edge (and the soak that proves it), and
the gradient accumulation and ranks that reach a target global batch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.spec.base import SpecSection
from isoprobe.spec.search_section import MAX_BATCH_SIZE
from isoprobe.spec.size_fields import Headroom


class RecommendationSpec(SpecSection):
    """How the recommended batch is derived from the maximum: headroom below the edge, then rounding."""

    headroom: Headroom = Field(
        0.1,
        description=(
            "Memory to keep free below the capacity: a fraction in [0, 1) such as 0.1, or a size such as '2GiB'. "
            "The capacity is memory_budget or the device's memory, never a value read off the memory line. The "
            "recommended batch is the largest multiple_of whose peak the line through the fitting batches from "
            "half the maximum up predicts within capacity - headroom: the same maximum and peaks near it give the "
            "same batch, whichever smaller batches the search ran (result.recommendation.decided_by says what set "
            "it)."
        ),
    )
    multiple_of: int = Field(
        1,
        ge=1,
        le=MAX_BATCH_SIZE,
        description="Round the recommended batch down to a multiple of this (e.g. 8 for tensor cores).",
    )
    objective: Literal["max", "throughput"] = Field(
        "max",
        description=(
            "max: recommend the largest batch within the headroom; throughput: the smallest tested batch within "
            "the headroom that is within throughput_tolerance of the best measured throughput."
        ),
    )
    throughput_tolerance: float = Field(
        0.03, ge=0, lt=1, description="Fraction of the best throughput that counts as as fast (0.03: within 3 %)."
    )
    soak_steps: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description=(
            "Steps the recommended batch runs in a fresh process before it is reported, reading the peak after "
            "each step: memory that grows over steps (fragmentation, a cache that fills, a leak) shows there. "
            "A batch that fails, or whose peak still rises above the headroom line, moves the recommendation "
            "down (up to 3 soaks). null (the default): a soak only where it adds evidence: none when the "
            "recommended batch is below a maximum whose deciding trial stepped until its peak was steady and the "
            "line, plus the growth that trial showed over steps, keeps it within the headroom (memory rises with "
            "the batch, so the maximum's steady run already proves it; result.recommendation.proven_by_trial "
            "names that trial); otherwise a soak of 20 steps on CUDA, 6 on the CPU backend (where a step takes "
            "seconds to minutes and the allocator settles within two steps, so 6 show a trend over the last "
            "four). A number: always soak that many steps. 0: no soak and no trial for the recommendation: the "
            "batch advised from the fitting trials, at or below the maximum (result.recommendation.soaked false)."
        ),
    )


class PlanSpec(SpecSection):
    """A target global batch to reach by gradient accumulation and data parallelism."""

    target_global_batch: int | None = Field(
        None, ge=1, le=1 << 30, description="The global batch the real job wants (micro-batch x accumulation x ranks)."
    )
    world_size: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description=("Data-parallel ranks. Unset: WORLD_SIZE (torchrun) or SLURM_NTASKS from the environment, else 1."),
    )
