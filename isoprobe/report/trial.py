"""One trial in the result: a child's run of one batch size, as the parent recorded it.

The evidence every answer is traced to. Its parts (the exception, the CUDA card at a failure,
what the step ran with, the measured sizes, a gang's ranks) are also what the child sends back
(``protocol.messages`` and the child build them), so they live here without the rest of the result.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from isoprobe.report.batch_check import BatchCheck
from isoprobe.report.cycle import CycleSeen
from isoprobe.report.outcomes import Outcome
from isoprobe.report.steady import SteadyRule
from isoprobe.report.strict import Strict


class CudaMemoryAtFailure(Strict):
    """The card's memory when a CUDA trial failed, before the failed step's tensors were freed."""

    free_bytes: int = Field(
        description="Free on the card (cudaMemGetInfo): what a library outside the allocator could still get."
    )
    total_bytes: int = Field(description="The card's total memory as CUDA reports it.")
    reserved_bytes: int = Field(description="Reserved by this process's caching allocator.")
    allocated_bytes: int = Field(description="Allocated to tensors by this process.")


class ErrorInfo(Strict):
    """The exception a trial raised (for error and out_of_memory outcomes); for a command's trial killed at its
    timeout, what its supervisor had seen (``CommandRankBehind``: the rank behind the others and its steps;
    ``CommandTimedOut``), with the command's last lines."""

    type: str = Field(description="Exception class, e.g. 'torch.OutOfMemoryError'.")
    message: str = Field(description="First 2000 characters of the exception message.")
    traceback_tail: str = Field("", description="Last lines of the traceback, for errors in the user's model.")
    cuda_memory: CudaMemoryAtFailure | None = Field(
        None,
        description="CUDA: the card as the failure left it, read for errors that may hide an allocation "
        "failure (the evidence where no budget allows a re-run).",
    )


class Applied(Strict):
    """What the trial's step really ran with, read back from torch in the child (not copied from the spec)."""

    mode: Literal["train", "inference"] | None = None
    precision: str | None = Field(None, description="The spec's training.precision.")
    weights_dtype: str | None = Field(
        None, description="dtype of the model's first parameter (bfloat16 under bf16-true)."
    )
    loss_dtype: str | None = Field(None, description="dtype of the loss the backward pass started from.")
    output_dtype: str | None = Field(
        None, description="dtype of the model's output (bfloat16 or float16 under autocast)."
    )
    grad_scaler: bool | None = Field(None, description="A GradScaler scaled the loss (fp16-mixed).")
    channels_last: bool | None = Field(None, description="The model's 4-d weights are in channels_last layout.")
    input_channels_last: bool | None = Field(None, description="The image batch is in channels_last layout.")
    # In spec.distributed's fsdp_wrap order: typing caches ``Literal[...] | None`` by value, so whichever of the
    # two is built first is the one both schemas show; the same order keeps them from depending on import order.
    checkpointing: Literal["blocks", "model"] | None = Field(
        None, description="Gradient checkpointing through the model's own switch, or by wrapping its blocks."
    )
    checkpointed_blocks: int | None = Field(None, description="How many blocks (or segments) recompute in backward.")
    compiled: bool | None = Field(None, description="The model ran through torch.compile.")
    cudnn_benchmark: bool | None = Field(None, description="torch.backends.cudnn.benchmark during the steps.")
    eval_pass: bool | None = Field(None, description="An evaluation pass ran after the training steps.")
    output_lifetime: Literal["through_backward", "freed_before_backward", "user_step"] | None = Field(
        None,
        description=(
            "How long the step kept the model's output: training.output_lifetime, or user_step when model.step "
            "ran instead of isoprobe's step (its code decides)."
        ),
    )
    input_lifetime: Literal["through_next_batch", "one_batch"] | None = Field(
        None, description="training.input_lifetime as the trial's own loop ran it (None: a framework's loop ran)."
    )


class Sizes(Strict):
    """What the child measured of the training state, after the first optimizer step."""

    parameter_bytes: int | None = None
    gradient_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    cuda_context_bytes: int | None = Field(
        None, description="CUDA: in use on the device but not held by torch's allocator."
    )
    reserved_unallocated_bytes: int | None = Field(None, description="CUDA: peak reserved minus peak allocated.")


class RankTrial(Strict):
    """One rank of a distributed trial (``spec.distributed``): its own outcome and readings."""

    rank: int
    outcome: Outcome = Field(description="This rank's own outcome, classified like a single trial's.")
    peak_bytes: int | None = Field(None, description="This rank's peak, in Trial.peak_bytes's units.")
    budget_peak_bytes: int | None = Field(None, description="This rank's peak in the budget's units.")
    base_bytes: int | None = None
    sizes: Sizes | None = Field(
        None, description="Parameters, gradients and optimizer state this rank holds: its shards under zero1 and fsdp."
    )
    exit_code: int | None = None
    stopped_by_gang: bool = Field(
        False, description="Killed by the supervisor because another rank failed first (its own outcome is moot)."
    )
    node: str | None = Field(
        None,
        description="The Slurm node this rank ran on (SLURMD_NODENAME), when the trial was a job step "
        "(distributed.launcher srun); null for a local gang, whose ranks all run on environment.hostname.",
    )


class Trial(Strict):
    """One child process (a gang of rank processes under ``spec.distributed``), one batch size."""

    index: int = Field(description="1-based order in which the trial ran.")
    batch_size: int
    purpose: Literal[
        "search", "retry", "confirmation", "long_run", "recommendation_check", "soak", "memory_check", "batch_check"
    ] = Field(
        description=(
            "search: a step of the edge search; retry: the same batch again after a crash or timeout; "
            "confirmation: the maximum run again before it is reported, until its peak is steady; "
            "long_run: below a maximum whose confirmation failed in the long run, a batch run until steady; "
            "recommendation_check: (results before issue 34 only) the recommended batch run once when soak_steps "
            "was 0, which now runs no trial; "
            "soak: the recommended batch run for recommendation.soak_steps steps; "
            "memory_check: the previous trial re-run with more memory, to tell an ambiguous library error "
            "from an allocation failure (its verdict never counts as 'fits'); "
            "batch_check: a command's batch at a quarter of a trial whose model's inputs did not show its batch, "
            "to compare the two (isoprobe.report.batch_check)."
        )
    )
    outcome: Outcome
    peak_bytes: int | None = Field(
        None,
        description=(
            "Peak memory compared with the capacity. CUDA: torch.cuda.max_memory_reserved. "
            "CPU: the child's peak resident set (VmHWM), imports included."
        ),
    )
    peak_allocated_bytes: int | None = Field(None, description="CUDA only: torch.cuda.max_memory_allocated.")
    budget_peak_bytes: int | None = Field(
        None,
        description=(
            "Peak of the memory the budget counts, which the search's memory line is fitted to and the margin is "
            "read from. CUDA: what the process holds on the card, context included: the allocator's need (the "
            "allocated peak plus the free space its used segments held, never above the reserved peak; under "
            "cudaMallocAsync the allocated peak), which does not move with the allocator's free-and-retry near its "
            "cap, plus the memory outside the allocator (context, libraries, lazily loaded kernels, NCCL), read "
            "after every step. CPU: the data segment that RLIMIT_DATA caps, estimated as VmPeak minus the address "
            "space that is not data."
        ),
    )
    alloc_retries: int | None = Field(
        None,
        description=(
            "CUDA, native allocator: how often an allocation found the cap or the card full, freed the allocator's "
            "cached segments and retried (torch.cuda.memory_stats' num_alloc_retries). Above 0 the reserved peak "
            "(peak_bytes) reached the cap whatever the batch needed, which is why budget_peak_bytes does not use it."
        ),
    )
    base_bytes: int | None = Field(
        None,
        description=(
            "Memory held after the steps with the batch's activations freed (weights, gradients, optimizer state, "
            "runtime), in the budget's units. CUDA: torch.cuda.memory_allocated plus the memory outside the "
            "allocator; CPU: the data segment. A command's trial: the worst rank's, right after its last judged "
            "step. With peak_bytes it gives one batch its own slope (the guided search's second trial)."
        ),
    )
    step_seconds: list[float] = Field(
        default_factory=list, description="Wall time of each completed training step; the first includes warm-up."
    )
    step_peak_bytes: list[int] = Field(
        default_factory=list,
        description=(
            "The peak so far after each completed step, in peak_bytes's units: it only rises, and where it keeps "
            "rising over the later steps, memory grows from step to step."
        ),
    )
    step_held_bytes: list[int] = Field(
        default_factory=list,
        description="Memory held right after each completed step (CUDA allocated, CPU resident).",
    )
    step_budget_peak_bytes: list[int] = Field(
        default_factory=list,
        description="The peak so far after each completed step in budget_peak_bytes's units: what the steady rule "
        "judges (a trial with steady_rule ran until it held still over the window, or to the cap).",
    )
    budget_swing_bytes: int | None = Field(
        None,
        description="A command trial on the CPU backend: the most one step's own peak (the data segment "
        "sampled between the end of the step before and the end of this one) rose above a later "
        "step's, in the worst rank (report.steady.swing_bytes). The same batch needing that much "
        "more at one step than at another can need it again at any step of a long run, so it "
        "widens the spread (edge_margin.observed_bytes) where no trial measured heap_churn_bytes, "
        "which bounds such a hold. Null: not measured.",
    )
    heap_churn_bytes: int | None = Field(
        None,
        description="CPU backend: the most glibc's heaps grew and gave back within one step after the first, "
        "in the trial's process (a gang's: its worst rank; a command's: any of its processes). "
        "Blocks freed within a step can stay held into the next one in some address-space layouts "
        "and not in others, so another run can need up to this much more than the trial read: the "
        "floor of one process or of a command (edge_margin.floor_bytes) is the most of it in the "
        "probe's fitting trials plus 1.5 MiB (a command's: 1 MiB; search.margin). Read by isoprobe's "
        "own trials after each step from malloc_info (the heaps' most less what they hold then: "
        "never below the step's own), by a command's trial from [heap] in /proc/PID/maps every "
        "4 ms. Null: not measured (CUDA, a single step, no glibc).",
    )
    steady_rule: SteadyRule | None = Field(
        None,
        description="Set for a trial that decides the maximum (confirmation, long_run): it kept stepping "
        "until its peak was steady or the cap; its outcome is still_rising where it never was.",
    )
    samples_per_second: float | None = Field(
        None,
        description=(
            "Throughput: batch size / median of the timed steps (every step but the first, which warms up; "
            "on CUDA the steps are synchronised). Null for trials that did not fit."
        ),
    )
    step_seconds_spread: float | None = Field(
        None, description="(slowest - fastest) / median of the timed steps: how noisy samples_per_second is."
    )
    compile_seconds: float | None = Field(
        None,
        description="training.compile: the first step's extra time over a later step's (tracing and compiling).",
    )
    eval_seconds: float | None = Field(None, description="training.eval_pass: wall time of the evaluation pass.")
    first_step_seconds: float | None = Field(
        None,
        description="A command's trial: wall time from the command's start to the end of its first optimizer "
        "step (the slowest rank's): the interpreter, its imports and the script's set-up, plus one step; what the "
        "trial pays before its first reading.",
    )
    started_ahead: bool | None = Field(
        None,
        description="A command's trial: true when the command's interpreter was started ahead of the trial "
        "(search.warm_start, a `python SCRIPT` or `python -m MODULE` command) and waited, having run nothing of the "
        "script's, until the trial was due; first_step_seconds then counts from the trial's start, not the "
        "interpreter's. false: started when the trial was due.",
    )
    cycle: CycleSeen | None = Field(
        None,
        description="A command's trial: what it saw of the script's cycle (evaluation passes, checkpoint "
        "writes, by step), and whether it waited for it (isoprobe.report.cycle).",
    )
    batch_check: BatchCheck | None = Field(
        None,
        description="A command's trial: what its model's training forwards showed of the batch it was asked "
        "for (isoprobe.report.batch_check). Null: not a command's trial, or no forward seen.",
    )
    busy_seconds: float | None = Field(
        None,
        ge=0,
        description="Seconds added to the trial's timeout because a busy node kept its processes from "
        "the CPU (they waited, runnable, at least half the time they wanted one): the timeout counts the time the "
        "trial could run, up to 8 times search.trial_timeout. Null: never starved at a deadline.",
    )
    busy_at_timeout: bool = Field(
        False,
        description="It timed out still starved, its extensions used up: the node was too busy to tell, and "
        "the timeout says nothing about the batch.",
    )
    applied: Applied | None = Field(None, description="What the step really ran with (trials that got that far).")
    sizes: Sizes | None = Field(
        None, description="Parameters, gradients and optimizer state, measured (trials that fit)."
    )
    allocator: str | None = Field(
        None, description="When comparing allocators: the setting this trial ran under ('default': torch's own)."
    )
    length: int | None = Field(
        None, description="With search.unit tokens: the bucket length this trial's samples had (input.shape[0])."
    )
    seconds: float = Field(
        description=(
            "Wall time of the trial: from the start of its process (cold), or from the moment a warm process "
            "received the request, to its end."
        )
    )
    warm_start: bool = Field(
        False, description="The process had imported torch before the request arrived (search.warm_start)."
    )
    forked: bool = Field(
        False,
        description="The process was forked from the probe's fork server, which had imported torch "
        "once for every trial (search.fork_server); it still ran alone, with its own memory, cap and device.",
    )
    phase: str | None = Field(
        None, description="Last phase the child reported: started, imported, model_built, step N, done."
    )
    error: ErrorInfo | None = None
    exit_code: int | None = Field(None, description="The child's exit status; negative means killed by a signal.")
    signal: str | None = Field(None, description="Name of the signal that killed the child, if any.")
    stderr_tail: str | None = Field(None, description="Last lines of the child's stderr, kept for failed trials.")
    reclassified: str | None = Field(
        None, description="Why the outcome differs from what the child reported, with the evidence."
    )
    ranks: list[RankTrial] | None = Field(
        None,
        description=(
            "A distributed trial's ranks. It fits only if every rank fits; its own readings above are those of "
            "the rank that decides it: the first that failed, else the one with the highest peak."
        ),
    )
    failed_rank: int | None = Field(
        None, description="The rank whose failure ended the trial (the others were killed at once); null if none."
    )
    command_ranks: int | None = Field(
        None,
        description="A command trial (spec.command): how many of the command's processes made optimizer steps "
        "(its ranks: torchrun's, accelerate launch's). Each had the budget; the readings above are the worst "
        "rank's. Null: not a command trial.",
    )
    gang_stop_seconds: float | None = Field(
        None, description="Seconds from seeing failed_rank's failure to every rank's processes being gone."
    )
    training_batch_size: int | None = Field(
        None,
        description="Set on an evaluation trial (training.eval_pass): the training batch whose steps ran "
        "first; batch_size is then the evaluation batch, and the outcome is the evaluation's. "
        "Null: a training trial.",
    )
