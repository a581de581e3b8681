"""Did a command trial train at the batch it was asked for? Judged in the trial from the model's own forwards.

The shim records, for every optimizer step, what the step's *training* root forwards (gradients on, a module with
trainable parameters, not nested in another module's call) took (``_isoprobe_shim``'s ``_isoprobe_forwards``):
every count its inputs show (each tensor's dimensions, a list's length, a 1-d integer tensor's length less one:
offsets such as ``cu_seqlens``, the product of a tensor's first two dimensions), how many forwards ran, the sum
of their first inputs' leading dimensions, the elements of every tensor they took, and the first input's shape of
the last few. ``isoprobe.report.batch_check`` says why and how the answer uses the judgement.

A step *shows* batch B when B, or under a launcher of W ranks B / W, is one of those counts, or a multiple of
one (two views of a batch, [2B, ...]; a per-token model on [B*T, F]; FixMatch's B + 2uB), or the number of
forwards (one per sample), or their leading dimensions' sum (micro-batches). Lenient on purpose: a small B can
match by chance and be credited; the rule across trials catches a script whose inputs do not grow with B.

- ``trained``: some step showed B; ``unclear``: forwards were seen and none showed B (credited, with a note);
  None: no step showed a forward (a model that is not a ``torch.nn.Module``): not judged.
- Refused here (``trained_once``): a trial whose last two steps showed no B and took at most half the elements
  of its steps that did: it trains at another batch after its first steps (a warm-up at the given
  batch). One short step is not this: the last batch of an epoch may be short.

Pure: the supervisor (``child.command_trial.supervisor``) passes the steps as the shim wrote them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from isoprobe.report.batch_check import RATIO, BatchCheck

Shape = Sequence[int]


@dataclass(frozen=True)
class StepInputs:
    """What one optimizer step's training forwards took, as the shim's step line carries it."""

    forwards: Sequence[Shape] = ()
    forward_count: int = 0
    input_elements: int = 0
    leading_sum: int = 0
    batch_counts: Sequence[int] = field(default_factory=tuple)
    tried_counts: Sequence[int] = field(default_factory=tuple)

    @property
    def seen(self) -> bool:
        return bool(self.forward_count or any(self.forwards))


def _wanted(batch: int, world: int) -> set[int]:
    wanted = {batch}
    if world > 1:
        wanted |= {batch // world, -(-batch // world)}
    wanted.discard(0)
    return wanted


def step_shows(batch: int, step: StepInputs, world: int = 1) -> str | None:
    """Where ``step``'s inputs show ``batch`` (words for the result), or None."""
    wanted = _wanted(batch, world)
    shapes = [list(s) for s in step.forwards if s]
    counts = set(step.batch_counts) | {n for shape in shapes for n in shape}
    if shapes and len(shapes[-1]) >= 2:
        counts.add(shapes[-1][0] * shapes[-1][1])
    if wanted & counts:
        return "a dimension or a list's length of the model's inputs"
    count = step.forward_count or len(shapes)
    if count in wanted and count > 1:
        return "the number of training forwards in a step (one per sample)"
    leading = step.leading_sum or sum(s[0] for s in shapes)
    if leading in wanted:
        return "the training forwards' leading dimensions, summed (micro-batches)"
    for n in sorted(counts):
        if any(b >= 2 and n > b and n % b == 0 for b in wanted):
            return f"a multiple of it ({n}) in the model's inputs"
    return None


@dataclass(frozen=True)
class Judgement:
    """A trial's verdict: the record it carries to the parent, and a refusal when it trained at B only at first."""

    check: BatchCheck | None
    trained_once: str | None = None


def judge(
    batch: int, ranks: Sequence[Sequence[StepInputs]], world: int = 1, placeholder: str = "{batch_size}"
) -> Judgement:
    """The trial's judgement from each rank's judged steps, in order."""
    steps = [step for rank in ranks for step in rank]
    if not any(step.seen for step in steps):
        return Judgement(None)
    shown = [(step, step_shows(batch, step, world)) for step in steps if step.seen]
    found = next((how for _, how in shown if how is not None), None)
    typical = sorted((step for step, _ in shown), key=lambda s: s.input_elements)[len(shown) // 2]
    check = BatchCheck(
        verdict="trained" if found else "unclear",
        found_as=found,
        input_elements=typical.input_elements or None,
        shapes=[list(s) for s in typical.forwards if s][-4:],
    )
    if found is None:
        tried = next((k for k, step in enumerate(steps, 1) if _wanted(batch, world) & set(step.tried_counts)), None)
        if tried is not None:
            return Judgement(check, _tried_message(batch, tried, typical, placeholder))
    for rank in ranks:
        once = _trained_once(batch, list(rank), world, placeholder)
        if once is not None:
            return Judgement(check, once)
    return Judgement(check)


def _trained_once(batch: int, steps: list[StepInputs], world: int, placeholder: str) -> str | None:
    """The refusal for a rank whose last two steps showed no B and took at most 1 / RATIO of what its steps that
    showed B took; None otherwise."""
    steps = [s for s in steps if s.seen]
    if len(steps) < 3:
        return None
    at_batch = [k for k, s in enumerate(steps) if step_shows(batch, s, world) is not None]
    last = steps[-2:]
    if not at_batch or at_batch[-1] >= len(steps) - 2 or not all(s.input_elements for s in steps):
        return None
    most = max(steps[k].input_elements for k in at_batch)
    if any(RATIO * s.input_elements > most for s in last):
        return None
    after = at_batch[-1] + 2
    shapes = ", ".join(str(list(s)) for s in last[-1].forwards[-2:] if s)
    return (
        f"the command trained at batch {batch} ({placeholder}) in its first {after - 1} optimizer step(s) "
        f"only: from step {after} on its model took inputs of shape {shapes} ({last[-1].input_elements} "
        f"elements a step, against {most} at batch {batch}): it trains at another batch after a start at the "
        "one it is given, so the trial's peak is not that batch's. Pass the batch to where every step's batches "
        "are built (the DataLoader's batch_size), not only to the first step's"
    )


def _tried_message(batch: int, step: int, typical: StepInputs, placeholder: str) -> str:
    shapes = ", ".join(str(list(s)) for s in typical.forwards[-2:] if s)
    return (
        f"the command was asked to train at batch {batch} ({placeholder}): its model was given a batch of "
        f"{batch} in step {step}, and every step trained on something else (inputs of shape {shapes}): it tried "
        "the batch, failed, and went on at another, as a batch-size finder of its own does (Accelerate's "
        "find_executable_batch_size, TrainingArguments(auto_find_batch_size=True), a loop that halves the batch "
        "on out-of-memory). No trial can measure a batch the script steps back from; turn the finder off and pass "
        "the batch to where the batches are built (the DataLoader's batch_size)"
    )
