"""The recommended batch: advised from the fitting trials, then proven by a long run (its own soak, or the maximum's).

``headroom.advise`` (pure) picks the batch from the memory line and the
headroom; ``soak.judge`` (pure) reads a soak's per-step peaks;
``soak.proven_by_maximum`` (pure) says when the maximum's steady trial already
proves the batch. This module runs the trials they ask for: the soak of the
advised batch, and of a lower one each time a soak does not survive, so that the
batch reported is one that ran ``soak_steps`` steps and fit, or one below a
maximum that stepped until steady with the line and that run's growth inside the
headroom (recommendation.soak_steps null: a soak only where it adds evidence).

Every choice here is of the trials' values, never of their order (issue 56: a parallel search finishes them in
any order): the maximum's deciding trial is the one that grew most, a batch's measured peak its highest, and
``Recommendation.decided_by`` names what set the batch.
"""

from __future__ import annotations

from dataclasses import replace

from isoprobe.pipeline.environment import Target
from isoprobe.pipeline.explain import none_survived, why_soak_failed
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.insights import MemoryModel
from isoprobe.report.outcomes import Outcome
from isoprobe.report.recommendation import Recommendation, Soak
from isoprobe.report.trial import Trial
from isoprobe.search.headroom import advise
from isoprobe.search.insights import base_anchor, throughput
from isoprobe.search.soak import SoakJudgement, judge, lower_batch, proven_by_maximum, rise_noise_bytes
from isoprobe.spec.model import Spec
from isoprobe.spec.units import format_bytes

#: Soaks per probe at most: the advised batch and two lower ones. A third failure says the memory
#: keeps growing whatever the batch, which no batch size fixes: the recommendation is withdrawn.
MAX_SOAKS = 3
#: recommendation.soak_steps when the spec leaves it out, by backend (the field's description says why).
DEFAULT_SOAK_STEPS = {"cuda": 20, "cpu": 6}


def soak_steps(spec: Spec, backend: str) -> int:
    """The soak's length as applied: the spec's, else the backend's default."""
    steps = spec.recommendation.soak_steps
    return DEFAULT_SOAK_STEPS[backend] if steps is None else steps


def recommend(spec: Spec, target: Target, runner: TrialRunner, max_fitting: int) -> tuple[int | None, Recommendation]:
    """The recommended batch and how it was derived; (None, recommendation) when none survived its soak.

    Every peak here is in the capacity's units (``budget_peak``): on the CPU backend ``peak_bytes`` is the
    resident set, imports included, which is not what the cap counts, and a headroom measured against it
    recommended a third of the batch the headroom allowed (a convnet whose peaks read 118 MiB above the
    data segment's: 38 where 64 kept the headroom)."""
    # Only the trials of this question: with search.unit tokens, the binding length's (a line over several lengths
    # would mix memories that differ by more than the batch).
    under_budget = [t for t in runner.same_question() if t.purpose != "memory_check"]
    fitting = [(t.batch_size, peak) for t in under_budget if t.outcome is Outcome.FITS and (peak := budget_peak(t))]
    advice = advise(
        max_fitting,
        fitting,
        target.search_capacity,
        spec.recommendation.headroom,
        spec.recommendation.multiple_of,
        anchor=base_anchor(under_budget, up_to=max_fitting),
    )
    model = advice.line
    recommendation = Recommendation(
        capacity_bytes=advice.capacity_bytes,
        headroom_bytes=advice.headroom_bytes,
        target_peak_bytes=advice.target_peak_bytes,
        memory_model=MemoryModel(
            intercept_bytes=model.intercept,
            per_sample_bytes=model.slope,
            points=model.points,
            batch_sizes=list(advice.line_batches),
        )
        if model
        else None,
        multiple_of=spec.recommendation.multiple_of,
        predicted_peak_bytes=advice.predicted_peak_bytes,
        soak_steps=soak_steps(spec, target.backend),
        decided_by=advice.decided_by,
        note=advice.note,
    )
    batch = advice.batch_size
    if spec.recommendation.objective == "throughput":
        batch, recommendation = _prefer_throughput(spec, runner.same_question(), batch, recommendation)
    if recommendation.soak_steps == 0:
        return _unsoaked(runner, batch, recommendation)
    if (
        spec.recommendation.soak_steps is None
        and (proof := _maximum_proves(runner, batch, max_fitting, recommendation)) is not None
    ):
        return batch, proof
    return _soak(runner, batch, recommendation, model.slope if model else None)


def _maximum_proves(
    runner: TrialRunner, batch: int, max_fitting: int, recommendation: Recommendation
) -> Recommendation | None:
    """The recommendation proven by the maximum's steady trial (no soak of its own), or None when a soak must run.

    A soak of a batch below the maximum re-proves what the maximum's deciding trial showed: it stepped until its
    peak held still, at a larger batch (memory rises with the batch). What the maximum does not show is whether
    the smaller batch keeps the headroom in the long run; the line predicts its peak, and the growth the maximum's
    run showed after the search's steps is added to that (``soak.proven_by_maximum``)."""
    deciding = [
        t
        for t in runner.same_question()
        if t.batch_size == max_fitting
        and t.steady_rule is not None
        and t.outcome is Outcome.FITS
        and t.training_batch_size is None
        and t.purpose != "memory_check"
    ]
    if not deciding:
        return None
    short = runner.spec.search.steps
    trial = max(
        deciding,
        key=lambda t: (
            _growth_after(step_budget_peaks(t), short),
            len(step_budget_peaks(t)),
            budget_peak(t) or 0,
            t.index,
        ),
    )  # the most it grew, whatever ran first
    peaks = step_budget_peaks(trial)
    proof = proven_by_maximum(
        batch, max_fitting, peaks, short, recommendation.predicted_peak_bytes, recommendation.target_peak_bytes
    )
    if proof is None:
        return None
    grew = _growth_after(peaks, short)
    noise = (
        f" (it rose {format_bytes(grew)}, within the {format_bytes(rise_noise_bytes(peaks[-1]))} a soak too "
        "calls noise)"
        if grew and not proof.growth_bytes
        else ""
    )
    return recommendation.model_copy(
        update={
            "soak_steps": 0,
            "proven_by_trial": trial.index,
            "measured_peak_bytes": _measured_at(runner, batch),
            "note": f"{recommendation.note}; no soak of its own: the maximum {max_fitting} stepped {len(peaks)} steps "
            f"until its peak held still (trial {trial.index}), and memory rises with the batch; {batch}'s "
            f"predicted peak {format_bytes(proof.predicted_bytes)} plus the {format_bytes(proof.growth_bytes)} "
            f"the maximum grew after step {short}{noise} stays within the target "
            f"{format_bytes(recommendation.target_peak_bytes)} (recommendation.soak_steps: N soaks it anyway)",
        }
    )


def _growth_after(peaks: list[int], short_steps: int) -> int:
    """How far a running peak rose after the search's ``short_steps`` (0 with fewer readings)."""
    return max(0, peaks[-1] - peaks[short_steps - 1]) if short_steps >= 1 and len(peaks) >= short_steps else 0


def _measured_at(runner: TrialRunner, batch: int) -> int | None:
    trial = _fitting_at(runner, batch)
    return budget_peak(trial) if trial else None


def _unsoaked(runner: TrialRunner, batch: int, recommendation: Recommendation) -> tuple[int | None, Recommendation]:
    """soak_steps 0: no trial at all (issue 34: it once ran the batch when no trial had). The batch is at or below
    the maximum, which fit; its measured peak is a search trial's where one ran it, else none."""
    measured = _fitting_at(runner, batch)
    ran = f"a search trial ran {batch}" if measured else f"no trial ran {batch}: its peak is the line's prediction"
    return batch, recommendation.model_copy(
        update={
            "note": f"{recommendation.note}; not soaked (recommendation.soak_steps 0): {ran}",
            "measured_peak_bytes": budget_peak(measured) if measured else None,
        }
    )


def _soak(
    runner: TrialRunner, batch: int, recommendation: Recommendation, per_sample: float | None
) -> tuple[int | None, Recommendation]:
    """Soak ``batch``; move down while a soak does not survive. Every soak is kept, with its evidence."""
    steps, target_peak = recommendation.soak_steps, recommendation.target_peak_bytes
    soaks: list[Soak] = []
    notes: list[str] = []
    retried = False
    while len(soaks) < MAX_SOAKS:
        trial = runner.run(batch, purpose="soak", steps=steps)
        if trial.outcome in (Outcome.CRASHED, Outcome.TIMED_OUT) and not retried:
            retried = True  # no evidence about memory: once more, in a fresh process
            trial = runner.run(batch, purpose="soak", steps=steps)
        fits = trial.outcome is Outcome.FITS
        judged = _judge_soak(trial, fits, steps, target_peak)
        soaks.append(
            Soak(
                batch_size=batch,
                trial=trial.index,
                outcome=trial.outcome,
                steps_completed=len(step_budget_peaks(trial)),
                growth_bytes_per_step=judged.growth_bytes_per_step,
                still_rising=judged.still_rising,
                projected_peak_bytes=judged.projected_peak_bytes,
                survived=judged.survived,
            )
        )
        if judged.survived:
            rising = " (its peak was still rising: a longer run may need more)" if judged.still_rising else ""
            notes.append(f"{batch} survived a soak of {steps} steps{rising}")
            if len(soaks) > 1:
                recommendation = recommendation.model_copy(update={"decided_by": "soak"})
            return batch, _with(recommendation, soaks, notes, budget_peak(trial))
        if trial.outcome not in (Outcome.FITS, Outcome.OUT_OF_MEMORY):
            twice = " twice" if trial.outcome in (Outcome.CRASHED, Outcome.TIMED_OUT) else ""  # an error: once
            notes.append(
                f"the soak of {batch} ended {trial.outcome.value}{twice}: no batch is recommended without "
                "a soak that survived"
            )
            return None, _with(recommendation, soaks, notes, None)
        lower = lower_batch(batch, judged, per_sample, target_peak, recommendation.multiple_of)
        why = why_soak_failed(soaks[-1], step_budget_peaks(trial), steps, target_peak, _fit_at_or_above(runner, batch))
        notes.append(f"the soak of {batch} {why}, so {lower or 'nothing'} next")
        if lower < 1:
            break
        batch = lower
    notes.append(none_survived(soaks, runner.trials)[0])
    return None, _with(recommendation, soaks, notes, None)


def budget_peak(trial: Trial) -> int | None:
    """A trial's peak in the capacity's units: the budget's where the trial reported it, else its peak."""
    return trial.budget_peak_bytes if trial.budget_peak_bytes is not None else trial.peak_bytes


def _judge_soak(trial: Trial, fits: bool, steps: int, target_peak: int) -> SoakJudgement:
    """``soak.judge`` on the soak's training steps; a command soak that saw the script's evaluation pass
    (``report.cycle``) is judged for growth on the steps before it (the pass lifts the running peak once: a phase,
    not growth), and its peak with the pass must stay on the line too: the headroom is the whole cycle's."""
    peaks = step_budget_peaks(trial)
    step = trial.cycle.evaluation_step if trial.cycle is not None else None
    if step is None or step <= 3:
        return judge(fits, steps, peaks, target_peak)
    training = peaks[: step - 1]
    judged = judge(fits, min(steps, len(training)), training, target_peak)
    if judged.survived and peaks and max(peaks) > target_peak:
        return replace(judged, survived=False, projected_peak_bytes=max(peaks))
    return judged


def step_budget_peaks(trial: Trial) -> list[int]:
    """The running peak after each step, in the capacity's units (see ``budget_peak``)."""
    return trial.step_budget_peak_bytes or trial.step_peak_bytes


def _fit_at_or_above(runner: TrialRunner, batch: int) -> Trial | None:
    """The search's largest fitting trial at ``batch`` or above: what a soak that failed at its first step differs
    from."""
    fits = [
        t
        for t in runner.same_question()
        if t.purpose in ("search", "retry", "confirmation", "long_run")
        and t.outcome is Outcome.FITS
        and t.batch_size >= batch
    ]
    return max(fits, key=lambda t: (t.batch_size, t.index)) if fits else None


def _with(recommendation: Recommendation, soaks: list[Soak], notes: list[str], peak: int | None) -> Recommendation:
    survived = bool(soaks) and soaks[-1].survived
    return recommendation.model_copy(
        update={
            "soaks": soaks,
            "soaked": survived,
            "measured_peak_bytes": peak,
            "decided_by": recommendation.decided_by if survived else "soak",
            "note": "; ".join([recommendation.note, *notes]),
        }
    )


def _fitting_at(runner: TrialRunner, batch: int) -> Trial | None:
    """The fitting trial at ``batch`` with the highest peak (not the first that ran: the same trials, one answer)."""
    fits = [
        t
        for t in runner.same_question()
        if t.purpose != "memory_check" and t.batch_size == batch and t.outcome is Outcome.FITS
    ]
    return max(fits, key=lambda t: (budget_peak(t) or 0, t.index), default=None)


def _prefer_throughput(
    spec: Spec, trials: list[Trial], recommended: int, recommendation: Recommendation
) -> tuple[int, Recommendation]:
    """objective: throughput: the smallest tested batch within the headroom that is about as fast as the best."""
    within = [t for t in trials if t.batch_size <= recommended]
    curve = throughput(within, spec.recommendation.throughput_tolerance)
    if curve is None or curve.fastest_batch_size >= recommended:
        return recommended, recommendation
    fastest = curve.fastest_batch_size
    note = (
        f"{recommendation.note}; objective throughput: {fastest} runs within "
        f"{spec.recommendation.throughput_tolerance:.0%} of the best samples/s measured up to {recommended} "
        "(measured speed: another run's timings may choose another batch)"
    )
    measured = max((peak for t in trials if t.batch_size == fastest and (peak := budget_peak(t))), default=None)
    return fastest, recommendation.model_copy(
        update={"note": note, "measured_peak_bytes": measured, "decided_by": "throughput"}
    )
