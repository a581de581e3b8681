"""The lines a command trial's shim writes from inside the user's processes, typed for the supervisor that reads them.

The shim (``isoprobe/child/shim/_isoprobe_shim.py``) runs in the process being measured, so it imports nothing
of isoprobe's (pydantic alone would add megabytes to the very peak it reports) and writes these lines with
``json``. Its reader, the trial's supervisor (``isoprobe.child.command_trial.supervisor``), validates each one
against these
models: a line that is cut short or does not match is dropped, never guessed at, as the events of isoprobe's own
children are (``protocol.messages``). ``tests/unit/test_command_shim.py`` checks that what the shim writes is
what these models take.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from isoprobe.report.rank_progress import RankProgress

#: The shim's folder: put first on PYTHONPATH of the command, so that its ``sitecustomize`` runs in every process.
SHIM_FOLDER = Path(__file__).resolve().parents[1] / "child" / "shim"


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pid: int


class ShimHello(_Line):
    """A process imported torch's optimizers: the shim's hooks are in, and this is who it is."""

    kind: Literal["hello"]
    ppid: int
    host: str | None = Field(
        None,
        description="The node the process runs on (uname's nodename): the supervisor "
        "checks a process of its own node against /proc before it takes its steps.",
    )
    rank: int | None = Field(None, description="RANK, as torchrun, accelerate launch and DeepSpeed set it.")
    local_rank: int | None = None
    world_size: int | None = Field(None, description="WORLD_SIZE: how many ranks the launcher starts.")
    argv: list[str]
    t: float


class ShimStep(_Line):
    """One optimizer step of one process, with the readings ``protocol.messages.StepDone`` carries."""

    kind: Literal["step"]
    step: int = Field(ge=1)
    seconds: float = Field(ge=0)
    peak_bytes: int | None = None
    held_bytes: int | None = None
    budget_peak_bytes: int | None = Field(
        None,
        description="The peak so far in the budget's units: CPU, the data "
        "segment; CUDA, the allocator's need plus the memory outside it "
        "(isoprobe.child.cuda_readings.card_reading's arithmetic), of the worst device.",
    )
    held_budget_bytes: int | None = Field(
        None,
        ge=0,
        description="What the process holds right after the step, its "
        "batch's activations freed, in the budget's units (CPU: the data segment "
        "now; CUDA: memory_allocated plus the memory outside the allocator): the "
        "trial's base reading (protocol.messages.TrialResult.base_bytes), as the "
        "shim read it; the supervisor's sampling never raises it.",
    )
    file_resident_bytes: int | None = Field(
        None, description="CPU: RssFile after the step, as protocol.messages.TrialResult.file_resident_bytes."
    )
    peak_allocated_bytes: int | None = Field(None, description="CUDA: max_memory_allocated of that device.")
    outside_bytes: int | None = Field(
        None,
        ge=0,
        description="CUDA: the memory outside the allocator after the "
        "step (total - free - reserved): context, libraries, kernels, NCCL.",
    )
    alloc_retries: int | None = Field(None, ge=0, description="CUDA: num_alloc_retries of that device.")
    cap_lowered: bool = Field(
        False,
        description="CUDA: more came outside the allocator in this step than the device's cap left out, so the "
        "cap was lowered and the device's peaks restarted after it: this step's reading, taken under a cap too "
        "loose, is no verdict; the next step's is (child.command_trial.verdicts.over_budget).",
    )
    script_memory_fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="CUDA: the fraction the script set itself on that device, honoured as a fraction of the budget.",
    )
    forwards: list[list[int]] = Field(
        default_factory=list,
        max_length=64,
        description="The input shapes of the "
        "model's completed forwards since the step before (root module calls with "
        "gradients on and trainable parameters; the last few): the batch this step "
        "trained at, as isoprobe.child.command_trial.trained_batch judges it.",
    )
    forward_count: int = Field(
        0,
        ge=0,
        description="The most training forwards one module ran since the step "
        "before (forwards keeps the last few of all).",
    )
    leading_sum: int = Field(0, ge=0, description="Their first inputs' leading dimensions, summed (micro-batches).")
    input_elements: int = Field(
        0,
        ge=0,
        description="The elements of every tensor the step's training forwards "
        "took (lists, tuples, dicts, objects looked into): trials are compared by it.",
    )
    batch_counts: list[int] = Field(
        default_factory=list,
        max_length=64,
        description="Every count each module's "
        "last training forward shows: dimensions, the first two's product, list "
        "lengths, offsets' count, a batch object's size.",
    )
    tried_counts: list[int] = Field(
        default_factory=list,
        max_length=64,
        description="The same of every training forward of the step, those that raised included (a finder's attempts).",
    )
    eval_forwards: int = Field(
        0,
        ge=0,
        description="The model's evaluation forwards since the step before (root "
        "module calls without gradients, under inference_mode, or in eval mode): what "
        "isoprobe.report.cycle reads an evaluation pass from.",
    )
    saves: int = Field(0, ge=0, description="torch.save calls since the step before (a checkpoint write).")
    device: str
    t: float


class ShimForward(_Line):
    """Where the process is in its next step: its first training root forward since the step before began, or
    returned (its backward and optimizer step are next). A rank hung before its forward is told from its peers
    waiting in the backward's collective by it (issue 56)."""

    kind: Literal["forward"]
    step: int = Field(ge=1, description="The step the forward belongs to: the process's steps so far, plus one.")
    returned: bool
    t: float


class ShimFiles(_Line):
    """Module files and files read by the process, outside the installed environment, not reported before."""

    kind: Literal["files"]
    modules: list[str]
    reads: list[str]


class ShimException(_Line):
    """An exception that reached the top of the process (or of one of its threads)."""

    kind: Literal["exception"]
    types: list[str] = Field(description="The exception's class and its bases, by name (``classify_exception``).")
    type: str
    message: str
    traceback: str
    thread: str | None
    steps: int = Field(ge=0, description="Optimizer steps the process had finished.")
    t: float


class CommandSeen(BaseModel):
    """An event of a command trial's supervisor (``protocol.messages``): how far each of the command's processes
    got and what the command printed last, written at the start and then whenever that changes, at most every
    ``child.command_trial.seen.interval`` seconds. A trial killed at its timeout writes no verdict; this is what it says
    then: which rank hung and at which step, and the command's last lines (its stdout and stderr are files in the
    child's folder, which the parent does not read; issue 56 found "the command printed nothing" said of one that
    printed its steps)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event: Literal["command"] = "command"
    t: float = Field(default_factory=time.time)
    processes: list[RankProgress] = Field(
        default_factory=list, description="Each process that imported torch's optimizers, in the order they said hello."
    )
    stdout_tail: str = Field("", description="The command's stdout, its last lines.")
    stderr_tail: str = Field("", description="The command's stderr, its last lines.")


ShimLine = Annotated[ShimHello | ShimStep | ShimForward | ShimFiles | ShimException, Field(discriminator="kind")]
_LINE = TypeAdapter(ShimLine)


def parse_lines(data: bytes) -> list:
    """The complete, valid lines of one process's file (the part after the last newline is still being written)."""
    lines = []
    for raw in data.split(b"\n")[:-1]:
        try:
            lines.append(_LINE.validate_json(raw))
        except (ValidationError, ValueError, RecursionError):
            continue
    return lines
