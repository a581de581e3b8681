"""Did a command trial train at the batch it was asked for? Judged from the model's own forwards.

A command trial passes its batch in ``{batch_size}`` (or ``ISOPROBE_BATCH_SIZE``), and the probe credits that
batch with what the trial measured. A script that does not train at it turns every such credit into a wrong
answer: one that ignores the argument and trains a fixed batch (its memory line is flat, and batch 16777216
"fits"); one with an automatic finder of its own (Accelerate's ``find_executable_batch_size``,
``TrainingArguments(auto_find_batch_size=True)``, a loop that halves on out-of-memory), which catches its own
out-of-memory error and trains at what it found (802 "fits" where the script trains at 100). So the shim records,
for every optimizer step, the input shapes of the model's completed root forwards since the step before
(``_isoprobe_shim._watch_forwards``), and a trial that ran enough steps is credited only if one of its steps
trained at the batch asked. Where it did not, the trial is an error that says what the script trained at: no
trial of that command can measure a batch, and the probe refuses to answer rather than guess.

A step *trained at* batch B when its last forward's input has B as a dimension (any: sequence-first inputs put
the batch second), or the first two dimensions multiply to B (a batch counted in tokens), or the forwards of the
same shape that end the step add up to B (gradient accumulation over micro-batches); under a launcher of W ranks,
B / W per rank counts too (a script that splits a global batch). Lenient on purpose: a small B can match some
other dimension by chance, and the trial is credited; a large B that is nowhere in the inputs cannot be.

One step that trained at B is enough: the last batch of an epoch may be short, and its step's peak is not the
trial's. A trial whose steps showed no forward at all (a model that is not a ``torch.nn.Module``) is not judged.
Pure: the supervisor (``child.command``) passes the steps' shapes.
"""

from __future__ import annotations

from typing import Sequence

Shape = Sequence[int]


def step_trained_at(batch: int, forwards: Sequence[Shape], world: int = 1) -> bool | None:
    """Whether a step whose root forwards took ``forwards`` (in order) trained at ``batch``; None: no forward seen."""
    shapes = [list(shape) for shape in forwards if shape]
    if not shapes:
        return None
    wanted = {batch}
    if world > 1:
        wanted |= {batch // world, -(-batch // world)}
    last = shapes[-1]
    if wanted & set(last):
        return True
    if len(last) >= 2 and last[0] * last[1] in wanted:
        return True
    micro = 0
    for shape in reversed(shapes):
        if shape[1:] != last[1:]:
            break
        micro += shape[0]
        if micro in wanted:
            return True
    return False


def trial_trained_at(batch: int, steps: Sequence[Sequence[Shape]], world: int = 1) -> bool | None:
    """Whether any of a trial's steps (each its forwards, all ranks' steps together) trained at ``batch``; None:
    no step showed a forward."""
    verdicts = [step_trained_at(batch, forwards, world) for forwards in steps]
    known = [v for v in verdicts if v is not None]
    if not known:
        return None
    return any(known)


def not_trained_message(batch: int, steps: Sequence[Sequence[Shape]], placeholder: str) -> str:
    """What the user reads when no step trained at ``batch``: what the model's forwards took instead, and why."""
    seen = []
    for forwards in steps:
        shapes = [list(shape) for shape in forwards if shape]
        if shapes and shapes[-1] not in seen:
            seen.append(shapes[-1])
    shown = ", ".join(str(shape) for shape in seen[:4]) + (" ..." if len(seen) > 4 else "")
    return (f"the command was asked to train at batch {batch} ({placeholder}), but in each of its "
            f"{len(steps)} optimizer step(s) the model's forward took inputs of shape {shown}, never a batch of "
            f"{batch}: it does not train at the batch it is given, so no trial can measure one. A batch-size "
            "finder of its own (Accelerate's find_executable_batch_size, TrainingArguments(auto_find_batch_size="
            "True), a loop that halves the batch on out-of-memory), a fixed batch that ignores the argument, or "
            "data with fewer samples than the batch do this. Turn the finder off and pass the batch to where the "
            "batches are built (the DataLoader's batch_size), and give the data at least one full batch")
