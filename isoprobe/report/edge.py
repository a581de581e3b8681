"""The edge in the result: how sure the maximum is, and what bounds it.

The spread rule's margin and the marginal batches above the maximum, the token search's
per-length edges, the edge under each allocator setting, and the dataset whose worst batch
the maximum's trials ran.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.report.strict import Strict


class MarginalBatch(Strict):
    """A batch above the maximum that fit, but inside the spread: a coin toss in a long run, not the maximum."""

    batch_size: int
    runs: int = Field(
        description="Trials of this batch that ran until steady; where none did, its trials of "
        "search.steps steps, whose peak already left no more than the spread free (a "
        "long run's peak only rises, so none ran until steady)."
    )
    fitted: int = Field(description="How many of those fit.")
    free_bytes: int = Field(
        description="The least memory a fitting one's peak left free below capacity_bytes: at most spread_bytes."
    )


class EdgeMargin(Strict):
    """The spread rule (docs/steady-state.md): the maximum's steady peak leaves more than the spread free."""

    capacity_bytes: int = Field(description="The capacity the free memory is measured below (per rank in a gang).")
    spread_bytes: int = Field(
        description="How far a long run's peak may move between fresh processes and over steps: the larger of "
        "floor_bytes and observed_bytes. A deciding trial fits as the maximum only with more free."
    )
    floor_bytes: int = Field(
        description="The backend's measured floor for this capacity (on the CPU, for one "
        "process or a command: from its trials' heap churn, "
        "Trial.heap_churn_bytes), or search.edge_spread."
    )
    observed_bytes: int | None = Field(
        None,
        description="The most two fresh runs of one batch in this probe differed in their peak after the same "
        "step, or one step's peak rose above a later one's within a trial (trials' "
        "budget_swing_bytes), whichever is more; null where neither was seen.",
    )
    max_free_bytes: int | None = Field(
        None, description="What the maximum's deciding trial left free at its steady peak (more than spread_bytes)."
    )
    marginal: list[MarginalBatch] = Field(
        default_factory=list, description="Batches above the maximum that fit only inside the spread."
    )


class LengthEdgeInfo(Strict):
    """What the token search proved at one bucket length."""

    length: int = Field(description="The bucket length (input.shape[0]).")
    max_fitting_samples: int | None = Field(
        None,
        description="The largest sample count proven to fit at this length, by a trial at it or at a longer "
        "length (a batch fitting at L fits at every shorter length); null: none proven.",
    )
    first_failing_samples: int | None = Field(
        None,
        description="Set where this length's edge was searched: the smallest sample count that ran out of "
        "memory here (max_fitting_samples + 1). null: the length was ruled out as the binding one without its edge.",
    )
    budget_limit: int | None = Field(
        None,
        description="The largest token budget this length allows, length x first_failing_samples - 1; null "
        "where it was not needed (the length allows at least the budget).",
    )
    trials: int = Field(description="Trials run at this length.")


class TokenBudget(Strict):
    """search.unit tokens: the largest token budget per batch every bucket length fits, and the binding length."""

    unit: Literal["tokens"] = Field("tokens", description="The answer counts tokens: samples x padded length.")
    max_tokens: int | None = Field(
        None,
        description="The token budget T: at every bucket length L, floor(T / L) samples of length L fit; "
        "null when there is none (a trial was no memory verdict, or not one sample of some length fits).",
    )
    binding_length: int | None = Field(
        None,
        description="The bucket length whose limit is the budget (the worst bucket): at T + 1 tokens its "
        "batch would hold one more sample, which ran out of memory.",
    )
    binding_samples: int | None = Field(
        None,
        description="floor(max_tokens / binding_length): the binding bucket's batch at the budget, run at "
        "that length (its confirmation).",
    )
    recommended_tokens: int | None = Field(
        None,
        description="binding_length x recommended_batch_size: the recommendation (headroom, rounding, soak) "
        "applied to the binding bucket, so its batch under this budget is the soaked one.",
    )
    capped: bool = Field(
        False,
        description="True when every length fit search.max_batch_size samples: the cap binds, not memory "
        "(max_tokens is then the longest length x the cap).",
    )
    lengths: list[LengthEdgeInfo] = Field(description="Every bucket length, shortest first.")
    trials: int = Field(description="Trials the token search ran (recommendation and soak not counted).")


class AllocatorOutcome(Strict):
    setting: str = Field(description="The PYTORCH_CUDA_ALLOC_CONF value, or 'default'.")
    max_batch_size: int | None
    first_failing_batch_size: int | None
    stop_reason: str
    trials: int = Field(description="Trials this setting needed.")


class AllocatorComparison(Strict):
    """The edge under each allocator setting of the spec's ``allocators``."""

    applies: bool = Field(description="False on the CPU backend, where the CUDA allocator is not used.")
    outcomes: list[AllocatorOutcome] = Field(default_factory=list)
    best: str | None = Field(None, description="The setting with the largest maximum (the first listed on a tie).")
    note: str


class WorstBatch(Strict):
    """The samples the maximum's trials trained on: the max_batch_size longest of the dataset (ties by index)."""

    batch_size: int = Field(description="The batch: max_batch_size.")
    longest_length: float = Field(description="The length of its longest sample (what a padding collate pads to).")
    shortest_length: float | None = Field(
        None,
        description="The length of its shortest sample; null for a batch beyond the first 4096 of the order, "
        "whose lengths the environment check does not send back.",
    )
    first_indices: list[int] = Field(description="Its first (longest) dataset indices, up to 16.")


class DataInfo(Strict):
    """The dataset of the spec's data section, as the environment check measured it, and the worst batch."""

    samples: int = Field(description="len(dataset).")
    scanned: int = Field(description="Samples whose length was computed: all of them, or data.scan_limit of them.")
    sampled: bool = Field(
        description="True when the dataset is larger than data.scan_limit and the lengths are those of a seeded "
        "random sample (sample_seed): the worst batch is the worst of that sample, and a longer sample outside "
        "it is not seen."
    )
    sample_seed: int | None = Field(None, description="The sample's seed (when sampled).")
    length_min: float = Field(description="The shortest length among the scanned samples.")
    length_mean: float = Field(description="The mean length of the scanned samples.")
    length_max: float = Field(description="The longest length among the scanned samples.")
    scan_seconds: float = Field(description="How long computing the lengths took in the environment check.")
    worst_batch: WorstBatch | None = Field(None, description="The maximum's batch; null when there is no maximum.")
