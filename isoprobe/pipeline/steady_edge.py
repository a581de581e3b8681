"""The long-run search: when the edge's confirmation failed after the search's steps, find the steady edge below.

The short search (``isoprobe.search.edge_search``) ends as soon as its maximum's
confirmation, run until its peak is steady, ran out of memory at a later step
or was still rising at the cap (``Conclusion.long_run_failure``). Every trial
from there on runs until steady (purpose ``long_run``), and the pure planner
(``long_run.next_long_run_batch``) chooses them: first below the failure by the
growth it measured, in samples of the search's memory line, doubling down until
one is steady, then bisecting. The answer is the largest batch proven steady,
and the smallest above it that was not; a short fit above it is never the answer.
"""

from __future__ import annotations

from isoprobe.pipeline.explain import Found
from isoprobe.pipeline.spread_rule import held_still
from isoprobe.pipeline.trials import TrialRunner
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.trial import Trial
from isoprobe.search import long_run
from isoprobe.search.edge_search import Conclusion
from isoprobe.search.history import Limits, not_reproduced
from isoprobe.search.margin import samples_to_clear
from isoprobe.search.steps import memory_line

#: A long-run trial that crashed or timed out runs again once (a fresh process may tell); then it is a failure.
_RETRIES = 1


def long_run_search(runner: TrialRunner, limits: Limits, conclusion: Conclusion) -> Found:
    """From the batch whose confirmation failed in the long run (or fit only inside the spread) down to the
    largest batch that is steady and clears the spread."""
    rule = runner.steady_rule
    failed = conclusion.long_run_failure
    if rule is None or failed is None:
        raise ValueError("a long-run search needs a steady rule and a long-run failure")
    deciding = _deciding_trial(runner, failed)
    ran: dict[int, bool] = {failed: False}
    # The first failing batch's outcome may be unknown (``Conclusion.first_failing_outcome``): kept as None.
    outcomes: dict[int, Outcome | None] = {failed: deciding.outcome}
    # A batch below that a deciding trial of the search already ran until steady is proven as a long-run trial
    # would prove it: it runs no second time (the 64-pixel Trainer: 91 stepped 7 steps, 6.8 MiB free, before 92
    # showed marginal, and then ran again).
    for below, proven in _steady_below(runner, failed).items():
        ran[below], outcomes[below] = proven, Outcome.FITS
    jump = _first_jump(runner, limits, conclusion, deciding, failed)
    flaky = set(conclusion.flaky)
    while (batch := long_run.next_long_run_batch(ran, jump)) is not None:
        attempts = []
        for _ in range(1 + _RETRIES):
            trial = runner.run(batch, "long_run", rule=runner.deciding_rule(batch))
            attempts.append(trial)
            if trial.outcome not in (Outcome.CRASHED, Outcome.TIMED_OUT):
                break
        if trial.outcome is Outcome.ERROR:
            return Found(StopReason.ERROR, _largest(ran), None, None, tuple(sorted(flaky)), short_max=failed)
        # As in the short search's verdicts: a batch fits only if every attempt fit, one crash or timeout that
        # the retry did not reproduce aside (``history.not_reproduced``: a process that died once is no evidence).
        fit_every_time = all(t.outcome is Outcome.FITS for t in attempts) or not_reproduced(
            [t.outcome for t in attempts]
        )
        if trial.outcome is Outcome.FITS and not fit_every_time:
            flaky.add(batch)
        ran[batch] = fit_every_time and not runner.observation(trial).long_run
        outcomes[batch] = trial.outcome if fit_every_time or trial.outcome is not Outcome.FITS else attempts[0].outcome
    return _steady_found(conclusion, ran, outcomes, flaky, failed, short=deciding.outcome is not Outcome.FITS)


def _deciding_trial(runner: TrialRunner, failed: int) -> Trial:
    """The trial that showed the long run failing at ``failed``, the latest of them: a steady one that failed or
    fit inside the spread, or a short one already inside it. Its outcome and steps say where the search starts."""
    return next(
        t
        for t in reversed(runner.trials)
        if t.batch_size == failed
        and t.training_batch_size is None
        and t.purpose != "memory_check"
        and (t.steady_rule is not None or runner.marginal(t))
    )


def _first_jump(runner: TrialRunner, limits: Limits, conclusion: Conclusion, deciding: Trial, failed: int) -> int:
    """How far below ``failed`` the first long-run trial goes, in samples, and the note that says why: a marginal
    fit needs the samples that clear the spread; a failure, the samples its measured growth would have taken."""
    line = memory_line(conclusion.history, limits)
    slope = line.slope if line else None
    if deciding.outcome is Outcome.FITS:  # marginal: it fit, but inside the spread
        margin = runner.margin_of(deciding)
        runner.reporter.note(
            f"searching below {failed} for the largest batch whose steady peak leaves more than the spread free"
        )
        return samples_to_clear(margin.free, margin.spread, slope) if margin else 1
    done = len(deciding.step_seconds)
    how = (
        f"still rising after {done} steps"
        if deciding.outcome is Outcome.STILL_RISING
        else f"{deciding.outcome.value} at step {done + 1}"
    )
    runner.reporter.note(
        f"batch {failed} fit {runner.spec.search.steps} steps but not the long run ({how}): "
        "searching below it with trials that run until their peak is steady"
    )
    return long_run.first_jump(deciding.step_budget_peak_bytes, runner.spec.search.steps, limits.capacity, slope)


def _steady_found(
    conclusion: Conclusion,
    ran: dict[int, bool],
    outcomes: dict[int, Outcome | None],
    flaky: set[int],
    failed: int,
    short: bool,
) -> Found:
    """The answer once no batch is left to run: the largest batch proven steady, and the smallest above it that
    failed (a fit above it that was only marginal is listed as marginal, never the answer). ``short``: the
    deciding trial failed (not merely marginal), so ``failed`` is the short search's maximum, reported as such."""
    lower = _largest(ran)
    above = [b for b, ok in ran.items() if not ok and (lower is None or b > lower)]
    failing = [b for b in above if outcomes[b] is not Outcome.FITS]
    if conclusion.first_failing is not None and (lower is None or conclusion.first_failing > lower):
        failing.append(conclusion.first_failing)
        outcomes.setdefault(conclusion.first_failing, conclusion.first_failing_outcome)
    marginal = tuple(sorted(b for b in above if outcomes[b] is Outcome.FITS))
    upper = min(failing) if failing else None
    upper_outcome = outcomes.get(upper) if upper is not None else None
    if lower is None:
        # Down to batch 1 (or an error), nothing held: its memory rose until it ran out or hit the step cap.
        return Found(
            StopReason.STILL_RISING,
            None,
            upper,
            upper_outcome,
            tuple(sorted(flaky)),
            short_max=failed,
            marginal=marginal,
        )
    return Found(
        StopReason.EDGE_FOUND,
        lower,
        upper,
        upper_outcome,
        tuple(sorted(flaky)),
        short_max=failed if short else None,
        marginal=marginal,
    )


def _steady_below(runner: TrialRunner, failed: int) -> dict[int, bool]:
    """The batches below ``failed`` that stepped until steady and fit, each with whether it is proven for the long
    run: every run of it fit, and none was marginal under the spread as it stands now."""
    runs: dict[int, list] = {}
    for trial in runner.same_question():
        if (
            trial.batch_size < failed
            and trial.training_batch_size is None
            and trial.purpose != "memory_check"
            and trial.allocator == runner.allocator_label
        ):
            runs.setdefault(trial.batch_size, []).append(trial)
    proven: dict[int, bool] = {}
    for batch, trials in runs.items():
        steady_fits = [t for t in trials if t.outcome is Outcome.FITS and held_still(t)]
        if steady_fits:
            proven[batch] = all(t.outcome is Outcome.FITS and runner.marginal(t) is None for t in trials)
    return proven


def _largest(ran: dict[int, bool]) -> int | None:
    fits = [b for b, ok in ran.items() if ok]
    return max(fits) if fits else None
