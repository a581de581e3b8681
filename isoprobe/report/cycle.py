"""The script's cycle: a maximum is called only after the trial has seen the phases that come later than the first
few steps (issue 55).

A command trial used to stop after 3 to 10 optimizer steps. Real scripts change later: a timm-style loop validates
every 25 steps on its EMA model with an eval batch of 2N and workers of its own; a Trainer with ``eval_steps``,
Lightning's ``val_check_interval``, a checkpoint written every N steps. Measured on such a loop: isoprobe answered
111 where the job ran out of memory at step 26, its own edge 107. The in-process finders (Accelerate's
``find_executable_batch_size``, HF's ``auto_find_batch_size``) survive it by restarting on a failure at any point;
an answer given before the job starts has to have seen the cycle instead.

So the shim counts, between two optimizer steps, the model's *evaluation forwards* (root module calls with
gradients off, under ``inference_mode``, or of a module in eval mode) and ``torch.save`` calls, and every trial
that decides the maximum (and the recommendation's soak) steps on past its steady peak until it has seen one
evaluation pass and the training step after it, bounded by ``CycleRule`` (``search.cycle_steps`` steps,
``search.cycle_seconds`` seconds from its first step). An evaluation *pass* is a step whose interval holds more
evaluation forwards than every step since the second: a frozen teacher's forward in every step is part of the step,
not a pass; Lightning's sanity check runs before the first step, and an evaluation in every step is covered by
every step's reading. The step after the pass is the one whose interval held it: its reading (the peak since the
step before) includes the pass.

Pure (no processes, no torch, no clock): the rule travels in the trial's request, the record in its result.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from isoprobe.spec.search_section import DEFAULT_CYCLE_SECONDS, DEFAULT_CYCLE_STEPS  # noqa: F401 - the bounds' defaults


class CycleRule(BaseModel):
    """How long a trial that decides the maximum waits for the script's first evaluation pass."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int = Field(
        ge=1, description="The most optimizer steps the trial runs waiting for an evaluation pass (search.cycle_steps)."
    )
    max_seconds: float = Field(
        gt=0, description="The most seconds, from the end of its first step, it waits (search.cycle_seconds)."
    )


class CycleSeen(BaseModel):
    """What a command trial saw of the script's cycle: its evaluation passes and checkpoint writes, by step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(ge=0, description="Optimizer steps the trial judged.")
    evaluation_step: int | None = Field(
        None,
        ge=1,
        description="The step whose interval held the script's first evaluation pass (more evaluation "
        "forwards than every step since the second); that step's reading includes the pass. Null: none seen.",
    )
    evaluation_forwards: int | None = Field(
        None,
        ge=0,
        description="The evaluation forwards of that pass (root module calls without gradients or in eval mode).",
    )
    evaluation_peak_bytes: int | None = Field(
        None, ge=0, description="The peak, in the budget's units, of the step that held the pass."
    )
    every_step_forwards: int = Field(
        0,
        ge=0,
        description="Evaluation forwards found in every step since the second (a frozen teacher, or an "
        "evaluation run every step): part of each step, covered by each step's reading.",
    )
    checkpoint_steps: list[int] = Field(
        default_factory=list, description="Steps whose interval held a torch.save call (a checkpoint write)."
    )
    waited: bool = Field(False, description="The trial was asked to wait for the cycle (it decides the maximum).")
    bound: str | None = Field(
        None,
        description="Why it stopped waiting without a pass: 'steps' (search.cycle_steps), 'seconds' "
        "(search.cycle_seconds), 'ended' (the command ended on its own after its steps: its whole run was "
        "seen), or 'unconfigured' (model.lightning, model.hf_trainer: the user's fit does not evaluate). Null: it "
        "saw a pass, or was not waiting.",
    )


def evaluation_step(counts: list[int]) -> int | None:
    """The first step (1-based, from the third on) whose evaluation forwards exceed every step's since the second
    (``counts[i]``: step i+1's); None if there is none."""
    for index in range(2, len(counts)):
        if counts[index] > min(counts[1:index]):
            return index + 1
    return None


def seen(counts: list[int], saves: list[int], peaks: list[int]) -> CycleSeen:
    """The record of a trial's judged steps: their evaluation forwards, torch.save calls and peaks."""
    step = evaluation_step(counts)
    every = min(counts[1:]) if len(counts) > 1 else 0
    return CycleSeen(
        steps=len(counts),
        evaluation_step=step,
        evaluation_forwards=counts[step - 1] - every if step is not None else None,
        evaluation_peak_bytes=peaks[step - 1] if step is not None and step <= len(peaks) else None,
        every_step_forwards=every,
        checkpoint_steps=[i + 1 for i, n in enumerate(saves) if n],
    )


def waiting_done(counts: list[int], rule: CycleRule | None, seconds_since_first: float, after: int = 0) -> str | None:
    """Whether a trial may stop as far as its cycle goes: 'seen' (a pass, the step after it and ``after`` more),
    'steps' or 'seconds' (the bound), 'off' (no rule); None: it steps on.

    ``after``: a trial judged by the steady rule steps the rule's window past the pass: the pass lifts that step's
    peak, and the window must show the peak holding again (else the rise reads as growth: still_rising). Once a
    pass is seen the bound no longer applies: those few steps are what the wait was for."""
    if rule is None:
        return "off"
    step = evaluation_step(counts)
    if step is not None:
        return "seen" if len(counts) >= step + after else None
    if len(counts) >= rule.max_steps:
        return "steps"
    if seconds_since_first >= rule.max_seconds:
        return "seconds"
    return None


def describe(record: CycleSeen | None, rule_steps: int | None = None, format_bytes=None) -> str | None:
    """One sentence for the result: what the deciding trial saw of the cycle. None: not a command trial."""
    if record is None:
        return None
    size = (lambda n: format_bytes(n)) if format_bytes is not None else (lambda n: f"{n} bytes")
    saves = (
        f"; torch.save at step{'s' if len(record.checkpoint_steps) > 1 else ''} "
        f"{', '.join(map(str, record.checkpoint_steps[:8]))}"
        if record.checkpoint_steps
        else ""
    )
    if record.evaluation_step is not None:
        peak = f", peak {size(record.evaluation_peak_bytes)}" if record.evaluation_peak_bytes is not None else ""
        return (
            f"evaluation seen at step {record.evaluation_step} ({record.evaluation_forwards} evaluation "
            f"forward(s){peak}); {record.steps} steps in all{saves}"
        )
    if record.bound == "unconfigured":
        return (
            f"the fit evaluates nothing (no validation_step with a val_dataloader, or an eval_strategy of 'no'): "
            f"{record.steps} training steps seen, as the real fit runs them{saves}"
        )
    if record.bound == "ended":
        return f"the command's whole run seen: it ended on its own after {record.steps} steps{saves}"
    every = (
        f"; {record.every_step_forwards} evaluation forward(s) in every step, covered by every step's reading"
        if record.every_step_forwards
        else ""
    )
    if not record.waited:
        return (
            f"no evaluation pass within {record.steps} steps (not waited for: an earlier trial saw none within "
            f"the bound){every}{saves}"
        )
    bound = (
        f"within {record.steps} steps"
        if record.bound != "seconds"
        else f"within search.cycle_seconds ({record.steps} steps)"
    )
    return (
        f"no evaluation pass {bound}: the answer covers training steps only; set search.cycle_steps (and "
        f"search.cycle_seconds) to reach the script's first evaluation{every}{saves}"
    )
