"""The edge search with several trials per round: up to N batches at once, one per slot (GPU or CPU budget).

Still a pure function of the history (no processes, no clock). ``plan_round``
asks the sequential planner (``search.plan_next``) for the batch it would try
next, then fills the other slots with batches that can only help:
- every batch whose crash or timeout still needs a retry;
- before the first failure, a ladder above the largest batch that fit
  (2x, 4x, ...: a doubling search's next rounds, at once);
- inside a bracket, the guided step's edge pair (its proposal and the batch
  below it) and evenly spaced points (a k-ary split instead of a bisection);
  when the bracket has no more interior batches than free slots, all of them,
  and the spare slots run the likely maximum again (its confirmation, in the
  same round);
- once the bracket is closed, the proofs still due, at once.

With ``Limits.steady`` each slot's batch that would be the maximum if it fit
(``search.decides``, or the same batch twice in a round) steps until steady
(``round_deciding``), as in the sequential search.

The answer is read by ``search.conclude`` from the same verdicts as ever, so
the guarantees do not change: a batch counts as fitting only if every one of
its runs fit, a failure (a crash in one slot included: it is retried in the
next round) can only lower the answer, and the search ends only when the
sequential planner has nothing left to ask (the edge pair adjacent and the
maximum confirmed). Extra batches cost slots, never correctness. No batch is
planned more often than ``Limits.most_attempts`` in all.

Each observation joins the history as soon as its trial ends (in the order
they end, which the verdicts do not depend on), so a search interrupted
mid-round keeps what the ended trials proved; the next round is planned once
the whole round is in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from isoprobe.search.edge_search import Conclusion, conclude, decides, plan_next
from isoprobe.search.history import Limits, Observation, bounds, proofs_due, verdicts
from isoprobe.search.steps import Step


def plan_round(history: Sequence[Observation], limits: Limits, slots: int, step: Step | None = None) -> list[int]:
    """Up to ``slots`` batches to run at once next (a batch may repeat: its confirmations); [] when done."""
    if slots < 1:
        raise ValueError("slots must be >= 1")
    history = tuple(history)
    first = plan_next(history, limits, step)
    if first is None:
        return []
    planned = [first]
    tried = Counter(o.batch_size for o in history)

    def add(batch: int) -> None:
        if (
            len(planned) < slots
            and 1 <= batch <= limits.highest
            and tried[batch] + planned.count(batch) < limits.most_attempts
        ):
            planned.append(batch)

    judged = verdicts(history, limits)
    for batch in sorted(b for b, v in judged.items() if v.outcome is None):  # retries due
        if batch not in planned:
            add(batch)
    lower, upper = bounds(history, limits)
    if lower is None:
        if upper is None:  # the first round: the start and a doubling ladder above it
            _ladder(first, limits, add)
        return planned
    if upper is None:  # nothing failed above the largest fit yet
        if first != lower:
            _ladder(first, limits, add)
        return planned
    interior = list(range(lower + 1, upper))
    if not interior:  # closed: the proofs still due, all at once
        due = proofs_due(judged[lower], limits)
        for _ in range(due - planned.count(lower)):
            add(lower)
        return planned
    if first - 1 in interior and first - 1 not in planned:
        add(first - 1)  # the guided step's edge pair: it proposes e + 1, then e
    free = slots - len(planned)
    fresh = [b for b in interior if b not in planned]
    if len(fresh) <= free:
        for batch in fresh:
            add(batch)
        for batch in sorted(set(planned) & set(interior), reverse=True) * limits.confirmations:
            add(batch)  # spare slots: the likely maximum's confirmation in the same round
        if lower not in planned and proofs_due(judged[lower], limits) > 0:
            add(lower)
        return planned
    for i in range(1, free + 1):  # a k-ary split of what is left of the bracket
        batch = lower + round(i * (upper - lower) / (free + 1))
        if batch in interior and batch not in planned:
            add(batch)
    return planned


def round_deciding(history: Sequence[Observation], limits: Limits, batches: list[int]) -> list[bool]:
    """Which of a round's batches step until steady: those that would decide the maximum if they fit
    (``decides``, against the history before the round), and a batch's second run in the same round."""
    return [decides(history, limits, batch) or batch in batches[:slot] for slot, batch in enumerate(batches)]


def _ladder(base: int, limits: Limits, add: Callable[[int], None]) -> None:
    batch = base
    while batch < limits.highest:
        batch = min(2 * batch, limits.highest)
        add(batch)


@dataclass(frozen=True)
class ParallelConclusion:
    conclusion: Conclusion
    rounds: int


#: Told one slot's observation as soon as it is known: ``observed(slot, observation)``.
Observed = Callable[[int, Observation], None]
#: Runs one round's batches at once and tells ``observed`` each slot's observation as it comes: ``oracle(batches,
#: observed)``, or with ``Limits.steady`` ``oracle(batches, observed, deciding)`` (hence the open arguments).
RoundOracle = Callable[..., None]


def run_parallel_search(
    oracle: RoundOracle,
    limits: Limits,
    slots: int,
    history: list[Observation] | None = None,
    step: Step | None = None,
) -> ParallelConclusion:
    """Run rounds of at most ``slots`` trials until the answer is known; the conclusion and the rounds it took.

    ``oracle(batches, observed)`` runs one round and calls ``observed(slot,
    observation)`` once per slot (with ``limits.steady``: ``oracle(batches, observed, deciding)``, which slots
    step until steady), in whatever order the trials end. Each
    observation joins ``history`` (appended to in place) the moment it is told,
    so a search interrupted mid-round keeps every trial that had ended
    (``search.progress`` reads what they proved); the next round is planned
    only once the whole round is in.
    """
    history = [] if history is None else history
    rounds = 0
    while batches := plan_round(history, limits, slots, step):
        answered: list[Observation | None] = [None] * len(batches)
        observed = _recorder(batches, answered, history)
        if limits.steady:
            oracle(batches, observed, round_deciding(history, limits, batches))
        else:
            oracle(batches, observed)
        if None in answered:
            raise AssertionError(f"asked for batches {batches}, the oracle answered {answered}")
        rounds += 1
        if any(o is not None and o.outcome.meaning.stops_search for o in answered):
            break  # a bug in the model: conclude says error
    return ParallelConclusion(conclude(history, limits), rounds)


def _recorder(batches: list[int], answered: list[Observation | None], history: list[Observation]) -> Observed:
    """The ``observed`` of one round: each slot answers once, for its own batch, and joins the history at once.
    Built per round (not a closure in the loop) so that it holds that round's lists, not the loop's latest."""

    def observed(slot: int, observation: Observation) -> None:
        if answered[slot] is not None or observation.batch_size != batches[slot]:
            raise AssertionError(f"slot {slot} of round {batches} answered {observation}, after {answered[slot]}")
        answered[slot] = observation
        history.append(observation)

    return observed


def one_at_a_time(oracle: Callable[[int], Observation]) -> RoundOracle:
    """A round oracle from a batch oracle: the round's batches one after another (simulations, tests)."""

    def run(batches: list[int], observed: Observed) -> None:
        for slot, batch in enumerate(batches):
            observed(slot, oracle(batch))

    return run
