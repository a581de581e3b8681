"""The edge search: a pure function of what the trials have shown so far.

No processes, no torch, no clock. ``plan_next`` looks at the history of
observations and names the next batch to try (or None when the answer is
known); ``conclude`` reads the answer off the same history. ``run_search``
is the loop that joins them to an oracle, so tests drive it with scripted and
flaky oracles and the product drives it with real child processes.

Strategy: ``plan_next`` owns what every strategy shares (begin at the start,
retry a crash or timeout, stop on an error, prove the maximum once the bracket
is closed, stop when a deciding trial failed in the long run); a *step* only picks
the next batch strictly inside the open bracket. Each proof runs once
(``Limits.steady``, the product's): the trial that would be the maximum if it fit
(``decides``: right below the smallest failure) steps until its peak is steady, so
the trial that fits first at the edge proves it; a maximum whose only fit was a
short trial runs once more, until steady; ``Limits.confirmations`` asks for that
many runs after the first fit (``proofs_due``). Two steps exist:
- ``doubling_step``, the classic: double until the first failure or a cap, then
  bisect until the largest batch that fits and the smallest that fails are
  adjacent;
- ``guided_step`` (the default): peak memory is close to ``a + k·batch``, so it
  fits that line to the peaks the fitting trials measured, jumps next to the
  edge the line predicts against the memory capacity, and checks the edge pair
  there. Safeguards make a wrong line (noise, a cuDNN workspace jump, a
  capacity in the wrong units) cost at most about twice the classic's trials;
  with no capacity or no readings it *is* the classic.
Either way the answer is the same exact edge: a step only chooses where to
look, the verdicts decide. The pieces: ``search.history.py`` (observations,
limits, verdicts and the bracket), ``search.steps.py`` (the two steps, the
memory line and the prior), this module (the plan, the conclusion, the loop),
and ``search.parallel.py`` (several batches a round, for parallel slots).

A *prior* (``Limits.prior``: the line traced before any trial, ``child.core.estimate``)
only moves where the guided search looks: the first trial goes to the prior's
edge instead of the start (``first_batch``), stepping until steady, so that it
decides the maximum if it fits: two trials when the estimate is exact. If it
ran out, a miss corrects the model (issue 49): the next trial assumes the
estimate ``steps.ERROR_BOUND`` high (``miss_descent``), where a fit is all but
certain, and the line through its reading, steepened to what the failure proves,
finds the edge (``corrected_line``): four trials for an estimate up to 50 % high.
A high estimate costs trials, never the answer. Without a prior the first trials
are as they were; a miss inside a bracket is corrected the same way. Before the
issue (``Limits.correct_misses`` off, kept for the simulation): one above the
prior's edge, then the edge, then one below it, then ``DESCENT``.

A batch may be tried more than once, so each batch gets one *verdict* from
all its attempts:
- it **fits** only if every attempt fit (a batch that sometimes fails is not
  one to run overnight), but for one crash or timeout that a fresh run did not
  reproduce: a process that died once says nothing about the batch
  (``history.not_reproduced``);
- any **error** (a non-memory exception: a bug) stops the search at once;
- a **crash** or **timeout** is no verdict yet: the batch is tried again in a
  fresh process, up to ``retries`` times; if it persists, the batch *fails*
  with that class (never silently as out of memory);
- otherwise it **fails**: out of memory if any attempt ran out of memory, else
  still rising (a deciding trial's peak never held still, ``steady``), else
  the class of its last failure. A batch with both fitting and failing
  attempts is *flaky*.
Which outcome is a fit, an error, retried or decisive is declared once, in
``report.outcomes.MEANINGS``; this module and ``history`` only read it.
Only fitting batches raise the lower bound and only failing batches lower the
upper bound, so the answer is always a batch that fit every time it ran, and a
flaky or crashing batch can only make the answer smaller, never larger.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.search.frontier_bounds import bracket
from isoprobe.search.history import Limits, Observation, bounds, proofs_due, verdicts
from isoprobe.search.steps import (
    DESCENT,
    Step,
    edge_first,
    first_batch,
    guided_step,
    miss_descent,
    predicted_marginal,
    probes_the_edge,
)


def plan_next(history: Sequence[Observation], limits: Limits, step: Step | None = None) -> int | None:
    """The next batch to try, or None when the history already holds the answer.

    What every strategy shares lives here: stop on an error, retry a crash or
    timeout first, begin at the start, and confirm the maximum once the bracket
    is closed. ``step`` (default ``guided_step``) only chooses the next batch
    strictly inside the open bracket: above ``lower``, and below ``upper`` or at
    most the largest allowed batch.
    """
    step = guided_step if step is None else step
    history = tuple(history)
    judged = verdicts(history, limits)
    if any(v.outcome is not None and v.outcome.meaning.stops_search for v in judged.values()):
        return None
    if any(v.long_run for v in judged.values()):
        return None  # the maximum failed in the long run: the short search is over (probe.steady_edge goes on)
    pending = [b for b, v in judged.items() if v.outcome is None]
    if pending:
        return min(pending)  # retry a crash or timeout before moving on
    lower, upper = bracket(history, limits)  # this point's bounds, narrowed by borrowed ones (a frontier's)
    if lower is None:
        if upper is None:
            return first_batch(limits)
        if upper not in judged:  # only a borrowed failure: go below it, where the first trial would have gone
            return max(limits.start, min(first_batch(limits), upper - 1))
        if limits.prior is None and limits.start not in judged and upper > limits.start:
            return limits.start  # a borrowed fit failed here (the direction was wrong): the classic start, as alone
        # Nothing fit yet. Without a prior the start failed: nothing fits. With one, the predicted edge ran out: the
        # estimate was high, and a miss corrects the model (miss_descent, issue 49), not one sample down. With
        # Limits.correct_misses off (the search before it, for the simulation): the first trial was one above the
        # predicted edge, the edge next, then one below it, then DESCENT.
        if limits.prior is None or upper <= limits.start:
            return None
        failed = sum(1 for v in judged.values() if v.outcome is not None and not v.outcome.meaning.fits)
        if limits.correct_misses:
            return miss_descent(limits, upper, failed)
        if failed <= 2 and upper > limits.start:  # the first trial, or it and the predicted edge, failed
            return upper - 1
        return max(limits.start, min(upper - 1, math.floor(upper * DESCENT)))
    if (upper is None and lower < limits.highest) or (upper is not None and upper - lower > 1):
        batch = step(history, limits, lower, upper)
        ceiling = limits.highest if upper is None else upper - 1
        if not lower < batch <= ceiling:
            raise AssertionError(f"step proposed {batch} outside the open bracket ({lower}, {ceiling}]")
        return batch
    # The bracket is closed. A bound borrowed from another frontier point is proven here before it counts:
    # the maximum must have fit at this point, and the failure above it run out of memory at this point.
    if lower not in judged:
        return lower
    if upper is not None and upper not in judged:
        return upper
    # Prove the maximum before answering: ``confirmations`` runs after its first fit, and with ``limits.steady`` a
    # run that stepped until steady (the first fit itself, where it was asked to decide: ``decides``).
    return lower if proofs_due(judged[lower], limits) > 0 else None


def decides(history: Sequence[Observation], limits: Limits, batch: int) -> bool:
    """Whether a trial of ``batch`` should step until its peak is steady: with ``limits.steady``, when a fit would
    make it the maximum (the batch right below the smallest failure, or the largest allowed), or it is the maximum
    run again. The trial that fits first at the edge is then its proof, and no second process runs it; every other
    trial stays short (its fit only moves the lower bound, which the deciding trial above it proves again)."""
    if not limits.steady:
        return False
    lower, upper = bracket(history, limits)
    if lower is not None and batch <= lower:
        return True
    ceiling = limits.highest if upper is None else upper - 1
    # Before anything failed, the guided step's check right above the predicted edge: a fit there is most likely
    # the edge (a line a sample low), and a short fit would have to run again, in a second process, once the batch
    # above it failed. A failure there costs nothing more; a fit that is not the edge, the window's extra steps.
    # Inside a bracket (issue 49), the check above the corrected line's edge where that line says it fits, but inside
    # the margin: a short fit there would be marginal at best, and tell nothing (``steps.predicted_marginal``).
    # With a prior (issue 49), its predicted edge, the first trial: a fit there is the maximum when the estimate is
    # exact, the common case it is built for; when it is low, the window's extra steps are the cost.
    first_at_prior = (
        limits.correct_misses
        and limits.prior is not None
        and lower is None
        and upper is None
        and batch == first_batch(limits)
    )
    return (
        batch >= ceiling
        or first_at_prior
        or batch == edge_first(history, limits)
        or (upper is None and probes_the_edge(history, limits, batch))
        or (upper is not None and predicted_marginal(history, limits, batch))
    )


@dataclass(frozen=True)
class Conclusion:
    """The search's answer, read off the history."""

    stop: StopReason
    max_fitting: int | None  # largest batch that fit every time it ran
    first_failing: int | None  # smallest failing batch above it
    first_failing_outcome: Outcome | None = None
    flaky: tuple[int, ...] = ()  # batches that both fit and failed
    history: tuple[Observation, ...] = field(default=())

    long_run_failure: int | None = None  # the confirmation that failed in the long run: the steady search's start

    @property
    def exact(self) -> bool:
        """True when ``max_fitting`` is proven to be the largest allowed batch that fits."""
        return self.stop in (StopReason.EDGE_FOUND, StopReason.CAPPED) and self.long_run_failure is None


@dataclass(frozen=True)
class Progress:
    """What a history shows so far, finished or not (an interrupted search reports this)."""

    max_fitting: int | None
    first_failing: int | None
    first_failing_outcome: Outcome | None
    flaky: tuple[int, ...]


def progress(history: Sequence[Observation], limits: Limits) -> Progress:
    """The bounds, how the upper one failed, and the flaky batches, from any history."""
    judged = verdicts(history, limits)
    lower, upper = bounds(history, limits)
    return Progress(
        lower,
        upper,
        judged[upper].outcome if upper is not None else None,
        tuple(sorted(b for b, v in judged.items() if v.flaky)),
    )


def conclude(history: Sequence[Observation], limits: Limits) -> Conclusion:
    """Read the answer off a finished history; raise ValueError for an unfinished one.

    An interrupted search has no conclusion: ``progress`` tells what is known so far.
    """
    history = tuple(history)
    if not history:
        raise ValueError("no trial has run yet")
    judged = verdicts(history, limits)
    known = progress(history, limits)
    lower, upper_outcome = known.max_fitting, known.first_failing_outcome

    def answer(stop: StopReason) -> Conclusion:
        return Conclusion(stop, lower, known.first_failing, upper_outcome, known.flaky, history)

    errors = [b for b, v in judged.items() if v.outcome is not None and v.outcome.meaning.stops_search]
    if errors:
        return answer(StopReason.ERROR)
    long_run = [b for b, v in judged.items() if v.long_run]
    if long_run:
        # Not an answer yet: the short trials' edge did not hold in the long run, the steady search goes on.
        return replace(answer(StopReason.EDGE_FOUND), long_run_failure=min(long_run))
    if plan_next(history, limits) is not None:
        raise ValueError("the search is not finished")
    if lower is None:  # nothing fits: the stop its smallest failure leads to (out of memory: the start does not fit)
        stop = upper_outcome.meaning.stop if upper_outcome is not None else None
        return answer(stop or StopReason.START_DOES_NOT_FIT)
    return answer(StopReason.CAPPED if known.first_failing is None else StopReason.EDGE_FOUND)


def run_search(
    oracle: Callable[..., Observation],  # oracle(batch), or oracle(batch, deciding) with limits.steady
    limits: Limits,
    history: list[Observation] | None = None,
    step: Step | None = None,
    margin: Callable[[], int] | None = None,
) -> Conclusion:
    """Ask the oracle until the answer is known.

    With ``limits.steady`` the oracle is called as ``oracle(batch, deciding)``: ``deciding`` (``decides``) asks it to
    step until the peak is steady, and the observation it returns says whether it did (``Observation.steady``).
    ``history`` (appended to in place) lets a caller keep the trials so far when
    the loop is interrupted, and resume from them. ``margin``: the least a maximum must leave free as the trials so
    far measured it (a command's floor is its heap churn, read once a trial near the edge has fit), asked before
    each trial and taken as ``limits.margin``; it moves where the search looks, never a verdict (issue 49: with the
    floor of the start, the Lightning script's line checked 39 and 38 where 38 was inside the floor it measured).
    """
    history = [] if history is None else history
    while True:
        if margin is not None:
            limits = replace(limits, margin=margin())
        if (batch := plan_next(history, limits, step)) is None:
            break
        if sum(o.batch_size == batch for o in history) >= limits.most_attempts:
            raise AssertionError(f"the planner proposed batch {batch} more than {limits.most_attempts} times")
        observation = oracle(batch, decides(history, limits, batch)) if limits.steady else oracle(batch)
        if observation.batch_size != batch:
            raise AssertionError(f"asked for batch {batch}, the oracle answered for {observation.batch_size}")
        history.append(observation)
    return conclude(history, limits)
