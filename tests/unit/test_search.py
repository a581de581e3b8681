"""The edge search, driven by scripted oracles: no processes, no torch."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isoprobe.outcomes import Outcome
from isoprobe.search import (
    DEFAULT_CEILING,
    Conclusion,
    Limits,
    Observation,
    Stop,
    conclude,
    plan_next,
    run_search,
)

FITS = Outcome.FITS
OOM = Outcome.OUT_OF_MEMORY


class ThresholdOracle:
    """Monotone memory: every batch up to ``threshold`` fits, every batch above runs out of memory.

    Records every batch it was asked, in order, and what it answered.
    """

    def __init__(self, threshold: int, fail_at_call: int | None = None, failure: Outcome | None = None):
        self.threshold = threshold
        self.fail_at_call = fail_at_call  # 1-based call that returns ``failure`` instead of a memory verdict
        self.failure = failure
        self.asked: list[int] = []
        self.answers: dict[int, Outcome] = {}

    def __call__(self, batch: int) -> Observation:
        self.asked.append(batch)
        if self.fail_at_call is not None and len(self.asked) == self.fail_at_call:
            outcome = self.failure
        else:
            outcome = FITS if batch <= self.threshold else OOM
        self.answers[batch] = outcome
        peak = 1000 + 10 * batch if outcome is FITS else None
        return Observation(batch, outcome, peak)


def obs(batch: int, outcome: Outcome) -> Observation:
    return Observation(batch, outcome)


# --------------------------------------------------------------------------- properties of run_search

caps = st.one_of(st.none(), st.integers(min_value=0, max_value=6000))


@settings(max_examples=300, deadline=None)
@given(start=st.integers(1, 64), threshold=st.integers(0, 5000), cap_offset=caps)
def test_run_search_finds_exactly_the_edge(start, threshold, cap_offset):
    cap = None if cap_offset is None else start + cap_offset
    limits = Limits(start=start, cap=cap)
    oracle = ThresholdOracle(threshold)

    conclusion = run_search(oracle, limits)

    highest = DEFAULT_CEILING if cap is None else cap
    # Never above the cap, never the same batch twice, never below 1.
    assert all(1 <= b <= highest for b in oracle.asked)
    assert len(oracle.asked) == len(set(oracle.asked))
    # The history is exactly what the oracle was asked, in order.
    assert [o.batch_size for o in conclusion.history] == oracle.asked

    if threshold < start:
        assert conclusion.stop is Stop.START_DOES_NOT_FIT
        assert conclusion.max_fitting is None
        assert conclusion.first_failing == start
        assert oracle.asked == [start]
        assert not conclusion.exact
        return

    expected = min(threshold, highest)
    assert conclusion.max_fitting == expected
    # The answer was tried and fit: never reported untested.
    assert conclusion.max_fitting in oracle.answers
    assert oracle.answers[conclusion.max_fitting] is FITS
    assert conclusion.exact
    if threshold >= highest:
        assert conclusion.stop is Stop.CAPPED
        assert conclusion.first_failing is None
    else:
        assert conclusion.stop is Stop.EDGE_FOUND
        assert conclusion.first_failing == conclusion.max_fitting + 1
        assert oracle.answers[conclusion.first_failing] is OOM


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1, 64),
    threshold=st.integers(0, 5000),
    cap_offset=caps,
    ceiling_offset=st.integers(0, 3000),
)
def test_run_search_respects_a_small_ceiling(start, threshold, cap_offset, ceiling_offset):
    cap = None if cap_offset is None else start + cap_offset
    ceiling = start + ceiling_offset
    limits = Limits(start=start, cap=cap, ceiling=ceiling)
    oracle = ThresholdOracle(threshold)

    conclusion = run_search(oracle, limits)

    highest = ceiling if cap is None else min(cap, ceiling)
    assert limits.highest == highest
    assert max(oracle.asked) <= highest
    assert len(oracle.asked) == len(set(oracle.asked))
    if threshold < start:
        assert conclusion.stop is Stop.START_DOES_NOT_FIT
    elif threshold >= highest:
        assert conclusion.stop is Stop.CAPPED
        assert conclusion.max_fitting == highest
    else:
        assert conclusion.stop is Stop.EDGE_FOUND
        assert (conclusion.max_fitting, conclusion.first_failing) == (threshold, threshold + 1)


@settings(max_examples=200, deadline=None)
@given(start=st.integers(1, 64), threshold=st.integers(1, 5000))
def test_trial_count_is_logarithmic(start, threshold):
    oracle = ThresholdOracle(threshold)
    run_search(oracle, Limits(start=start))
    # Doubling to the first failure, then bisecting: about 2 * log2(threshold / start) + 2 trials.
    bound = 2 * math.ceil(math.log2(max(threshold, 2))) + 2
    assert len(oracle.asked) <= bound


def test_trial_count_for_515_from_2():
    oracle = ThresholdOracle(515)
    conclusion = run_search(oracle, Limits(start=2))
    assert conclusion.stop is Stop.EDGE_FOUND
    assert (conclusion.max_fitting, conclusion.first_failing) == (515, 516)
    assert len(oracle.asked) <= 2 * math.ceil(math.log2(515)) + 2
    # Doubling goes 2, 4, ..., 512, 1024, then bisects between 512 and 1024.
    assert oracle.asked[:10] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def test_cap_that_fits_is_the_answer_and_is_tried():
    oracle = ThresholdOracle(10_000)
    conclusion = run_search(oracle, Limits(start=2, cap=100))
    assert conclusion.stop is Stop.CAPPED
    assert conclusion.max_fitting == 100
    assert conclusion.first_failing is None
    assert oracle.asked == [2, 4, 8, 16, 32, 64, 100]


def test_cap_equal_to_start():
    oracle = ThresholdOracle(10_000)
    conclusion = run_search(oracle, Limits(start=8, cap=8))
    assert conclusion.stop is Stop.CAPPED
    assert conclusion.max_fitting == 8
    assert oracle.asked == [8]


def test_default_ceiling_stops_a_model_that_always_fits():
    oracle = ThresholdOracle(10**12)
    conclusion = run_search(oracle, Limits())
    assert conclusion.stop is Stop.CAPPED
    assert conclusion.max_fitting == DEFAULT_CEILING
    assert max(oracle.asked) == DEFAULT_CEILING
    assert len(oracle.asked) <= 25  # 2, 4, ..., 2**24


def test_default_ceiling_from_an_odd_start_lands_on_the_ceiling():
    oracle = ThresholdOracle(10**12)
    conclusion = run_search(oracle, Limits(start=3))
    assert conclusion.max_fitting == DEFAULT_CEILING
    assert oracle.asked[-1] == DEFAULT_CEILING
    assert all(b <= DEFAULT_CEILING for b in oracle.asked)


def test_start_does_not_fit():
    oracle = ThresholdOracle(0)
    conclusion = run_search(oracle, Limits(start=1))
    assert conclusion.stop is Stop.START_DOES_NOT_FIT
    assert (conclusion.max_fitting, conclusion.first_failing) == (None, 1)
    assert oracle.asked == [1]


def test_start_fits_but_start_plus_one_does_not():
    oracle = ThresholdOracle(2)
    conclusion = run_search(oracle, Limits(start=2))
    assert conclusion.stop is Stop.EDGE_FOUND
    assert (conclusion.max_fitting, conclusion.first_failing) == (2, 3)
    assert oracle.asked == [2, 4, 3]


# --------------------------------------------------------------------------- non-memory outcomes stop at once

STOPPING = [
    (Outcome.ERROR, Stop.ERROR),
    (Outcome.CRASHED, Stop.CRASHED),
    (Outcome.TIMED_OUT, Stop.TIMED_OUT),
]


@pytest.mark.parametrize("failure,stop", STOPPING)
@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 64), threshold=st.integers(0, 5000), fail_at=st.integers(1, 30))
def test_a_non_memory_outcome_stops_the_search_immediately(failure, stop, start, threshold, fail_at):
    # How many trials the search would take without the failure.
    clean = ThresholdOracle(threshold)
    run_search(clean, Limits(start=start))
    fail_at = min(fail_at, len(clean.asked))

    oracle = ThresholdOracle(threshold, fail_at_call=fail_at, failure=failure)
    conclusion = run_search(oracle, Limits(start=start))

    assert conclusion.stop is stop
    assert len(oracle.asked) == fail_at  # no call after the failing trial
    assert conclusion.history[-1].outcome is failure
    assert not conclusion.exact
    fits_before = [b for b, o in oracle.answers.items() if o is FITS]
    assert conclusion.max_fitting == (max(fits_before) if fits_before else None)
    if conclusion.max_fitting is not None:
        assert oracle.answers[conclusion.max_fitting] is FITS


@pytest.mark.parametrize("failure,stop", STOPPING)
def test_failure_on_the_first_trial(failure, stop):
    oracle = ThresholdOracle(100, fail_at_call=1, failure=failure)
    conclusion = run_search(oracle, Limits(start=4))
    assert conclusion.stop is stop
    assert oracle.asked == [4]
    assert conclusion.max_fitting is None
    assert conclusion.first_failing is None


# --------------------------------------------------------------------------- resuming and guarding the oracle


def test_resume_after_interrupt_reuses_history_and_gives_the_same_answer():
    class Interrupting(ThresholdOracle):
        def __call__(self, batch):
            if len(self.asked) == 5:
                raise KeyboardInterrupt
            return super().__call__(batch)

    history: list[Observation] = []
    first = Interrupting(300)
    with pytest.raises(KeyboardInterrupt):
        run_search(first, Limits(start=2), history)
    assert [o.batch_size for o in history] == first.asked

    second = ThresholdOracle(300)
    conclusion = run_search(second, Limits(start=2), history)
    assert (conclusion.max_fitting, conclusion.first_failing) == (300, 301)
    assert not set(first.asked) & set(second.asked)  # nothing re-run
    assert len(conclusion.history) == len(first.asked) + len(second.asked)


def test_oracle_answering_for_another_batch_is_rejected():
    with pytest.raises(AssertionError):
        run_search(lambda batch: Observation(batch + 1, FITS), Limits(start=2))


# --------------------------------------------------------------------------- plan_next and conclude by hand

LIMITS = Limits(start=2)


def test_plan_next_starts_at_start():
    assert plan_next([], LIMITS) == 2
    assert plan_next([], Limits(start=7)) == 7


def test_plan_next_doubles_while_fitting():
    assert plan_next([obs(2, FITS)], LIMITS) == 4
    assert plan_next([obs(2, FITS), obs(4, FITS), obs(8, FITS)], LIMITS) == 16


def test_plan_next_clamps_doubling_to_the_cap():
    history = [obs(2, FITS), obs(4, FITS), obs(8, FITS)]
    assert plan_next(history, Limits(start=2, cap=10)) == 10
    assert plan_next(history + [obs(10, FITS)], Limits(start=2, cap=10)) is None


def test_plan_next_bisects_between_bounds():
    history = [obs(2, FITS), obs(4, FITS), obs(8, OOM)]
    assert plan_next(history, LIMITS) == 6
    history += [obs(6, FITS)]
    assert plan_next(history, LIMITS) == 7
    history += [obs(7, OOM)]
    assert plan_next(history, LIMITS) is None


def test_plan_next_ignores_an_oom_below_a_fit():
    # Only FITS moves the lower bound; an out-of-memory below it says nothing new about the edge.
    history = [obs(4, FITS), obs(3, OOM)]
    assert plan_next(history, Limits(start=4)) == 8


def test_plan_next_stops_when_start_does_not_fit():
    assert plan_next([obs(2, OOM)], LIMITS) is None


@pytest.mark.parametrize("outcome", [Outcome.ERROR, Outcome.CRASHED, Outcome.TIMED_OUT])
def test_plan_next_stops_on_any_non_memory_outcome(outcome):
    assert plan_next([obs(2, FITS), obs(4, outcome)], LIMITS) is None
    assert plan_next([obs(2, outcome)], LIMITS) is None


def test_conclude_edge_found():
    history = [obs(2, FITS), obs(4, FITS), obs(8, OOM), obs(6, FITS), obs(7, OOM)]
    conclusion = conclude(history, LIMITS)
    assert conclusion == Conclusion(Stop.EDGE_FOUND, 6, 7, tuple(history))
    assert conclusion.exact


def test_conclude_start_does_not_fit():
    conclusion = conclude([obs(2, OOM)], LIMITS)
    assert (conclusion.stop, conclusion.max_fitting, conclusion.first_failing) == (Stop.START_DOES_NOT_FIT, None, 2)
    assert not conclusion.exact


def test_conclude_capped():
    conclusion = conclude([obs(2, FITS), obs(4, FITS)], Limits(start=2, cap=4))
    assert (conclusion.stop, conclusion.max_fitting, conclusion.first_failing) == (Stop.CAPPED, 4, None)
    assert conclusion.exact


@pytest.mark.parametrize("outcome,stop", STOPPING)
def test_conclude_on_non_memory_outcome_keeps_the_bounds_seen(outcome, stop):
    history = [obs(2, FITS), obs(4, FITS), obs(8, OOM), obs(6, outcome)]
    conclusion = conclude(history, LIMITS)
    assert (conclusion.stop, conclusion.max_fitting, conclusion.first_failing) == (stop, 4, 8)
    assert not conclusion.exact


def test_conclude_refuses_an_empty_history():
    with pytest.raises(ValueError, match="no trial"):
        conclude([], LIMITS)


@pytest.mark.parametrize(
    "history",
    [
        [obs(2, FITS)],                                # still doubling
        [obs(2, FITS), obs(4, FITS), obs(8, OOM)],     # still bisecting
    ],
)
def test_conclude_refuses_an_unfinished_history(history):
    with pytest.raises(ValueError, match="not finished"):
        conclude(history, LIMITS)


# --------------------------------------------------------------------------- Limits


def test_limits_defaults():
    limits = Limits()
    assert limits.start == 2
    assert limits.cap is None
    assert limits.highest == DEFAULT_CEILING == 1 << 24


def test_limits_highest_is_the_lower_of_cap_and_ceiling():
    assert Limits(start=2, cap=100).highest == 100
    assert Limits(start=2, cap=100, ceiling=50).highest == 50
    assert Limits(start=2, ceiling=50).highest == 50


@pytest.mark.parametrize("start", [0, -1])
def test_limits_reject_start_below_one(start):
    with pytest.raises(ValueError, match="start must be >= 1"):
        Limits(start=start)


def test_limits_reject_start_above_cap():
    with pytest.raises(ValueError, match="above the largest batch allowed"):
        Limits(start=10, cap=5)


def test_limits_reject_start_above_ceiling():
    with pytest.raises(ValueError, match="above the largest batch allowed"):
        Limits(start=10, ceiling=9)


def test_limits_accept_start_equal_to_cap():
    assert Limits(start=5, cap=5).highest == 5
