"""The plan in the result: the recommended batch below the maximum, its soaks, and the accumulation plan.

How the batch a job should run follows from the maximum (headroom, rounding, soak), and how
``plan.target_global_batch`` is reached with it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.report.insights import MemoryModel
from isoprobe.report.outcomes import Outcome
from isoprobe.report.strict import Strict


class Soak(Strict):
    """One run of a recommended batch for recommendation.soak_steps steps in a fresh process."""

    batch_size: int
    trial: int = Field(
        description="The trial that ran it (its step_budget_peak_bytes show the peak after each step, "
        "in the capacity's units: what the soak judged)."
    )
    outcome: Outcome
    steps_completed: int
    growth_bytes_per_step: float | None = Field(
        None,
        description="How fast the peak still rose per step after the warm-up (a third of the steps); null "
        "with fewer than three steps.",
    )
    still_rising: bool = Field(description="The peak rose over the last third of the steps by more than noise.")
    projected_peak_bytes: int | None = Field(
        None, description="The last step's peak plus the growth over the steps it did not reach."
    )
    survived: bool = Field(
        description="It ran every step and fit, and its peak was not still rising above target_peak_bytes."
    )


class Recommendation(Strict):
    """How the recommended batch follows from the maximum."""

    capacity_bytes: int = Field(
        description=(
            "The capacity the headroom is measured from: the memory the trials could use (the budget, or the "
            "device's free memory if less). Every peak of the recommendation is in its units (the trials' "
            "budget_peak_bytes)."
        )
    )
    headroom_bytes: int = Field(description="Memory to keep free below that capacity.")
    target_peak_bytes: int = Field(description="capacity - headroom: the peak the recommended batch should stay under.")
    memory_model: MemoryModel | None = Field(None, description="The line used to predict peaks; null with one point.")
    multiple_of: int
    predicted_peak_bytes: int | None = None
    measured_peak_bytes: int | None = Field(
        None, description="Peak of the trial that ran the recommended batch, in capacity_bytes's units."
    )
    soak_steps: int = Field(0, description="Steps each soak ran (recommendation.soak_steps as applied; 0: none ran).")
    soaked: bool = Field(
        False,
        description="True when the recommended batch survived a soak of soak_steps steps (soaks[-1]). False "
        "with recommendation.soak_steps 0: no trial ran for the recommendation, and measured_peak_bytes is a search "
        "trial's at that batch, or null where none ran it (the batch is at or below max_batch_size, which fit).",
    )
    soaks: list[Soak] = Field(
        default_factory=list,
        description="Every soak, in order: a batch that did not survive moved the recommendation down to the next.",
    )
    proven_by_trial: int | None = Field(
        None,
        description="The trial whose long run proves the recommended batch without a soak of its own "
        "(recommendation.soak_steps null): the maximum's deciding trial, which stepped until its peak was steady "
        "at a larger batch, with the line plus its growth over steps within target_peak_bytes. Null where a soak "
        "ran, or none was asked (soak_steps 0).",
    )
    decided_by: (
        Literal["line", "measured_within", "measured_over", "no_line", "headroom_unreachable", "soak", "throughput"]
        | None
    ) = Field(
        None,
        description="What set recommended_batch_size, so that two runs of one spec that recommend differently "
        "say why: line (the largest multiple_of whose peak memory_model predicts within target_peak_bytes: the same "
        "maximum and peaks near it give the same batch, whichever smaller batches the search ran); measured_within "
        "(a larger batch a trial measured within the target: that trial ran on this path only); measured_over (held "
        "below a batch a trial measured over the target); no_line (too few fitting batches: the maximum, no "
        "headroom); headroom_unreachable (1: the target is below one sample); soak (a soak that did not survive "
        "moved it down, or none survived: soaks); throughput (recommendation.objective throughput: measured speed, "
        "which differs between runs). The note says when the line's choice is borderline (a predicted peak closer "
        "to the target than a run's readings move). Null in results written before it was recorded.",
    )
    note: str = Field(description="How the number was derived, in words.")


class AccumulationPlan(Strict):
    """How to reach plan.target_global_batch: micro-batch x accumulation steps x data-parallel ranks."""

    target_global_batch: int
    world_size: int
    world_size_source: str = Field(
        description="spec, or the environment variable it came from (WORLD_SIZE, SLURM_NTASKS), or "
        "distributed.world_size (the probe's gang), or default."
    )
    micro_batch_size: int = Field(description="Per rank and step; at most the recommended batch.")
    accumulation_steps: int
    global_batch_size: int = Field(description="micro_batch_size x accumulation_steps x world_size.")
    difference: int = Field(
        description="global_batch_size - target_global_batch; 0 when the target is reached exactly."
    )
    note: str
