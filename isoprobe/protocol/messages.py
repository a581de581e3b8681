"""The contract between the parent and a trial's child process: requests in, events out.

Both sides import this module, and it imports no torch, so the parent can read
what a child wrote without ever loading torch. Everything that crosses the
process boundary is defined in this package, and named from this module:

- **Requests** (parent to child: ``TrialRequest``, ``InspectRequest``) and the
  fork server's orders and replies, defined in ``protocol.requests`` and
  re-exported here.
- **Events** (child to parent, one complete JSON line each, appended to the
  file named by ``EVENTS_ENV``): ``started``, ``warm``, ``request``, ``imported``, ``model_built``, ``step``,
  ``eval`` (a command trial's: ``command``), then exactly one ``result`` (a trial) or ``inspected`` (the
  environment check, then its ``estimated``). A line that is cut short, is not JSON or does not match an event's
  model is dropped: it is never guessed at, so a child that leaves no valid verdict is ``crashed``.
- **The names** of the environment variables and arguments that wire a child
  to its parent (defined in ``wiring``, re-exported here).

Only same-version parents and children talk (the child runs from the parent's
own package), so every model is strict (``extra="forbid"``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from isoprobe.protocol.command import CommandSeen
from isoprobe.protocol.requests import (  # noqa: F401 - defined there (what the parent sends), named from here too
    SERVER_ORDER,
    SERVER_REPLY,
    Ended,
    Extended,
    Forked,
    ForkOrder,
    ImportOrder,
    InspectRequest,
    Message,
    RankAssignment,
    Request,
    ServerReply,
    TrialRequest,
    read_request,
    request_json,
)
from isoprobe.protocol.wiring import (  # noqa: F401 - defined there (the child reads them before torch), named from here
    CHILD_MODULE,
    EVENTS_ENV,
    IDLE_ARGUMENT,
    IMPORT_LINE,
    LIFELINE_ENV,
    PRELOAD_ENV,
    SERVE_ARGUMENT,
    WAIT_ARGUMENT,
)
from isoprobe.report.batch_check import BatchCheck
from isoprobe.report.cycle import CycleSeen
from isoprobe.report.outcomes import Outcome
from isoprobe.report.trial import Applied, ErrorInfo, Sizes

#: Exception messages are cut to this many characters (ErrorInfo.message, InspectProblem.message), so that
#: an event stays one bounded line whatever the user's code raised.
MESSAGE_CHARS = 2000


# --------------------------------------------------------------------------- events


class MemoryReading(Message):
    """The child's own memory from /proc/self/status, in bytes (None where the kernel does not say)."""

    peak_rss: int | None = None
    rss: int | None = None
    data: int | None = None
    peak_data: int | None = None


#: The ``sources`` of a trial's and of the inspect child's last event (``isoprobe.cache.sources``).
_SOURCES = (
    "The user's module files this child imported (outside the installed environment), as real path -> "
    "SHA-256, read at its end: the cache trusts an answer only while they are unchanged."
)
#: The ``reads`` of the same events (``isoprobe.child.reads``).
_READS = (
    "The user's files this child opened for reading (outside the installed environment, not written by it), "
    "as real paths; the parent hashes them into the entry's sources, so a changed config file is stale."
)


class _Event(Message):
    t: float = Field(default_factory=time.time, description="Wall-clock time the child wrote the event.")


class Started(_Event):
    event: Literal["started"] = "started"
    pid: int


class Warm(_Event):
    """A warm child finished its imports and waits for its request (it never touched a device)."""

    event: Literal["warm"] = "warm"
    modules: list[str]
    seconds: float
    cuda_initialized: bool
    idle_priority: bool
    forked: bool = Field(False, description="Forked from the probe's fork server, which did the imports.")
    own_data_bytes: int = Field(
        0,
        ge=0,
        description="What isoprobe's own modules add to this process's data segment, measured after the "
        "preload (child.own_modules.credit_own): credited to a CPU cap and left out of the memory readings.",
    )


class RequestReceived(_Event):
    event: Literal["request"] = "request"
    path: str


class Imported(_Event):
    event: Literal["imported"] = "imported"
    memory: MemoryReading


class ModelBuilt(_Event):
    event: Literal["model_built"] = "model_built"
    memory: MemoryReading


class DataScanning(_Event):
    """The environment check's pass over spec.data's dataset (``child.core.data.scan``): where it is, so that a check
    stopped by its timeout names the data scan rather than the model build."""

    event: Literal["data_scan"] = "data_scan"
    stage: Literal["building", "scanning", "done"] = Field(
        description="building: calling data.dataset's factory; scanning: reading the lengths; done: the pass is over."
    )
    samples: int | None = Field(None, ge=0, description="len(dataset), once built.")
    scanning: int | None = Field(None, ge=0, description="How many samples' lengths the scan reads (data.scan_limit).")


class StepDone(_Event):
    event: Literal["step"] = "step"
    step: int
    seconds: float
    peak_bytes: int | None = Field(
        None, description="The trial's peak so far, in TrialResult.peak_bytes's units (CUDA reserved, CPU VmHWM)."
    )
    held_bytes: int | None = Field(
        None, description="Memory held right after the step (CUDA torch.cuda.memory_allocated, CPU VmRSS)."
    )
    budget_peak_bytes: int | None = Field(
        None,
        description="The peak so far in TrialResult.budget_peak_bytes's units (CPU: the data segment the cap "
        "counts; CUDA: the allocator's need plus the memory outside it): what a steady rule judges.",
    )
    heap_churn_bytes: int | None = Field(
        None,
        description="CPU: how far glibc's heaps reached above what they hold right after the step "
        "(child.core.heap_churn.heap_churn); the trial's report.result.Trial.heap_churn_bytes is read "
        "from these. Null: not read (CUDA, or no glibc).",
    )
    cap_lowered: bool = Field(
        False,
        description="CUDA: more memory came outside the allocator in this step than the cap had left out, so the "
        "cap was lowered after it and the peaks restarted (child.core.cuda.refit_cap): the trial steps at least once "
        "more, and this step's reading, taken under a cap too loose, is not its verdict.",
    )


class Forwarded(_Event):
    """A rank's forward pass (and loss) returned in step ``step``: written by the ranks of a gang only.

    Why: when a gang times out, every rank is still running, the one that hung and the others blocked in
    a collective waiting for it. A rank that hangs in its forward pass and a peer that finished its own
    and waits in backward's all-reduce are inside the same step; this marker is what tells them apart
    (``executors.gang.laggard``: the rank that got less far is the one named).
    """

    event: Literal["forwarded"] = "forwarded"
    step: int


class EvalDone(_Event):
    event: Literal["eval"] = "eval"
    seconds: float


#: The error type of a command trial's verdict 'crashed' (``child.command_trial.rank_loss``): a rank lost to a signal.
RANK_LOST = "RankLost"


class TrialResult(_Event):
    """The child's own verdict: fits, out_of_memory or error, with what it measured; or crashed, from a command
    trial's supervisor only, which saw a rank of the command lost to a signal (``child.command_trial.rank_loss``)
    while it
    itself ran on to say which."""

    event: Literal["result"] = "result"
    outcome: Literal[Outcome.FITS, Outcome.OUT_OF_MEMORY, Outcome.ERROR, Outcome.CRASHED]
    phase: str
    step_seconds: list[float] = Field(default_factory=list)
    peak_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    budget_peak_bytes: int | None = None
    base_bytes: int | None = None
    alloc_retries: int | None = Field(None, description="CUDA: report.result.Trial.alloc_retries.")
    file_resident_bytes: int | None = Field(
        None,
        description="CPU: resident pages of mapped files at the end (RssFile: the libraries' code, mostly). "
        "How many of them are resident depends on the page cache, not on the trial, so the resident over-budget "
        "rule (probe.plausibility.over_budget) leaves them out of peak_bytes.",
    )
    total_memory_bytes: int | None = None
    sizes: Sizes | None = None
    compile_seconds: float | None = None
    first_step_seconds: float | None = Field(None, ge=0, description="report.trial.Trial.first_step_seconds.")
    started_ahead: bool | None = Field(None, description="report.trial.Trial.started_ahead.")
    cycle: CycleSeen | None = Field(None, description="report.trial.Trial.cycle.")
    batch_check: BatchCheck | None = Field(None, description="report.trial.Trial.batch_check.")
    eval_seconds: float | None = None
    applied: Applied | None = None
    error: ErrorInfo | None = None
    sources: dict[str, str] = Field(default_factory=dict, description=_SOURCES)
    reads: list[str] = Field(default_factory=list, description=_READS)
    command_ranks: int | None = Field(
        None, description="A command trial (spec.command): how many of the command's processes made optimizer steps."
    )
    budget_swing_bytes: int | None = Field(
        None, description="A command trial on the CPU backend: report.result.Trial.budget_swing_bytes."
    )
    heap_churn_bytes: int | None = Field(
        None, description="A command trial on the CPU backend: report.result.Trial.heap_churn_bytes."
    )
    threads: int | None = Field(
        None,
        description="torch.get_num_threads() in the trial, after its imports: the cache keeps a CPU answer "
        "only if every trial ran the intra-op threads its key holds (``cache.threads``). None: torch not imported.",
    )

    @model_validator(mode="after")
    def _crashed_only_for_a_lost_rank(self) -> TrialResult:
        # A child never says it crashed: how it ended says that. The one exception is a command trial's supervisor,
        # which ran on after a rank of the command was lost to a signal and names it (``RankLost``).
        if self.outcome is Outcome.CRASHED and (self.error is None or self.error.type != RANK_LOST):
            raise ValueError("only a command's lost rank (error type RankLost) makes a child's verdict 'crashed'")
        return self


class CudaDevice(Message):
    name: str
    total_memory_bytes: int
    free_memory_bytes: int | None = Field(None, description="Free when inspected, this child's context taken out.")
    outside_bytes: int | None = Field(
        None,
        description="What this child held outside its allocator (context, "
        "libraries) by NVML's count for its pid; None where NVML cannot say.",
    )


class InspectProblem(Message):
    """Something in the spec that cannot be set up; the parent maps ``stage`` to the spec field to fix."""

    stage: Literal[
        "model",
        "optimizer",
        "allocator",
        "input",
        "target",
        "precision",
        "checkpointing",
        "batch",
        "loss",
        "step",
        "hf_trainer",
        "lightning",
        "datamodule",
        "batch_arg_name",
        "data.dataset",
        "data.collate_fn",
        "data.length",
        "eval_pass",
        "data.determinism",
    ]
    type: str
    message: str


class Estimate(Message):
    """The memory estimate before any trial (``child.core.estimate``): one traced step, in the budget's units.

    Peak ~ ``fixed_bytes + per_sample_bytes * batch``. Without ``per_sample_bytes`` there is no estimate and
    ``note`` says why (skipped, or the trace failed); the search then starts as it does without one.
    """

    fixed_bytes: int | None = Field(
        None, description="The line's intercept: the traced step's fixed part plus baseline_bytes and runtime_bytes."
    )
    per_sample_bytes: float | None = Field(None, description="The line's slope: what one more sample costs.")
    traced_batch_sizes: list[int] = Field(default_factory=list, description="The batches the line was traced at.")
    traced_peak_bytes: list[int] = Field(default_factory=list, description="Their traced peaks (no baseline).")
    parameter_bytes: int | None = None
    gradient_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    buffer_bytes: int | None = None
    baseline_bytes: int | None = Field(
        None,
        description="What every trial holds before its model exists, added to "
        "the fixed part: CPU, the import baseline (data segment); CUDA, what is in use "
        "on the card after the check's context (others' memory included).",
    )
    runtime_bytes: int | None = Field(
        None,
        description="CPU: what a real stand-in step added to the data segment "
        "beyond its tensors (thread pools, malloc arenas), in fixed_bytes.",
    )
    seconds: float = Field(0.0, description="How long the estimate took in the environment check.")
    note: str | None = Field(
        None,
        description='Why there is no estimate: the reason alone ("search.estimate is '
        'false"), which whoever shows it prefixes once (pipeline.prediction.no_estimate).',
    )


class DataScan(Message):
    """The environment check's pass over the spec's dataset (``child.core.data``): its size and the longest samples."""

    samples: int = Field(ge=1, description="len(dataset).")
    scanned: int = Field(ge=1, description="Samples whose length was computed (spec.data.scanned_indices).")
    sampled: bool = Field(description="Fewer than all: a seeded sample (spec.data.SAMPLE_SEED).")
    head_indices: list[int] = Field(description="The first INDICES_IN_REQUEST indices of the worst-first order.")
    head_lengths: list[float] = Field(description="Their lengths.")
    length_min: float
    length_mean: float
    length_max: float
    seconds: float = Field(description="How long the lengths took.")


class Facts(Message):
    """What the environment check found: versions, devices, and the model's size."""

    torch_version: str
    torchvision_version: str | None = None
    library_versions: dict[str, str] = Field(default_factory=dict, description="timm / transformers, if imported.")
    cuda_version: str | None = None
    cuda_available: bool = False
    cuda_devices: list[CudaDevice] = Field(default_factory=list)
    memory_before_import: MemoryReading = MemoryReading()
    memory_after_import: MemoryReading = MemoryReading()
    parameter_count: int | None = None
    parameter_bytes: int | None = None
    checkpointing: tuple[str, int] | None = None
    meta_build_warning: str | None = None
    meta_forward_warning: str | None = None
    model_imports: list[str] = Field(
        default_factory=list,
        description="Installed packages (top-level names) the model's code imported while it "
        "was built, beyond the model's library: the trials' warm children and fork server import them before "
        "the request, so that a forked trial holds what a fresh process does.",
    )
    data: DataScan | None = Field(None, description="With spec.data: the dataset's lengths (``child.core.data``).")
    train_samples: int | None = Field(
        None,
        description="With model.hf_trainer: the length of the Trainer's train_dataset (None: an iterable one). "
        "No batch above it is tried: the Trainer never draws one.",
    )
    estimate: Estimate | None = Field(
        None,
        description="The traced memory estimate; None where not attempted. The child reports it in its own "
        "event (``Estimated``) after ``Inspected``; the parent puts it here (``pipeline.environment``).",
    )


class Inspected(_Event):
    event: Literal["inspected"] = "inspected"
    facts: Facts
    problems: list[InspectProblem] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict, description=_SOURCES)
    reads: list[str] = Field(default_factory=list, description=_READS)


class Estimated(_Event):
    """The environment check's traced estimate, written after its ``Inspected``.

    Apart, and after, because the trace runs the user's model at real batch
    sizes (on fake tensors): whatever that code does then (hangs, exits, writes
    to the channel) can cost the estimate, never the environment check.
    """

    event: Literal["estimated"] = "estimated"
    estimate: Estimate


Event = Annotated[
    Started
    | Warm
    | RequestReceived
    | Imported
    | ModelBuilt
    | Forwarded
    | StepDone
    | EvalDone
    | TrialResult
    | Inspected
    | Estimated
    | DataScanning
    | CommandSeen,
    Field(discriminator="event"),
]
_EVENT = TypeAdapter(Event)


def event_line(event: _Event) -> bytes:
    """One event as the child writes it: a single JSON line, written with one ``write``."""
    return event.model_dump_json().encode() + b"\n"


def parse_events(data: bytes) -> list:
    """Complete, valid event lines only: a line cut short by a dying child is dropped, not guessed at."""
    events = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is incomplete by definition
        try:
            events.append(_EVENT.validate_json(line))
        except (ValidationError, ValueError, RecursionError):
            continue
    return events


def read_events(path: Path) -> list:
    try:
        return parse_events(path.read_bytes())
    except FileNotFoundError:
        return []


def last_of(events: list, kind: type):
    """The last event of one kind, or None."""
    return next((e for e in reversed(events) if isinstance(e, kind)), None)


def first_of(events: list, kind: type):
    """The first event of one kind, or None."""
    return next((e for e in events if isinstance(e, kind)), None)
