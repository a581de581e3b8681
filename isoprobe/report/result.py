"""The result: the one JSON document ``isoprobe run`` prints, as a pydantic model.

This is the machine contract (``isoprobe schema`` publishes its JSON Schema)
and the only source of every human view. Every trial is in it, so each answer
can be traced to the trial that decided it.

The root ``Result`` lives here with what ties the document together (its version, its size
limit, the exit code a stop reason gives, the cache entry); its parts live by what they
describe: ``trial`` (the trials), ``device`` (where they ran), ``edge`` (how sure the maximum
is), ``insights`` (memory, throughput, the estimate) and ``recommendation`` (the batch to run,
the accumulation plan). Every name is re-exported here, so ``report.result`` still serves them all.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from isoprobe.errors import ExitCode
from isoprobe.report.device import AllocatorInfo, DeviceInfo, DistributedInfo, GpuFacts, RunEnvironment
from isoprobe.report.edge import (
    AllocatorComparison,
    AllocatorOutcome,
    DataInfo,
    EdgeMargin,
    LengthEdgeInfo,
    MarginalBatch,
    TokenBudget,
    WorstBatch,
)
from isoprobe.report.insights import MemoryBreakdown, MemoryModel, Prediction, Throughput, ThroughputPoint
from isoprobe.report.outcomes import MEANINGS, Outcome, StopReason
from isoprobe.report.recommendation import AccumulationPlan, Recommendation, Soak
from isoprobe.report.strict import Strict
from isoprobe.report.trial import Applied, CudaMemoryAtFailure, ErrorInfo, RankTrial, Sizes, Trial
from isoprobe.spec.model import Spec

#: This module's names and those re-exported from the modules that hold them, in one sorted list.
__all__ = [
    "MAX_RESULT_BYTES",
    "SCHEMA_VERSION",
    "AccumulationPlan",
    "AllocatorComparison",
    "AllocatorInfo",
    "AllocatorOutcome",
    "Applied",
    "CacheInfo",
    "CudaMemoryAtFailure",
    "DataInfo",
    "DeviceInfo",
    "DistributedInfo",
    "EdgeMargin",
    "ErrorInfo",
    "GpuFacts",
    "LengthEdgeInfo",
    "MarginalBatch",
    "MemoryBreakdown",
    "MemoryModel",
    "Outcome",
    "Prediction",
    "RankTrial",
    "Recommendation",
    "Result",
    "RunEnvironment",
    "Sizes",
    "Soak",
    "StopReason",
    "Throughput",
    "ThroughputPoint",
    "TokenBudget",
    "Trial",
    "WorstBatch",
    "exit_code_for",
]

SCHEMA_VERSION: Final = 1

#: A result is a few kB per trial; far more is not a result (and is never read whole into memory).
MAX_RESULT_BYTES = 64 << 20


#: The stops a trial's outcome leads to take their exit code from the outcome's declaration
#: (``report.outcomes.MEANINGS``: error, crashed, timed out and still rising 4, out of memory at the start 3);
#: the others are the search's answers and the command's own stops.
_EXIT_CODES = {
    StopReason.EDGE_FOUND: ExitCode.ANSWERED,
    StopReason.CAPPED: ExitCode.ANSWERED,
    **{meaning.stop: meaning.exit_code for meaning in MEANINGS.values() if meaning.stop is not None},
    StopReason.INTERRUPTED: ExitCode.INTERRUPTED,
    StopReason.TERMINATED: ExitCode.TERMINATED,
    StopReason.BAD_SPEC: ExitCode.BAD_SPEC,
    StopReason.INTERNAL_ERROR: ExitCode.INTERNAL,
}


def exit_code_for(stop_reason: StopReason) -> ExitCode:
    return _EXIT_CODES[stop_reason]


class CacheInfo(Strict):
    """Where this result is kept, and whether it came from there instead of from trials."""

    hit: bool = Field(description="True when the answer was read from the cache: no trial ran in this invocation.")
    key: str = Field(description="SHA-256 of everything that changes the answer (spec, device, versions, allocator).")
    path: str = Field(description="The cache entry's file.")
    stored_at: str | None = Field(None, description="When the entry was written (UTC, ISO 8601).")


class Result(Strict):
    """What ``isoprobe run`` found, with every trial as evidence.

    Every stop of the command prints one: an answer, and also a stop without one (``answered`` false,
    ``stop_reason`` and ``message`` say why, ``trials`` holds those run so far), a bad spec and an error
    raised outside the trials included (``report.stop``).
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    isoprobe_version: str
    python_version: str
    torch_version: str | None = None
    torchvision_version: str | None = None
    spec_path: str
    spec: Spec | None = Field(
        description="The spec as validated, command-line overrides applied. Null only for "
        "a stop before the spec was valid: bad_spec (message says what is wrong with it), or "
        "a bug or a signal while it was read."
    )
    device: DeviceInfo | None = None
    allocator: AllocatorInfo | None = Field(
        description="The allocator configuration the trials ran with. Null for a stop the command reported before "
        "or outside the probe (bad_spec, error or internal_error raised out of it, a signal before the environment "
        "check): no trial conditions were set."
    )
    job_environment: dict[str, str] = Field(
        default_factory=dict,
        description="Variables every trial ran with that change how much memory a step needs: the answer holds in "
        "a job that runs with the same (--format env and taskprolog export them; the table shows them). CPU "
        "backend: MALLOC_MMAP_THRESHOLD_=131072 (every tensor of 128 KiB or more mmapped and given back exactly; "
        "left to glibc, 20-30 MB tensors land in the heap and fragment it). CUDA: the allocator setting the "
        "trials ran with (PYTORCH_CUDA_ALLOC_CONF), where the spec or the environment set one.",
    )
    answered: bool = Field(description="True when max_batch_size is a proven answer (exit code 0).")
    max_batch_size: int | None = Field(
        None,
        description="Largest batch that fit. Always a batch that was run successfully; null if none did. With "
        "the steady rule, its deciding trial's steady peak also left more than the spread free "
        "(edge_margin): batches that fit closer to the capacity are edge_margin.marginal.",
    )
    first_failing_batch_size: int | None = Field(
        None,
        description="Smallest batch above max_batch_size that ran out of memory; null if none was tried. "
        "Batches between the two fit only inside the spread (edge_margin.marginal).",
    )
    short_max_batch_size: int | None = Field(
        None,
        description="Set when the maximum the search's short trials found did not hold in the long run (its "
        "confirmation, stepping until its peak was steady, ran out of memory at a later step or "
        "was still rising at search.steady_steps): that batch. max_batch_size is then the largest "
        "batch proven steady below it (trials of purpose long_run); null: the maximum held.",
    )
    edge_margin: EdgeMargin | None = Field(
        None,
        description="The spread rule as applied to the maximum; null when it does not apply "
        "(search.steady_steps 0, search.edge_spread 0, or no maximum).",
    )
    max_steady: bool = Field(
        False,
        description="True when a trial of max_batch_size stepped until its peak was steady and fit (the "
        "trial that decided it: the first to fit there when it was run as the batch right below the smallest "
        "failure, else a run after a shorter one; or a long_run trial), clearing the spread where edge_margin "
        "applies. False with search.steady_steps 0: the maximum fit trials of search.steps steps only.",
    )
    max_cycle: str | None = Field(
        None,
        description="A command probe: what the trial that decided max_batch_size saw of the script's cycle "
        "(isoprobe.report.cycle): 'evaluation seen at step 25 (...)', or 'no evaluation pass within 60 steps: the "
        "answer covers training steps only; set search.cycle_steps ...'. The trial's own record is trials[].cycle. "
        "Null: not a command probe, or no maximum.",
    )
    max_confirmed: bool = Field(
        False,
        description="True when max_batch_size ran in more than one fresh process and fit every time "
        "(search.confirmations after the trial that decided it, or a short trial before it). False when one "
        "process proved it: the spread rule (edge_margin) covers how far another process may move.",
    )
    first_failing_outcome: Outcome | None = Field(
        None,
        description=(
            "How first_failing_batch_size failed: out_of_memory, or crashed / timed_out when that persisted "
            "over every retry (then the edge is where trials stop running, not proven to be memory)."
        ),
    )
    flaky_batch_sizes: list[int] = Field(
        default_factory=list,
        description="Batches that both fit and failed across their runs; none of them is ever reported as fitting.",
    )
    eval_max_batch_size: int | None = Field(
        None,
        description="training.eval_pass: the largest evaluation batch that fit after the training steps at "
        "eval_training_batch_size, proven by its own trials (those with training_batch_size set). "
        "Null without eval_pass, or when no evaluation batch fit (eval_stop_reason says why).",
    )
    eval_first_failing_batch_size: int | None = Field(
        None,
        description="training.eval_pass: the smallest evaluation batch above eval_max_batch_size that ran out "
        "of memory (null: none tried, or capped).",
    )
    eval_training_batch_size: int | None = Field(
        None,
        description="training.eval_pass: the training batch whose steps ran before each evaluation trial (the "
        "recommended batch, else the maximum): evaluation as a job runs it, with the training "
        "state held.",
    )
    eval_stop_reason: StopReason | None = Field(
        None,
        description="training.eval_pass: how the evaluation search ended (edge_found, capped, "
        "start_does_not_fit, ...); null when it did not run (no eval_pass, or no training answer).",
    )
    edge_flaky: bool = Field(
        False, description="True when a batch at or above the reported maximum fit in some run and failed in another."
    )
    limited_by: Literal["max_batch_size", "dataset_size", "search_ceiling"] | None = Field(
        None, description="Why no larger batch was tried, when the search stopped at a cap rather than at memory."
    )
    recommended_batch_size: int | None = Field(
        None,
        description="A batch at or below max_batch_size with the headroom and rounding applied; it survived its "
        "soak (recommendation.soaked), or, with recommendation.soak_steps 0, was not run for it.",
    )
    recommendation: Recommendation | None = None
    throughput: Throughput | None = Field(None, description="Samples per second over the batches that fit.")
    memory_breakdown: MemoryBreakdown | None = Field(
        None, description="Parameters, gradients, optimizer state, activations."
    )
    prediction: Prediction | None = Field(None, description="The estimate before any trial, and how far off it was.")
    allocator_comparison: AllocatorComparison | None = Field(
        None, description="The maximum under each of the spec's allocators, when it lists several."
    )
    accumulation: AccumulationPlan | None = Field(
        None, description="Micro-batch and accumulation steps for plan.target_global_batch, when the spec sets it."
    )
    distributed: DistributedInfo | None = Field(
        None, description="Set when the spec has a distributed strategy: the batches are per rank."
    )
    data: DataInfo | None = Field(
        None, description="Set when the spec has a data section: the dataset's lengths and the worst batch's samples."
    )
    tokens: TokenBudget | None = Field(
        None,
        description="Set with search.unit tokens: the token budget, the binding bucket length and every "
        "length's edge. max_batch_size, recommended_batch_size and the trials' edge are then the binding length's.",
    )
    environment: RunEnvironment | None = Field(None, description="Host, Slurm job and GPUs of this invocation.")
    cache: CacheInfo | None = Field(None, description="The result cache's entry; null with --no-cache.")
    sources: dict[str, str] | None = Field(
        None,
        description=(
            "The user's source files the environment check and the trials imported (every module outside the "
            "standard library, site-packages and isoprobe) or opened for reading there (a config file the "
            "factory reads, a file native code read where isoprobe could see it), as path -> SHA-256: a file by its "
            "real path, and a path read through a symbolic link also as opened, its digest taken with where it "
            "leads. A cached answer is used only while every one of them is unchanged. Null where not recorded."
        ),
    )
    stop_reason: StopReason = Field(
        description="Why the probe ended, which decides the exit code: edge_found and capped 0; start_does_not_fit "
        "3; error, crashed, timed_out and still_rising 4 (error also when the probe itself could not go on: the "
        "environment check failed, the system refused a trial's files, Slurm lost a node's step daemon); bad_spec "
        "2 (no probe ran); internal_error 1 (a bug in isoprobe); interrupted 130 (SIGINT); terminated 143 (SIGTERM)."
    )
    message: str = Field(description="One sentence for people: the answer, or why there is none.")
    suggestions: list[str] = Field(default_factory=list, description="What to try when the answer is not usable.")
    trials: list[Trial] = Field(
        description="Every trial run, in order; for a stop without an answer, those run "
        "before it (none for a stop before the first trial)."
    )
    total_seconds: float
