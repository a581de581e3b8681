"""The result: the one JSON document ``isoprobe run`` prints, as a pydantic model.

This is the machine contract (``isoprobe schema`` publishes its JSON Schema)
and the only source of every human view. Every trial is in it, so each answer
can be traced to the trial that decided it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from isoprobe.errors import ExitCode
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.spec.model import Spec
from isoprobe.report.steady import SteadyRule

SCHEMA_VERSION = 1

#: A result is a few kB per trial; far more is not a result (and is never read whole into memory).
MAX_RESULT_BYTES = 64 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_EXIT_CODES = {
    StopReason.EDGE_FOUND: ExitCode.ANSWERED,
    StopReason.CAPPED: ExitCode.ANSWERED,
    StopReason.START_DOES_NOT_FIT: ExitCode.START_DOES_NOT_FIT,
    StopReason.ERROR: ExitCode.NO_ANSWER,
    StopReason.CRASHED: ExitCode.NO_ANSWER,
    StopReason.TIMED_OUT: ExitCode.NO_ANSWER,
    StopReason.STILL_RISING: ExitCode.NO_ANSWER,
    StopReason.INTERRUPTED: ExitCode.INTERRUPTED,
    StopReason.TERMINATED: ExitCode.TERMINATED,
}


def exit_code_for(stop_reason: StopReason) -> ExitCode:
    return _EXIT_CODES[stop_reason]


class CudaMemoryAtFailure(_Strict):
    """The card's memory when a CUDA trial failed, before the failed step's tensors were freed."""

    free_bytes: int = Field(description="Free on the card (cudaMemGetInfo): what a library outside the allocator "
                            "could still get.")
    total_bytes: int = Field(description="The card's total memory as CUDA reports it.")
    reserved_bytes: int = Field(description="Reserved by this process's caching allocator.")
    allocated_bytes: int = Field(description="Allocated to tensors by this process.")


class ErrorInfo(_Strict):
    """The exception a trial raised (for error and out_of_memory outcomes)."""

    type: str = Field(description="Exception class, e.g. 'torch.OutOfMemoryError'.")
    message: str = Field(description="First 2000 characters of the exception message.")
    traceback_tail: str = Field("", description="Last lines of the traceback, for errors in the user's model.")
    cuda_memory: CudaMemoryAtFailure | None = Field(
        None, description="CUDA: the card as the failure left it, read for errors that may hide an allocation "
        "failure (the evidence where no budget allows a re-run).")


class Applied(_Strict):
    """What the trial's step really ran with, read back from torch in the child (not copied from the spec)."""

    mode: Literal["train", "inference"] | None = None
    precision: str | None = Field(None, description="The spec's training.precision.")
    weights_dtype: str | None = Field(None, description="dtype of the model's first parameter (bfloat16 under bf16-true).")
    loss_dtype: str | None = Field(None, description="dtype of the loss the backward pass started from.")
    output_dtype: str | None = Field(None, description="dtype of the model's output (bfloat16 or float16 under autocast).")
    grad_scaler: bool | None = Field(None, description="A GradScaler scaled the loss (fp16-mixed).")
    channels_last: bool | None = Field(None, description="The model's 4-d weights are in channels_last layout.")
    input_channels_last: bool | None = Field(None, description="The image batch is in channels_last layout.")
    checkpointing: Literal["model", "blocks"] | None = Field(
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
        None, description="training.input_lifetime as the trial's own loop ran it (None: a framework's loop ran).")


class Sizes(_Strict):
    """What the child measured of the training state, after the first optimizer step."""

    parameter_bytes: int | None = None
    gradient_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    cuda_context_bytes: int | None = Field(None, description="CUDA: in use on the device but not held by torch's allocator.")
    reserved_unallocated_bytes: int | None = Field(None, description="CUDA: peak reserved minus peak allocated.")


class RankTrial(_Strict):
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
        None, description="The Slurm node this rank ran on (SLURMD_NODENAME), when the trial was a job step "
        "(distributed.launcher srun); null for a local gang, whose ranks all run on environment.hostname."
    )


class Trial(_Strict):
    """One child process (a gang of rank processes under ``spec.distributed``), one batch size."""

    index: int = Field(description="1-based order in which the trial ran.")
    batch_size: int
    purpose: Literal["search", "retry", "confirmation", "long_run", "recommendation_check", "soak",
                     "memory_check"] = Field(
        description=(
            "search: a step of the edge search; retry: the same batch again after a crash or timeout; "
            "confirmation: the maximum run again before it is reported, until its peak is steady; "
            "long_run: below a maximum whose confirmation failed in the long run, a batch run until steady; "
            "recommendation_check: (results before issue 34 only) the recommended batch run once when soak_steps "
            "was 0, which now runs no trial; "
            "soak: the recommended batch run for recommendation.soak_steps steps; "
            "memory_check: the previous trial re-run with more memory, to tell an ambiguous library error "
            "from an allocation failure (its verdict never counts as 'fits')."
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
            "runtime). CUDA: torch.cuda.memory_allocated; CPU: the data segment."
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
        None, description="A command trial on the CPU backend: the most one step's own peak (the data segment "
                          "sampled between the end of the step before and the end of this one) rose above a later "
                          "step's, in the worst rank (report.steady.swing_bytes). The same batch needing that much "
                          "more at one step than at another can need it again at any step of a long run, so it "
                          "widens the spread (edge_margin.observed_bytes) where no trial measured heap_churn_bytes, "
                          "which bounds such a hold. Null: not measured.")
    heap_churn_bytes: int | None = Field(
        None, description="CPU backend: the most glibc's heaps grew and gave back within one step after the first, "
                          "in the trial's process (a gang's: its worst rank; a command's: any of its processes). "
                          "Blocks freed within a step can stay held into the next one in some address-space layouts "
                          "and not in others, so another run can need up to this much more than the trial read: the "
                          "floor of one process or of a command (edge_margin.floor_bytes) is the most of it in the "
                          "probe's fitting trials plus 1.5 MiB (a command's: 1 MiB; search.margin). Read by isoprobe's "
                          "own trials after each step from malloc_info (the heaps' most less what they hold then: "
                          "never below the step's own), by a command's trial from [heap] in /proc/PID/maps every "
                          "4 ms. Null: not measured (CUDA, a single step, no glibc).")
    steady_rule: SteadyRule | None = Field(
        None, description="Set for a trial that decides the maximum (confirmation, long_run): it kept stepping "
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
    applied: Applied | None = Field(None, description="What the step really ran with (trials that got that far).")
    sizes: Sizes | None = Field(None, description="Parameters, gradients and optimizer state, measured (trials that fit).")
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
        False, description="The process was forked from the probe's fork server, which had imported torch "
        "once for every trial (search.fork_server); it still ran alone, with its own memory, cap and device."
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
        None, description="A command trial (spec.command): how many of the command's processes made optimizer steps "
        "(its ranks: torchrun's, accelerate launch's). Each had the budget; the readings above are the worst "
        "rank's. Null: not a command trial.")
    gang_stop_seconds: float | None = Field(
        None, description="Seconds from seeing failed_rank's failure to every rank's processes being gone."
    )
    training_batch_size: int | None = Field(
        None, description="Set on an evaluation trial (training.eval_pass): the training batch whose steps ran "
                          "first; batch_size is then the evaluation batch, and the outcome is the evaluation's. "
                          "Null: a training trial.")


class DeviceInfo(_Strict):
    """Where the trials ran, and the memory they were allowed."""

    backend: Literal["cpu", "cuda"]
    requested: str = Field(description="The spec's device (auto, cpu, cuda, cuda:N) after command-line overrides.")
    name: str = Field(description="GPU name, or the CPU model for the CPU backend.")
    index: int | None = Field(None, description="CUDA device index within CUDA_VISIBLE_DEVICES.")
    total_memory_bytes: int = Field(description="GPU memory, or the machine's RAM on the CPU backend.")
    memory_budget_bytes: int | None = Field(None, description="The cap applied to each trial, if any.")
    budget_source: Literal["spec", "command line", "default"] | None = None
    capacity_bytes: int = Field(description="What the peaks are compared with: the budget if set, else total memory.")
    import_baseline_bytes: int | None = Field(
        None,
        description=(
            "CPU: memory the child holds after importing torch and building nothing (data segment), "
            "which is part of the budget."
        ),
    )
    note: str | None = Field(None, description="How this device was chosen, when it was not asked for explicitly.")


class AllocatorInfo(_Strict):
    """The allocator configuration every trial ran with."""

    value: str | None = Field(description="The PYTORCH_CUDA_ALLOC_CONF string, or null for torch's default.")
    source: Literal["spec", "environment", "none"]
    variables: list[str] = Field(description="Environment variables set to this value in each child.")
    applies: bool = Field(description="False on the CPU backend, where the CUDA allocator is not used.")


class MemoryModel(_Strict):
    """Peak memory as a line over the batch size, fitted to the trials that fit: peak ≈ intercept + per_sample·batch."""

    intercept_bytes: float
    per_sample_bytes: float
    points: int = Field(description="Number of fitting trials the line was fitted to.")


class ThroughputPoint(_Strict):
    batch_size: int
    samples_per_second: float = Field(description="The best of the runs of this batch (confirmations run it twice).")
    step_seconds_spread: float | None = Field(None, description="Spread of the timed steps of that run.")


class Throughput(_Strict):
    """Samples per second over the batches that fit: the maximum is not always the fastest."""

    points: list[ThroughputPoint] = Field(description="One per tested batch that fit, by batch size.")
    best_samples_per_second: float
    fastest_batch_size: int = Field(
        description="The smallest tested batch within `tolerance` of the best measured throughput."
    )
    tolerance: float = Field(description="recommendation.throughput_tolerance: the fraction of the best that counts as as fast.")
    note: str = Field(description="What the points are (and are not): tested batches only, timing noise.")


class MemoryBreakdown(_Strict):
    """Where the memory goes: the four categories people learn, measured in the child and from the line."""

    parameter_bytes: int | None = Field(None, description="The model's parameters: count x element size.")
    gradient_bytes: int | None = Field(None, description="The gradients after a backward pass (same size as the trainable parameters).")
    optimizer_state_bytes: int | None = Field(
        None, description="Tensors in the optimizer's state after its first step (Adam: two per parameter)."
    )
    activation_bytes_per_sample: float | None = Field(
        None, description="Slope of the peak over the batch size, from the memory line: what one more sample costs "
        "(with one batch measured, from its base reading to its peak: an upper bound)."
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
        None, description="CUDA only: reserved by the caching allocator but not allocated at the peak (fragmentation, cache)."
    )
    from_batch_size: int | None = Field(None, description="The trial the child-side numbers come from (the largest that fit).")


class AllocatorOutcome(_Strict):
    setting: str = Field(description="The PYTORCH_CUDA_ALLOC_CONF value, or 'default'.")
    max_batch_size: int | None
    first_failing_batch_size: int | None
    stop_reason: str
    trials: int = Field(description="Trials this setting needed.")


class AllocatorComparison(_Strict):
    """The edge under each allocator setting of the spec's ``allocators``."""

    applies: bool = Field(description="False on the CPU backend, where the CUDA allocator is not used.")
    outcomes: list[AllocatorOutcome] = Field(default_factory=list)
    best: str | None = Field(None, description="The setting with the largest maximum (the first listed on a tie).")
    note: str


class AccumulationPlan(_Strict):
    """How to reach plan.target_global_batch: micro-batch x accumulation steps x data-parallel ranks."""

    target_global_batch: int
    world_size: int
    world_size_source: str = Field(description="spec, or the environment variable it came from (WORLD_SIZE, SLURM_NTASKS), or distributed.world_size (the probe's gang), or default.")
    micro_batch_size: int = Field(description="Per rank and step; at most the recommended batch.")
    accumulation_steps: int
    global_batch_size: int = Field(description="micro_batch_size x accumulation_steps x world_size.")
    difference: int = Field(description="global_batch_size - target_global_batch; 0 when the target is reached exactly.")
    note: str


class Soak(_Strict):
    """One run of a recommended batch for recommendation.soak_steps steps in a fresh process."""

    batch_size: int
    trial: int = Field(description="The trial that ran it (its step_budget_peak_bytes show the peak after each step, "
                                   "in the capacity's units: what the soak judged).")
    outcome: Outcome
    steps_completed: int
    growth_bytes_per_step: float | None = Field(
        None, description="How fast the peak still rose per step after the warm-up (a third of the steps); null "
                          "with fewer than three steps."
    )
    still_rising: bool = Field(description="The peak rose over the last third of the steps by more than noise.")
    projected_peak_bytes: int | None = Field(
        None, description="The last step's peak plus the growth over the steps it did not reach."
    )
    survived: bool = Field(
        description="It ran every step and fit, and its peak was not still rising above target_peak_bytes."
    )


class MarginalBatch(_Strict):
    """A batch above the maximum that fit, but inside the spread: a coin toss in a long run, not the maximum."""

    batch_size: int
    runs: int = Field(description="Trials of this batch that ran until steady; where none did, its trials of "
                                  "search.steps steps, whose peak already left no more than the spread free (a "
                                  "long run's peak only rises, so none ran until steady).")
    fitted: int = Field(description="How many of those fit.")
    free_bytes: int = Field(description="The least memory a fitting one's peak left free below capacity_bytes: at "
                                        "most spread_bytes.")


class EdgeMargin(_Strict):
    """The spread rule (docs/steady-state.md): the maximum's steady peak leaves more than the spread free."""

    capacity_bytes: int = Field(description="The capacity the free memory is measured below (per rank in a gang).")
    spread_bytes: int = Field(
        description="How far a long run's peak may move between fresh processes and over steps: the larger of "
                    "floor_bytes and observed_bytes. A deciding trial fits as the maximum only with more free.")
    floor_bytes: int = Field(description="The backend's measured floor for this capacity (on the CPU, for one "
                                         "process or a command: from its trials' heap churn, "
                                         "Trial.heap_churn_bytes), or search.edge_spread.")
    observed_bytes: int | None = Field(
        None, description="The most two fresh runs of one batch in this probe differed in their peak after the same "
                          "step, or one step's peak rose above a later one's within a trial (trials' "
                          "budget_swing_bytes), whichever is more; null where neither was seen.")
    max_free_bytes: int | None = Field(
        None, description="What the maximum's deciding trial left free at its steady peak (more than spread_bytes).")
    marginal: list[MarginalBatch] = Field(
        default_factory=list, description="Batches above the maximum that fit only inside the spread.")


class Recommendation(_Strict):
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
        None, description="Peak of the trial that ran the recommended batch, in capacity_bytes's units.")
    soak_steps: int = Field(0, description="Steps each soak ran (recommendation.soak_steps as applied; 0: none ran).")
    soaked: bool = Field(
        False, description="True when the recommended batch survived a soak of soak_steps steps (soaks[-1]). False "
        "with recommendation.soak_steps 0: no trial ran for the recommendation, and measured_peak_bytes is a search "
        "trial's at that batch, or null where none ran it (the batch is at or below max_batch_size, which fit).")
    soaks: list[Soak] = Field(
        default_factory=list,
        description="Every soak, in order: a batch that did not survive moved the recommendation down to the next.",
    )
    proven_by_trial: int | None = Field(
        None, description="The trial whose long run proves the recommended batch without a soak of its own "
        "(recommendation.soak_steps null): the maximum's deciding trial, which stepped until its peak was steady "
        "at a larger batch, with the line plus its growth over steps within target_peak_bytes. Null where a soak "
        "ran, or none was asked (soak_steps 0).")
    note: str = Field(description="How the number was derived, in words.")


class GpuFacts(_Strict):
    """One GPU as NVML (the driver) describes it, read without creating a CUDA context."""

    nvml_index: int = Field(description="The driver's index (nvidia-smi's), which CUDA_VISIBLE_DEVICES refers to.")
    uuid: str
    name: str
    total_memory_bytes: int
    driver_version: str | None = None


class RunEnvironment(_Strict):
    """Where and for which job this run happened: the scheduler's facts, not part of the answer."""

    hostname: str
    slurm_job_id: str | None = Field(None, description="SLURM_JOB_ID (with SLURM_ARRAY_JOB_ID/TASK_ID for arrays).")
    slurm_array_task_id: str | None = None
    slurm_node: str | None = Field(None, description="SLURMD_NODENAME, else SLURM_NODELIST.")
    cuda_visible_devices: str | None = Field(
        None, description="The GPUs the trials may use, as CUDA_VISIBLE_DEVICES gives them to the children."
    )
    visible_devices_source: Literal["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "none"] = Field(
        "none", description="Where cuda_visible_devices came from: Slurm's GPU variables count when CUDA's is unset."
    )
    slurm_step_gpus: str | None = None
    slurm_job_gpus: str | None = None
    gpus: list[GpuFacts] | None = Field(
        None, description="The visible GPUs in CUDA's order, from NVML; null where NVML is not available."
    )


class DistributedInfo(_Strict):
    """The strategy the trials ran, as gangs of ranks: every batch in this result is per rank."""

    strategy: Literal["ddp", "zero1", "fsdp"]
    world_size: int = Field(description="Ranks in each trial's gang.")
    world_size_source: str = Field(
        description="spec, the environment variable it came from, 'visible GPUs' or 'cpu default'."
    )
    backend: Literal["gloo", "nccl"] = Field(description="The collectives' backend: nccl on CUDA, gloo on the CPU.")
    threads_per_rank: int | None = Field(
        None, description="The CPU threads (OMP_NUM_THREADS) each rank ran with, as torchrun would start it "
        "(distributed.threads_per_rank); null: the ranks kept the environment's setting, unreadable here."
    )
    per_rank: Literal[True] = Field(
        True, description="max_batch_size, recommended_batch_size and every trial's batch are per-rank micro-batches."
    )
    launcher: Literal["local", "srun"] = Field(
        "local", description="How each trial's ranks were started: local child processes on this node, or one "
        "Slurm job step per trial over the allocation (distributed.launcher, resolved)."
    )
    nodes: list[str] = Field(
        default_factory=list, description="srun: the nodes the trials' ranks ran on, in rank order of first "
        "appearance (each rank's own is trials[].ranks[].node); empty for a local gang."
    )


class LengthEdgeInfo(_Strict):
    """What the token search proved at one bucket length."""

    length: int = Field(description="The bucket length (input.shape[0]).")
    max_fitting_samples: int | None = Field(
        None, description="The largest sample count proven to fit at this length, by a trial at it or at a longer "
        "length (a batch fitting at L fits at every shorter length); null: none proven.")
    first_failing_samples: int | None = Field(
        None, description="Set where this length's edge was searched: the smallest sample count that ran out of "
        "memory here (max_fitting_samples + 1). null: the length was ruled out as the binding one without its edge.")
    budget_limit: int | None = Field(
        None, description="The largest token budget this length allows, length x first_failing_samples - 1; null "
        "where it was not needed (the length allows at least the budget).")
    trials: int = Field(description="Trials run at this length.")


class TokenBudget(_Strict):
    """search.unit tokens: the largest token budget per batch every bucket length fits, and the binding length."""

    unit: Literal["tokens"] = Field("tokens", description="The answer counts tokens: samples x padded length.")
    max_tokens: int | None = Field(
        None, description="The token budget T: at every bucket length L, floor(T / L) samples of length L fit; "
        "null when there is none (a trial was no memory verdict, or not one sample of some length fits).")
    binding_length: int | None = Field(
        None, description="The bucket length whose limit is the budget (the worst bucket): at T + 1 tokens its "
        "batch would hold one more sample, which ran out of memory.")
    binding_samples: int | None = Field(
        None, description="floor(max_tokens / binding_length): the binding bucket's batch at the budget, run at "
        "that length (its confirmation).")
    recommended_tokens: int | None = Field(
        None, description="binding_length x recommended_batch_size: the recommendation (headroom, rounding, soak) "
        "applied to the binding bucket, so its batch under this budget is the soaked one.")
    capped: bool = Field(
        False, description="True when every length fit search.max_batch_size samples: the cap binds, not memory "
        "(max_tokens is then the longest length x the cap).")
    lengths: list[LengthEdgeInfo] = Field(description="Every bucket length, shortest first.")
    trials: int = Field(description="Trials the token search ran (recommendation and soak not counted).")


class WorstBatch(_Strict):
    """The samples the maximum's trials trained on: the max_batch_size longest of the dataset (ties by index)."""

    batch_size: int = Field(description="The batch: max_batch_size.")
    longest_length: float = Field(description="The length of its longest sample (what a padding collate pads to).")
    shortest_length: float | None = Field(
        None, description="The length of its shortest sample; null for a batch beyond the first 4096 of the order, "
        "whose lengths the environment check does not send back.")
    first_indices: list[int] = Field(description="Its first (longest) dataset indices, up to 16.")


class DataInfo(_Strict):
    """The dataset of the spec's data section, as the environment check measured it, and the worst batch."""

    samples: int = Field(description="len(dataset).")
    scanned: int = Field(description="Samples whose length was computed: all of them, or data.scan_limit of them.")
    sampled: bool = Field(
        description="True when the dataset is larger than data.scan_limit and the lengths are those of a seeded "
        "random sample (sample_seed): the worst batch is the worst of that sample, and a longer sample outside "
        "it is not seen.")
    sample_seed: int | None = Field(None, description="The sample's seed (when sampled).")
    length_min: float = Field(description="The shortest length among the scanned samples.")
    length_mean: float = Field(description="The mean length of the scanned samples.")
    length_max: float = Field(description="The longest length among the scanned samples.")
    scan_seconds: float = Field(description="How long computing the lengths took in the environment check.")
    worst_batch: WorstBatch | None = Field(None, description="The maximum's batch; null when there is no maximum.")


class CacheInfo(_Strict):
    """Where this result is kept, and whether it came from there instead of from trials."""

    hit: bool = Field(description="True when the answer was read from the cache: no trial ran in this invocation.")
    key: str = Field(description="SHA-256 of everything that changes the answer (spec, device, versions, allocator).")
    path: str = Field(description="The cache entry's file.")
    stored_at: str | None = Field(None, description="When the entry was written (UTC, ISO 8601).")


class Prediction(_Strict):
    """The memory estimate made before any trial (one traced step, ``isoprobe estimate``), next to the answer.

    Peak ~ ``fixed_bytes + per_sample_bytes * batch`` in the budget's units; the search started from it,
    and the trials proved the answer. Without an estimate (``note`` says why) the numbers are null.
    """

    fixed_bytes: int | None = Field(
        None, description="Parameters, gradients, optimizer state and buffers as traced; on the CPU backend plus "
                          "the import baseline and the runtime a real stand-in step added."
    )
    per_sample_bytes: float | None = Field(None, description="Activations per sample: the traced peak's slope.")
    predicted_max: int | None = Field(None, description="The largest batch whose predicted peak is within the "
                                                        "capacity the search used.")
    error: float | None = Field(
        None, description="(predicted_max - max_batch_size) / max_batch_size: +0.1 predicted 10 % too many samples."
    )
    seconds: float | None = Field(None, description="How long the estimate took in the environment check.")
    note: str | None = Field(None, description="Why there is no estimate (skipped, or the trace failed).")


class Result(_Strict):
    """What ``isoprobe run`` found, with every trial as evidence."""

    schema_version: Literal[1] = SCHEMA_VERSION
    isoprobe_version: str
    python_version: str
    torch_version: str | None = None
    torchvision_version: str | None = None
    spec_path: str
    spec: Spec = Field(description="The spec as validated, command-line overrides applied.")
    device: DeviceInfo | None = None
    allocator: AllocatorInfo
    job_environment: dict[str, str] = Field(
        default_factory=dict,
        description="Variables every trial ran with that change how much memory a step needs: the answer holds in "
        "a job that runs with the same (--format env and taskprolog export them; the table shows them). CPU "
        "backend: MALLOC_MMAP_THRESHOLD_=131072 (every tensor of 128 KiB or more mmapped and given back exactly; "
        "left to glibc, 20-30 MB tensors land in the heap and fragment it). CUDA: the allocator setting the "
        "trials ran with (PYTORCH_CUDA_ALLOC_CONF), where the spec or the environment set one.")
    answered: bool = Field(description="True when max_batch_size is a proven answer (exit code 0).")
    max_batch_size: int | None = Field(
        None, description="Largest batch that fit. Always a batch that was run successfully; null if none did. With "
                          "the steady rule, its deciding trial's steady peak also left more than the spread free "
                          "(edge_margin): batches that fit closer to the capacity are edge_margin.marginal."
    )
    first_failing_batch_size: int | None = Field(
        None, description="Smallest batch above max_batch_size that ran out of memory; null if none was tried. "
                          "Batches between the two fit only inside the spread (edge_margin.marginal)."
    )
    short_max_batch_size: int | None = Field(
        None, description="Set when the maximum the search's short trials found did not hold in the long run (its "
                          "confirmation, stepping until its peak was steady, ran out of memory at a later step or "
                          "was still rising at search.steady_steps): that batch. max_batch_size is then the largest "
                          "batch proven steady below it (trials of purpose long_run); null: the maximum held.",
    )
    edge_margin: EdgeMargin | None = Field(
        None, description="The spread rule as applied to the maximum; null when it does not apply "
                          "(search.steady_steps 0, search.edge_spread 0, or no maximum).")
    max_steady: bool = Field(
        False, description="True when a trial of max_batch_size stepped until its peak was steady and fit (the "
        "trial that decided it: the first to fit there when it was run as the batch right below the smallest "
        "failure, else a run after a shorter one; or a long_run trial), clearing the spread where edge_margin "
        "applies. False with search.steady_steps 0: the maximum fit trials of search.steps steps only.",
    )
    max_confirmed: bool = Field(
        False, description="True when max_batch_size ran in more than one fresh process and fit every time "
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
        None, description="training.eval_pass: the largest evaluation batch that fit after the training steps at "
                          "eval_training_batch_size, proven by its own trials (those with training_batch_size set). "
                          "Null without eval_pass, or when no evaluation batch fit (eval_stop_reason says why).")
    eval_first_failing_batch_size: int | None = Field(
        None, description="training.eval_pass: the smallest evaluation batch above eval_max_batch_size that ran out "
                          "of memory (null: none tried, or capped).")
    eval_training_batch_size: int | None = Field(
        None, description="training.eval_pass: the training batch whose steps ran before each evaluation trial (the "
                          "recommended batch, else the maximum): evaluation as a job runs it, with the training "
                          "state held.")
    eval_stop_reason: StopReason | None = Field(
        None, description="training.eval_pass: how the evaluation search ended (edge_found, capped, "
                          "start_does_not_fit, ...); null when it did not run (no eval_pass, or no training answer).")
    edge_flaky: bool = Field(
        False, description="True when a batch at or above the reported maximum fit in some run and failed in another."
    )
    limited_by: Literal["max_batch_size", "dataset_size", "search_ceiling"] | None = Field(
        None, description="Why no larger batch was tried, when the search stopped at a cap rather than at memory."
    )
    recommended_batch_size: int | None = Field(
        None, description="A batch at or below max_batch_size with the headroom and rounding applied; it survived its "
                          "soak (recommendation.soaked), or, with recommendation.soak_steps 0, was not run for it."
    )
    recommendation: Recommendation | None = None
    throughput: Throughput | None = Field(None, description="Samples per second over the batches that fit.")
    memory_breakdown: MemoryBreakdown | None = Field(None, description="Parameters, gradients, optimizer state, activations.")
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
        None, description="Set with search.unit tokens: the token budget, the binding bucket length and every "
        "length's edge. max_batch_size, recommended_batch_size and the trials' edge are then the binding length's."
    )
    environment: RunEnvironment | None = Field(None, description="Host, Slurm job and GPUs of this invocation.")
    cache: CacheInfo | None = Field(None, description="The result cache's entry; null with --no-cache.")
    sources: dict[str, str] | None = Field(
        None,
        description=(
            "The user's source files the environment check and the trials imported (every module outside the "
            "standard library, site-packages and isoprobe) or opened for reading there (a config file the "
            "factory reads), as real path -> SHA-256. A cached answer is used only while every one of them is "
            "unchanged. Null where not recorded."
        ),
    )
    stop_reason: StopReason
    message: str = Field(description="One sentence for people: the answer, or why there is none.")
    suggestions: list[str] = Field(default_factory=list, description="What to try when the answer is not usable.")
    trials: list[Trial]
    total_seconds: float
