"""Did a command trial train at the batch it was asked for? The record a trial carries, and the rule across trials.

A trial of the job's own command passes its batch in ``{batch_size}``, and the probe credits that batch with what
the trial measured; a script that trains at another batch turns every credit into a wrong answer (a fixed batch
that ignores the argument: 16777216 "fits"; a finder of its own that catches its out-of-memory error: 802 "fits"
where the script trains at 100). Issue 47 judged one shape rule in each trial and refused the probe when it failed,
and real scripts that do train at their batch fell outside it (issue 56): two views of a batch ([2B, ...]), a
detection model given a list of B images, one forward per image, micro-batches of 2, a per-token model on
[B*T, F], packed sequences ([1, tokens]), a token budget, a graph network whose forward sees nodes.

So the judgement has two parts:

- **In the trial** (``isoprobe.child.command_trial.trained_batch``): was B, or a multiple of it, anywhere in what the
step's
  training forwards took (a dimension, a list's length, offsets' count, the number of forwards, their leading
  dimensions' sum)? ``trained``: yes, in some step; ``unclear``: forwards were seen, B nowhere in them. A script
  that trained at B in its first steps and then, in its last two, on markedly smaller inputs is refused in the
  trial: it trains at another batch after a warm-up at the given one.
- **Across trials** (``contradiction``, here): a script that trains at the batch it is given feeds its model more
  at a larger batch, whatever the inputs' shapes, and about as much per sample. Two trials at batches a factor of
  two or more apart, the larger of which took no more input elements in its typical (median) step than the
  smaller, prove that the script did not train at the larger one; so does a larger trial that took less than half
  as much per sample asked as a smaller one of 8 or more whose reading was exact. The probe refuses. This catches
  a fixed batch and a finder whatever their shapes. A trial whose reading is unclear, with no trial at half its
  batch or less to compare with, gets one: the pipeline runs the command at a quarter of its batch
  (``purpose: batch_check``), once a probe.

An ``unclear`` trial is credited (the answer carries a note, ``unclear_note``): refusing it refused real scripts,
and the rule across trials still stands guard. ``batch_check: off`` turns both parts off for a script
whose inputs mislead them. Pure: no processes, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

#: The error type of a trial that proved the script does not train at its batch; no trial of the probe then counts.
NOT_TRAINED = "CommandBatchNotTrained"
#: Batches closer than this ratio are not compared: inputs of variable length (packed sequences, graphs) can take
#: fewer elements at a somewhat larger batch by chance, not at twice the batch (the median of three steps or more).
RATIO = 2.0
#: Below this batch, trials whose check is unclear are not compared: one long sequence can outweigh two short ones.
SMALLEST_COMPARED = 8


class BatchCheck(BaseModel):
    """What a command trial's training forwards showed of the batch it was asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    verdict: Literal["trained", "unclear", "off"] = Field(
        description="'trained': some step's training forwards showed the batch (or, under a launcher of W ranks, "
        "batch / W) as a dimension, a list's length, an offsets tensor's count, a multiple of it, the "
        "number of forwards or their leading dimensions' sum; 'unclear': forwards were seen and the "
        "batch was nowhere in them (credited, the answer says so, and the rule across trials still "
        "applies); 'off': batch_check is off."
    )
    found_as: str | None = Field(None, description="Where the batch was found, for 'trained' (e.g. 'a list's length').")
    input_elements: int | None = Field(
        None,
        ge=0,
        description="The elements of every tensor the training forwards of the trial's typical (median) "
        "step took: what trials at different batches are compared by.",
    )
    shapes: list[list[int]] = Field(
        default_factory=list,
        max_length=8,
        description="The first input's shape of that step's last training forwards, as evidence.",
    )


def contradiction(
    batch: int, check: BatchCheck | None, others: Iterable[tuple[int, BatchCheck | None]]
) -> tuple[int, BatchCheck, int, BatchCheck] | None:
    """The first pair (larger batch and its check, smaller batch and its check) among this trial and ``others`` (their
    batches and checks) that shows the script did not train at the larger batch: at RATIO times the batch or more,
    its typical step took no more input elements; or, against a smaller batch of 8 or more whose reading was exact
    ('trained'), it took less than 1 / RATIO of the elements a sample there took, per sample asked (a finder that
    settled below the batch). None: no such pair (or nothing to compare)."""
    if check is None or check.verdict == "off" or not check.input_elements:
        return None
    mine = _Reading(batch, check, check.input_elements)
    for other_batch, other in others:
        pair = _pair(mine, other_batch, other)
        if pair is None:
            continue
        large, small = pair
        if large.batch < RATIO * small.batch:
            continue
        exact = large.check.verdict == small.check.verdict == "trained"
        if small.batch < SMALLEST_COMPARED and not exact:
            continue
        if large.elements <= small.elements:
            return large.batch, large.check, small.batch, small.check
    for other_batch, other in others:
        pair = _pair(mine, other_batch, other)
        if pair is None:
            continue
        large, small = pair
        if (
            small.check.verdict == "trained"
            and small.batch >= SMALLEST_COMPARED
            and RATIO * large.elements * small.batch < small.elements * large.batch
        ):
            return large.batch, large.check, small.batch, small.check
    return None


class _Reading(NamedTuple):
    """A trial's batch, its check, and the input elements it counted (never None or 0 here: compared)."""

    batch: int
    check: BatchCheck
    elements: int


def _pair(mine: _Reading, other_batch: int, other: BatchCheck | None) -> tuple[_Reading, _Reading] | None:
    """The larger and the smaller batch's readings of this trial and another; None where the other is no
    comparison (no check, off, no input elements counted, or the same batch)."""
    if other is None or other.verdict == "off" or not other.input_elements or other_batch == mine.batch:
        return None
    theirs = _Reading(other_batch, other, other.input_elements)
    return (mine, theirs) if mine.batch > theirs.batch else (theirs, mine)


def contradiction_message(
    large: int, small: int, large_check: BatchCheck, small_check: BatchCheck, placeholder: str
) -> str:
    """What the user reads when two trials prove that the script did not train at the larger batch."""

    def shown(check: BatchCheck) -> str:
        return f" (inputs {', '.join(str(s) for s in check.shapes[:2])})" if check.shapes else ""

    return (
        f"the command was asked to train at batch {large} and at batch {small} ({placeholder}), and its model "
        f"took {large_check.input_elements} input elements in a step at {large}{shown(large_check)}, no more "
        f"than the {small_check.input_elements} at {small}{shown(small_check)}: it does not train at the batch "
        "it is given, so no trial can measure one. A batch-size finder of its own (Accelerate's "
        "find_executable_batch_size, TrainingArguments(auto_find_batch_size=True), a loop that halves the "
        "batch on out-of-memory), a fixed batch that ignores the argument, or data with fewer samples than the "
        "batch do this. Turn the finder off and pass the batch to where the batches are built (the "
        "DataLoader's batch_size), and give the data at least one full batch; if the script does train at its "
        "batch and its inputs only look this way, set batch_check: off"
    )


def unclear_note(batch: int, check: BatchCheck) -> str:
    """The answer's note when the maximum's trial showed its batch nowhere in the model's inputs."""
    shapes = f" (its model's inputs: {', '.join(str(s) for s in check.shapes[:2])})" if check.shapes else ""
    return (
        f"the batch check found no batch of {batch} in what the maximum's trial fed its model{shapes}; the "
        "answer assumes the script trains at the batch it is given (set batch_check: off if it does)"
    )
