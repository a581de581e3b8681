"""What the trials tell besides the edge: the memory line, where the memory goes, throughput, the estimate.

Read from the trials that fit (``search.insights`` and ``pipeline.prediction`` fill them in);
none of it decides the maximum.
"""

from __future__ import annotations

from pydantic import Field

from isoprobe.report.strict import Strict


class MemoryModel(Strict):
    """Peak memory as a line over the batch size, fitted to the trials that fit: peak ≈ intercept + per_sample·batch."""

    intercept_bytes: float
    per_sample_bytes: float
    points: int = Field(
        description="Number of fitting batches the line was fitted to (1: the line from that batch's "
        "base reading to its peak)."
    )
    batch_sizes: list[int] = Field(
        default_factory=list,
        description="The batches the line went through, largest first, each at its highest peak: every fitting batch "
        "from half max_batch_size up; where that is the maximum alone, it and the batch below whose line "
        "to it is steepest (a small batch's reading can sit on a floor no batch sets, which only lifts "
        "it, and which small batches ran is the search's path). Empty in results written before it was "
        "recorded.",
    )


class ThroughputPoint(Strict):
    batch_size: int
    samples_per_second: float = Field(description="The best of the runs of this batch (confirmations run it twice).")
    step_seconds_spread: float | None = Field(None, description="Spread of the timed steps of that run.")


class Throughput(Strict):
    """Samples per second over the batches that fit: the maximum is not always the fastest."""

    points: list[ThroughputPoint] = Field(description="One per tested batch that fit, by batch size.")
    best_samples_per_second: float
    fastest_batch_size: int = Field(
        description="The smallest tested batch within `tolerance` of the best measured throughput."
    )
    tolerance: float = Field(
        description="recommendation.throughput_tolerance: the fraction of the best that counts as as fast."
    )
    note: str = Field(description="What the points are (and are not): tested batches only, timing noise.")


class MemoryBreakdown(Strict):
    """Where the memory goes: the four categories people learn, measured in the child and from the line."""

    parameter_bytes: int | None = Field(None, description="The model's parameters: count x element size.")
    gradient_bytes: int | None = Field(
        None, description="The gradients after a backward pass (same size as the trainable parameters)."
    )
    optimizer_state_bytes: int | None = Field(
        None, description="Tensors in the optimizer's state after its first step (Adam: two per parameter)."
    )
    activation_bytes_per_sample: float | None = Field(
        None,
        description="Slope of the peak over the batch size, from the memory line: what one more sample costs "
        "(with one batch measured, from its base reading to its peak: an upper bound).",
    )
    fixed_bytes: float | None = Field(
        None,
        description=(
            "Intercept of the line: what the peak would be at batch 0 (weights, gradients, optimizer state, "
            "runtime; on CPU also the imported libraries)."
        ),
    )
    cuda_context_bytes: int | None = Field(
        None, description="CUDA only: device memory in use that torch's allocator does not hold (context, libraries)."
    )
    reserved_unallocated_bytes: int | None = Field(
        None,
        description="CUDA only: reserved by the caching allocator but not allocated at the peak "
        "(fragmentation, cache).",
    )
    from_batch_size: int | None = Field(
        None, description="The trial the child-side numbers come from (the largest that fit)."
    )


class Prediction(Strict):
    """The memory estimate made before any trial (one traced step, ``isoprobe estimate``), next to the answer.

    Peak ~ ``fixed_bytes + per_sample_bytes * batch`` in the budget's units; the search started from it,
    and the trials proved the answer. Without an estimate (``note`` says why) the numbers are null.
    """

    fixed_bytes: int | None = Field(
        None,
        description="Parameters, gradients, optimizer state and buffers as traced; on the CPU backend plus "
        "the import baseline and the runtime a real stand-in step added.",
    )
    per_sample_bytes: float | None = Field(None, description="Activations per sample: the traced peak's slope.")
    predicted_max: int | None = Field(
        None, description="The largest batch whose predicted peak is within the capacity the search used."
    )
    error: float | None = Field(
        None, description="(predicted_max - max_batch_size) / max_batch_size: +0.1 predicted 10 % too many samples."
    )
    seconds: float | None = Field(None, description="How long the estimate took in the environment check.")
    note: str | None = Field(None, description="Why there is no estimate (skipped, or the trace failed).")
