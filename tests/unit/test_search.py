"""The edge search, driven by scripted, flaky and faulty oracles: no processes, no torch.

A batch may be tried more than once (a crash or timeout is retried, the final
maximum is confirmed), so most checks look at every attempt of a batch, not
just one answer per batch.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import isoprobe.search.edge_search as search
from isoprobe.report.outcomes import Outcome
from isoprobe.search.edge_search import Conclusion, StopReason, conclude, plan_next, run_search
from isoprobe.search.history import DEFAULT_CEILING, Limits, Observation, Verdict, bounds, not_reproduced, verdicts

FITS = Outcome.FITS
OOM = Outcome.OUT_OF_MEMORY
ERROR = Outcome.ERROR
CRASHED = Outcome.CRASHED
TIMED_OUT = Outcome.TIMED_OUT
FAULTS = [OOM, CRASHED, TIMED_OUT]  # what a flaky trial of a batch that really fits can report
NO_VERDICT = (CRASHED, TIMED_OUT)


class RunawaySearch(Exception):
    """The oracle was asked more often than any finished search could need."""


class Oracle:
    """Memory with an edge, plus scripted faults.

    Every batch up to ``threshold`` fits and every batch above runs out of
    memory, except that:
    - ``faults[(batch, attempt)]`` (attempt counts from 1 per batch) replaces that one answer;
    - ``always[batch]`` replaces every answer for that batch;
    - call number ``fail_at_call`` (1-based, over all batches) answers ``failure``.
    Records every call, in order; ``guard`` stops a search that would never end.
    """

    def __init__(
        self,
        threshold: int,
        *,
        faults: dict[tuple[int, int], Outcome] | None = None,
        always: dict[int, Outcome] | None = None,
        fail_at_call: int | None = None,
        failure: Outcome | None = None,
        guard: int = 2000,
    ):
        self.threshold = threshold
        self.faults = faults or {}
        self.always = always or {}
        self.fail_at_call = fail_at_call
        self.failure = failure
        self.guard = guard
        self.calls: list[tuple[int, Outcome]] = []

    @property
    def asked(self) -> list[int]:
        return [batch for batch, _ in self.calls]

    def attempts(self) -> dict[int, list[Outcome]]:
        return attempts_by_batch(self.calls)

    def truth(self, batch: int) -> Outcome:
        return FITS if batch <= self.threshold else OOM

    def answer(self, batch: int, attempt: int) -> Outcome:
        if self.fail_at_call is not None and len(self.calls) + 1 == self.fail_at_call:
            return self.failure
        if batch in self.always:
            return self.always[batch]
        return self.faults.get((batch, attempt), self.truth(batch))

    def __call__(self, batch: int) -> Observation:
        if len(self.calls) >= self.guard:
            raise RunawaySearch(f"asked {len(self.calls)} times: {self.asked[-20:]}")
        attempt = 1 + self.asked.count(batch)
        outcome = self.answer(batch, attempt)
        self.calls.append((batch, outcome))
        return Observation(batch, outcome, 1000 + 10 * batch if outcome is FITS else None)


class DrawnFaultOracle(Oracle):
    """Batches up to ``threshold`` fit unless hypothesis draws a fault for that (batch, attempt) pair."""

    def __init__(self, threshold: int, data, fault_weight: int, guard: int = 2000):
        super().__init__(threshold, guard=guard)
        # ``fault_weight`` of every 12 draws is a fault: 0 never, 6 half the time.
        choices = [None] * (12 - fault_weight) + [FAULTS[i % 3] for i in range(fault_weight)]
        self.draw = lambda: data.draw(st.sampled_from(choices))

    def answer(self, batch: int, attempt: int) -> Outcome:
        if batch > self.threshold:
            return OOM
        fault = self.draw()
        return FITS if fault is None else fault


def attempts_by_batch(calls) -> dict[int, list[Outcome]]:
    out: dict[int, list[Outcome]] = {}
    for item in calls:
        batch, outcome = (item.batch_size, item.outcome) if isinstance(item, Observation) else item
        out.setdefault(batch, []).append(outcome)
    return out


def obs(batch: int, outcome: Outcome) -> Observation:
    return Observation(batch, outcome)


def history_of(*pairs) -> list[Observation]:
    return [obs(b, o) for b, o in pairs]


def triple(conclusion: Conclusion):
    return conclusion.stop, conclusion.max_fitting, conclusion.first_failing


# --------------------------------------------------------------------------- monotone oracle: exact edge, only the max repeats

caps = st.one_of(st.none(), st.integers(min_value=0, max_value=6000))
small = st.integers(0, 2)


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(1, 64),
    threshold=st.integers(0, 5000),
    cap_offset=caps,
    retries=small,
    confirmations=small,
)
def test_run_search_finds_exactly_the_edge(start, threshold, cap_offset, retries, confirmations):
    cap = None if cap_offset is None else start + cap_offset
    limits = Limits(start=start, cap=cap, retries=retries, confirmations=confirmations)
    oracle = Oracle(threshold)

    conclusion = run_search(oracle, limits)

    highest = DEFAULT_CEILING if cap is None else cap
    # Never below the start, never above the cap.
    assert all(start <= b <= highest for b in oracle.asked)
    # The history is exactly what the oracle was asked, in order.
    assert [(o.batch_size, o.outcome) for o in conclusion.history] == oracle.calls
    assert conclusion.flaky == ()
    counts = {b: oracle.asked.count(b) for b in oracle.asked}

    if threshold < start:
        assert conclusion.stop is StopReason.START_DOES_NOT_FIT
        assert (conclusion.max_fitting, conclusion.first_failing) == (None, start)
        assert conclusion.first_failing_outcome is OOM
        assert oracle.asked == [start]
        assert not conclusion.exact
        return

    expected = min(threshold, highest)
    assert conclusion.max_fitting == expected
    assert conclusion.exact
    # The answer fit every time it ran, and ran exactly 1 + confirmations times ...
    assert oracle.attempts()[expected] == [FITS] * (1 + confirmations)
    # ... and with a deterministic oracle nothing else is ever repeated.
    assert all(n == 1 for b, n in counts.items() if b != expected)
    # The confirmations come last: nothing is tried after the answer is confirmed.
    if confirmations:
        assert oracle.asked[-confirmations:] == [expected] * confirmations
    if threshold >= highest:
        assert conclusion.stop is StopReason.CAPPED
        assert conclusion.first_failing is None
        assert conclusion.first_failing_outcome is None
    else:
        assert conclusion.stop is StopReason.EDGE_FOUND
        assert conclusion.first_failing == expected + 1
        assert conclusion.first_failing_outcome is OOM
        assert oracle.attempts()[expected + 1] == [OOM]


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(1, 64),
    threshold=st.integers(0, 5000),
    cap_offset=caps,
    ceiling_offset=st.integers(0, 3000),
    confirmations=small,
)
def test_run_search_respects_a_small_ceiling(start, threshold, cap_offset, ceiling_offset, confirmations):
    cap = None if cap_offset is None else start + cap_offset
    ceiling = start + ceiling_offset
    limits = Limits(start=start, cap=cap, ceiling=ceiling, confirmations=confirmations)
    oracle = Oracle(threshold)

    conclusion = run_search(oracle, limits)

    highest = ceiling if cap is None else min(cap, ceiling)
    assert limits.highest == highest
    assert max(oracle.asked) <= highest
    if threshold < start:
        assert conclusion.stop is StopReason.START_DOES_NOT_FIT
        assert len(oracle.asked) == 1
    else:
        answer = min(threshold, highest)
        repeated = {b for b in oracle.asked if oracle.asked.count(b) > 1}
        assert repeated == ({answer} if confirmations else set())
        if threshold >= highest:
            assert conclusion.stop is StopReason.CAPPED
            assert conclusion.max_fitting == highest
        else:
            assert conclusion.stop is StopReason.EDGE_FOUND
            assert (conclusion.max_fitting, conclusion.first_failing) == (threshold, threshold + 1)


@settings(max_examples=100, deadline=None)
@given(start=st.integers(1, 64), threshold=st.integers(1, 5000), confirmations=small)
def test_trial_count_is_logarithmic(start, threshold, confirmations):
    oracle = Oracle(threshold)
    run_search(oracle, Limits(start=start, confirmations=confirmations))
    # Doubling to the first failure, then bisecting: about 2 * log2(threshold / start) + 2 distinct
    # trials, plus the confirmations of the answer.
    bound = 2 * math.ceil(math.log2(max(threshold, 2))) + 2
    assert len(set(oracle.asked)) <= bound
    assert len(oracle.asked) <= bound + confirmations


def test_trial_count_for_515_from_2():
    oracle = Oracle(515)
    conclusion = run_search(oracle, Limits(start=2))
    assert conclusion.stop is StopReason.EDGE_FOUND
    assert (conclusion.max_fitting, conclusion.first_failing) == (515, 516)
    assert len(oracle.asked) <= 2 * math.ceil(math.log2(515)) + 2 + 1
    # Doubling goes 2, 4, ..., 512, 1024, then bisects between 512 and 1024 ...
    assert oracle.asked[:10] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    # ... and ends by running the answer once more (one confirmation by default).
    assert oracle.asked[-1] == 515
    assert oracle.asked.count(515) == 2


def test_cap_that_fits_is_the_answer_and_is_tried():
    oracle = Oracle(10_000)
    conclusion = run_search(oracle, Limits(start=2, cap=100))
    assert conclusion.stop is StopReason.CAPPED
    assert conclusion.max_fitting == 100
    assert conclusion.first_failing is None
    assert oracle.asked == [2, 4, 8, 16, 32, 64, 100, 100]


def test_cap_equal_to_start():
    oracle = Oracle(10_000)
    conclusion = run_search(oracle, Limits(start=8, cap=8))
    assert conclusion.stop is StopReason.CAPPED
    assert conclusion.max_fitting == 8
    assert oracle.asked == [8, 8]


def test_cap_equal_to_start_without_confirmations():
    oracle = Oracle(10_000)
    conclusion = run_search(oracle, Limits(start=8, cap=8, confirmations=0))
    assert triple(conclusion) == (StopReason.CAPPED, 8, None)
    assert oracle.asked == [8]


def test_default_ceiling_stops_a_model_that_always_fits():
    oracle = Oracle(10**12)
    conclusion = run_search(oracle, Limits())
    assert conclusion.stop is StopReason.CAPPED
    assert conclusion.max_fitting == DEFAULT_CEILING
    assert max(oracle.asked) == DEFAULT_CEILING
    assert oracle.asked == [2**k for k in range(1, 25)] + [DEFAULT_CEILING]  # 2, 4, ..., 2**24, 2**24


def test_default_ceiling_from_an_odd_start_lands_on_the_ceiling():
    oracle = Oracle(10**12)
    conclusion = run_search(oracle, Limits(start=3))
    assert conclusion.max_fitting == DEFAULT_CEILING
    assert oracle.asked[-2:] == [DEFAULT_CEILING, DEFAULT_CEILING]
    assert all(b <= DEFAULT_CEILING for b in oracle.asked)


def test_start_does_not_fit():
    oracle = Oracle(0)
    conclusion = run_search(oracle, Limits(start=1))
    assert conclusion.stop is StopReason.START_DOES_NOT_FIT
    assert (conclusion.max_fitting, conclusion.first_failing) == (None, 1)
    assert conclusion.first_failing_outcome is OOM
    assert oracle.asked == [1]  # out of memory is a verdict: never retried


def test_start_fits_but_start_plus_one_does_not():
    oracle = Oracle(2)
    conclusion = run_search(oracle, Limits(start=2))
    assert conclusion.stop is StopReason.EDGE_FOUND
    assert (conclusion.max_fitting, conclusion.first_failing) == (2, 3)
    assert oracle.asked == [2, 4, 3, 2]


@pytest.mark.parametrize("confirmations", [0, 1, 2, 3])
def test_the_maximum_is_confirmed_last_and_exactly_confirmations_times(confirmations):
    oracle = Oracle(6)
    conclusion = run_search(oracle, Limits(start=2, confirmations=confirmations))
    assert oracle.asked == [2, 4, 8, 6, 7] + [6] * confirmations
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 6, 7)


# --------------------------------------------------------------------------- flaky oracles: never above the truth


def check_flaky_run(oracle: Oracle, limits: Limits, conclusion: Conclusion) -> None:
    """Properties of any finished search over an oracle whose batches above the threshold always OOM."""
    threshold = oracle.threshold
    attempts = oracle.attempts()
    judged = verdicts(conclusion.history, limits)

    # The conclusion's history is what the oracle answered, in order.
    assert [(o.batch_size, o.outcome) for o in conclusion.history] == oracle.calls
    # Every batch asked is allowed.
    assert all(limits.start <= b <= limits.highest for b in oracle.asked)
    # No batch is tried more often than the limits allow.
    assert all(len(a) <= limits.most_attempts for a in attempts.values())
    # Faults here are memory, crash and timeout: never an error, and never an unfinished search.
    assert conclusion.stop is not StopReason.ERROR
    assert plan_next(conclusion.history, limits) is None

    def clean(a):  # fit every time, or every time but one crash or timeout that no run reproduced (issue 47)
        return set(a) == {FITS} or not_reproduced(a)

    for batch, outcomes in attempts.items():
        earlier = outcomes[:-1]
        if all(o is FITS for o in earlier):
            # Repeated only to confirm a maximum (this includes batches tried once).
            assert len(outcomes) <= 1 + limits.confirmations
        elif FITS in earlier:
            # A fit and one crash or timeout not yet reproduced: run again only for a fit that confirms.
            assert not_reproduced(earlier), (batch, outcomes)
            assert len(outcomes) <= limits.most_attempts
        else:
            # Otherwise repeated only because it crashed or timed out, with no fit yet.
            assert all(o in NO_VERDICT for o in earlier), (batch, outcomes)
            assert len(outcomes) <= 1 + limits.retries
        if all(o in NO_VERDICT for o in outcomes):
            # A crash or timeout that persists is retried exactly ``retries`` times, then is final.
            assert len(outcomes) == 1 + limits.retries
            assert judged[batch].outcome is outcomes[-1]

    # ``flaky`` is exactly the batches with both fitting and failing attempts, but for an unreproduced crash.
    assert set(conclusion.flaky) == {b for b, a in attempts.items() if FITS in a and not clean(a)}
    assert list(conclusion.flaky) == sorted(conclusion.flaky)

    best = conclusion.max_fitting
    if best is not None:
        assert best <= threshold                         # never above the true maximum
        assert clean(attempts[best])                     # it fit every time it was tried (or one crash aside)
        assert attempts[best][-1] is FITS
        assert best not in conclusion.flaky
        # It is the largest batch that fit every time (nothing larger was ever clean).
        assert best == max(b for b, a in attempts.items() if clean(a))
    if conclusion.first_failing is not None:
        assert best is None or conclusion.first_failing > best
        verdict = judged[conclusion.first_failing]
        assert verdict.outcome in FAULTS                 # a failing verdict, not pending, not fits
        assert conclusion.first_failing_outcome is verdict.outcome
        assert FITS not in attempts[conclusion.first_failing] or conclusion.first_failing in conclusion.flaky

    if conclusion.exact:
        assert attempts[best].count(FITS) == 1 + limits.confirmations
        if conclusion.stop is StopReason.EDGE_FOUND:
            assert conclusion.first_failing == best + 1
        else:
            assert conclusion.stop is StopReason.CAPPED
            assert best == limits.highest
            assert conclusion.first_failing is None
    else:
        assert best is None
        assert conclusion.first_failing == limits.start
        expected_stop = {CRASHED: StopReason.CRASHED, TIMED_OUT: StopReason.TIMED_OUT}.get(
            conclusion.first_failing_outcome, StopReason.START_DOES_NOT_FIT
        )
        assert conclusion.stop is expected_stop

    event(f"stop: {conclusion.stop.value}")
    event(f"flaky batches: {min(len(conclusion.flaky), 2)}")
    faulty = [(b, o) for b, o in oracle.calls if o is not oracle.truth(b)]
    event(f"faults hit: {min(len(faulty), 3)}")
    # With no fault actually drawn the flaky search is the clean search.
    if not faulty:
        if threshold < limits.start:
            assert conclusion.stop is StopReason.START_DOES_NOT_FIT
        else:
            assert best == min(threshold, limits.highest)


@st.composite
def flaky_setups(draw):
    """A small threshold (so the search touches many of its batches) and faults on (batch, attempt) pairs."""
    threshold = draw(st.integers(0, 24))
    start = draw(st.integers(1, 4))
    cap_offset = draw(st.one_of(st.none(), st.integers(0, 40)))
    limits = Limits(
        start=start,
        cap=None if cap_offset is None else start + cap_offset,
        retries=draw(small),
        confirmations=draw(small),
    )
    # Faults only ever hit batches that really fit (above the threshold everything is OOM anyway).
    faults = draw(
        st.dictionaries(
            keys=st.tuples(st.integers(1, max(threshold, 1)), st.integers(1, 3)),
            values=st.sampled_from(FAULTS),
            max_size=12,
        )
        if threshold
        else st.just({})
    )
    return threshold, limits, faults


@settings(max_examples=200, deadline=None)
@given(setup=flaky_setups())
def test_flaky_oracle_with_drawn_fault_pairs(setup):
    threshold, limits, faults = setup
    oracle = Oracle(threshold, faults=faults)
    conclusion = run_search(oracle, limits)  # terminates: the oracle's guard would raise otherwise
    check_flaky_run(oracle, limits, conclusion)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    threshold=st.integers(0, 2000),
    start=st.integers(1, 40),
    cap_offset=st.one_of(st.none(), st.integers(0, 3000)),  # faults drawn lazily: any range is hit
    retries=small,
    confirmations=small,
    fault_weight=st.integers(0, 6),
)
def test_flaky_oracle_with_faults_drawn_per_attempt(
    data, threshold, start, cap_offset, retries, confirmations, fault_weight
):
    limits = Limits(
        start=start,
        cap=None if cap_offset is None else start + cap_offset,
        retries=retries,
        confirmations=confirmations,
    )
    oracle = DrawnFaultOracle(threshold, data, fault_weight)
    conclusion = run_search(oracle, limits)
    check_flaky_run(oracle, limits, conclusion)


def test_a_failed_confirmation_moves_the_answer_down():
    # T = 20; the first confirmation of 20 runs out of memory.
    oracle = Oracle(20, faults={(20, 2): OOM})
    conclusion = run_search(oracle, Limits(start=2, retries=1, confirmations=1))

    assert oracle.asked == [2, 4, 8, 16, 32, 24, 20, 22, 21, 20, 18, 19, 19]
    assert conclusion.stop is StopReason.EDGE_FOUND
    # The answer is the largest batch that fit every time; 20 fit once and failed once.
    assert (conclusion.max_fitting, conclusion.first_failing) == (19, 20)
    assert conclusion.first_failing_outcome is OOM
    assert conclusion.flaky == (20,)
    clean = [b for b, a in oracle.attempts().items() if set(a) == {FITS}]
    assert conclusion.max_fitting == max(clean)


def test_a_failed_confirmation_of_the_start_leaves_no_answer():
    oracle = Oracle(2, faults={(2, 2): OOM})
    conclusion = run_search(oracle, Limits(start=2))
    assert oracle.asked == [2, 4, 3, 2]
    assert triple(conclusion) == (StopReason.START_DOES_NOT_FIT, None, 2)
    assert conclusion.flaky == (2,)
    assert not conclusion.exact


def test_a_failed_confirmation_of_the_cap_bisects_below_it():
    oracle = Oracle(10_000, faults={(100, 2): OOM})
    conclusion = run_search(oracle, Limits(start=2, cap=100))
    # A confirmation that runs out of memory is not retried (the batch already fit once): 100 is flaky.
    assert oracle.asked == [2, 4, 8, 16, 32, 64, 100, 100, 82, 91, 95, 97, 98, 99, 99]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 99, 100)
    assert conclusion.first_failing_outcome is OOM
    assert conclusion.flaky == (100,)


def test_a_confirmation_of_the_cap_that_timed_out_once_is_run_again_and_its_fit_confirms():
    # Issue 47: a timeout the next run did not reproduce is no evidence against the batch; the confirmation that
    # counts is a fit (``proofs_due`` counts fits), so the cap is run a third time.
    oracle = Oracle(10_000, faults={(100, 2): TIMED_OUT})
    conclusion = run_search(oracle, Limits(start=2, cap=100))
    assert oracle.asked == [2, 4, 8, 16, 32, 64, 100, 100, 100]
    assert triple(conclusion) == (StopReason.CAPPED, 100, None)
    assert conclusion.flaky == ()


def test_a_second_confirmation_that_fails_also_moves_the_answer_down():
    oracle = Oracle(6, faults={(6, 3): OOM})
    conclusion = run_search(oracle, Limits(start=2, confirmations=2))
    assert oracle.asked == [2, 4, 8, 6, 7, 6, 6, 5, 5, 5]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 5, 6)
    assert conclusion.first_failing_outcome is OOM
    assert conclusion.flaky == (6,)


# --------------------------------------------------------------------------- crashes and timeouts: retried, then final


def test_a_crash_that_the_retry_does_not_reproduce_is_no_evidence_against_the_batch():
    # Issue 47: one rank SIGKILLed once at 32, the retry fit, and 32 still capped the search at 31 where 58 holds.
    oracle = Oracle(20, faults={(4, 1): CRASHED})
    conclusion = run_search(oracle, Limits(start=2, retries=1))
    assert oracle.asked[:3] == [2, 4, 4] and oracle.attempts()[4] == [CRASHED, FITS]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 20, 21)
    assert conclusion.flaky == ()
    assert verdicts(conclusion.history, Limits(start=2, retries=1))[4] == Verdict(4, FITS, 2, 1, False)


def test_a_crash_that_comes_back_fails_the_batch_with_its_class():
    # The cap, 4, crashes, fits on its retry, and crashes again on its confirmation: reproduced.
    oracle = Oracle(20, faults={(4, 1): CRASHED, (4, 3): CRASHED})
    limits = Limits(start=2, cap=4, retries=1, confirmations=1)
    conclusion = run_search(oracle, limits)
    assert oracle.attempts()[4] == [CRASHED, FITS, CRASHED]
    assert verdicts(conclusion.history, limits)[4].outcome is CRASHED
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 3, 4) and conclusion.flaky == (4,)


@pytest.mark.parametrize("failure", NO_VERDICT)
def test_a_start_that_crashes_once_then_fits_is_searched_on(failure):
    oracle = Oracle(20, faults={(2, 1): failure})
    conclusion = run_search(oracle, Limits(start=2, retries=1))
    assert oracle.asked[:3] == [2, 2, 4]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 20, 21)
    assert conclusion.flaky == ()


@pytest.mark.parametrize("failure", NO_VERDICT)
def test_a_start_that_crashes_twice_around_a_fit_is_no_answer(failure):
    oracle = Oracle(20, faults={(2, 1): failure, (2, 3): failure})
    conclusion = run_search(oracle, Limits(start=2, cap=2, retries=1))
    assert oracle.asked == [2, 2, 2]
    expected = StopReason.CRASHED if failure is CRASHED else StopReason.TIMED_OUT
    assert triple(conclusion) == (expected, None, 2)
    assert conclusion.flaky == (2,)


@pytest.mark.parametrize("failure", NO_VERDICT)
@pytest.mark.parametrize("retries", [0, 1, 2, 3])
def test_a_batch_that_always_crashes_fails_with_that_class_after_every_retry(failure, retries):
    oracle = Oracle(20, always={16: failure})
    conclusion = run_search(oracle, Limits(start=2, retries=retries, confirmations=1))
    assert oracle.attempts()[16] == [failure] * (1 + retries)
    # The retries come one after the other, before anything else is tried.
    assert oracle.asked == [2, 4, 8] + [16] * (1 + retries) + [12, 14, 15, 15]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 15, 16)
    assert conclusion.first_failing_outcome is failure  # never silently out of memory
    assert conclusion.exact
    assert conclusion.flaky == ()


@pytest.mark.parametrize("failure,stop", [(CRASHED, StopReason.CRASHED), (TIMED_OUT, StopReason.TIMED_OUT)])
@pytest.mark.parametrize("retries", [0, 1, 2])
def test_a_start_that_always_fails_this_way_stops_with_that_class(failure, stop, retries):
    oracle = Oracle(100, always={4: failure})
    conclusion = run_search(oracle, Limits(start=4, retries=retries))
    assert oracle.asked == [4] * (1 + retries)
    assert triple(conclusion) == (stop, None, 4)
    assert conclusion.first_failing_outcome is failure
    assert not conclusion.exact


def test_with_no_retries_a_crash_is_final_after_one_attempt():
    oracle = Oracle(20, faults={(8, 1): CRASHED})
    conclusion = run_search(oracle, Limits(start=2, retries=0, confirmations=0))
    assert oracle.asked == [2, 4, 8, 6, 7]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 7, 8)
    assert conclusion.first_failing_outcome is CRASHED


def test_a_crash_then_an_oom_is_out_of_memory():
    oracle = Oracle(20, faults={(8, 1): CRASHED, (8, 2): OOM})
    conclusion = run_search(oracle, Limits(start=2, retries=2))
    assert oracle.attempts()[8] == [CRASHED, OOM]  # OOM is a verdict: no third attempt
    assert (conclusion.first_failing, conclusion.first_failing_outcome) == (8, OOM)


def test_a_crash_then_a_timeout_fails_with_the_last_class():
    oracle = Oracle(20, faults={(8, 1): CRASHED, (8, 2): TIMED_OUT})
    conclusion = run_search(oracle, Limits(start=2, retries=1))
    assert oracle.attempts()[8] == [CRASHED, TIMED_OUT]
    assert (conclusion.first_failing, conclusion.first_failing_outcome) == (8, TIMED_OUT)


def test_a_crash_that_clears_on_the_last_retry_is_still_a_failure():
    oracle = Oracle(20, faults={(16, 1): CRASHED, (16, 2): TIMED_OUT})
    conclusion = run_search(oracle, Limits(start=2, retries=2))
    assert oracle.attempts()[16] == [CRASHED, TIMED_OUT, FITS]
    assert (conclusion.max_fitting, conclusion.first_failing) == (15, 16)
    assert conclusion.first_failing_outcome is TIMED_OUT
    assert conclusion.flaky == (16,)


# --------------------------------------------------------------------------- errors stop at once


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(1, 64),
    threshold=st.integers(0, 5000),
    fail_at=st.integers(1, 40),
    retries=small,
    confirmations=small,
)
def test_an_error_stops_the_search_immediately(start, threshold, fail_at, retries, confirmations):
    limits = Limits(start=start, retries=retries, confirmations=confirmations)
    # How many trials the search would take without the error.
    clean = Oracle(threshold)
    run_search(clean, limits)
    fail_at = min(fail_at, len(clean.asked))

    oracle = Oracle(threshold, fail_at_call=fail_at, failure=ERROR)
    conclusion = run_search(oracle, limits)

    assert conclusion.stop is StopReason.ERROR
    assert len(oracle.asked) == fail_at  # no call after the failing trial
    assert oracle.asked == clean.asked[:fail_at]
    assert conclusion.history[-1].outcome is ERROR
    assert not conclusion.exact
    attempts = oracle.attempts()
    clean_fits = [b for b, a in attempts.items() if set(a) == {FITS}]
    assert conclusion.max_fitting == (max(clean_fits) if clean_fits else None)
    failing_above = [b for b, a in attempts.items() if set(a) == {OOM} and b > (conclusion.max_fitting or 0)]
    assert conclusion.first_failing == (min(failing_above) if failing_above else None)


@pytest.mark.parametrize(
    "faults,asked",
    [
        ({(2, 1): ERROR}, [2]),                          # the first trial
        ({(8, 1): CRASHED, (8, 2): ERROR}, [2, 4, 8, 8]),  # on a retry
        ({(6, 2): ERROR}, [2, 4, 8, 6, 7, 6]),           # on a confirmation
    ],
)
def test_an_error_at_any_attempt_stops_at_once(faults, asked):
    oracle = Oracle(6, faults=faults)
    conclusion = run_search(oracle, Limits(start=2, retries=2, confirmations=2))
    assert oracle.asked == asked
    assert conclusion.stop is StopReason.ERROR
    assert not conclusion.exact


def test_an_error_on_the_first_trial_has_no_bounds():
    oracle = Oracle(100, fail_at_call=1, failure=ERROR)
    conclusion = run_search(oracle, Limits(start=4))
    assert triple(conclusion) == (StopReason.ERROR, None, None)
    assert conclusion.first_failing_outcome is None
    assert oracle.asked == [4]


# --------------------------------------------------------------------------- non-monotone memory


def test_a_hole_below_the_edge_caps_the_answer_below_the_hole():
    # Batch 12 always runs out of memory although 13..20 would fit: the search takes the first
    # failure it meets as the edge and never looks above it. The answer, 11, fit every time.
    oracle = Oracle(20, always={12: OOM})
    conclusion = run_search(oracle, Limits(start=3))
    assert oracle.asked == [3, 6, 12, 9, 10, 11, 11]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 11, 12)


def test_a_failure_below_a_batch_that_always_fits_does_not_lower_the_answer():
    # A failure below the lower bound is ignored: only failures above it bound the edge. This is
    # safe because the reported batch (6) still fit every time it ran (twice here); a smaller
    # batch failing says something about that batch, not about 6.
    history = history_of((2, FITS), (4, FITS), (3, OOM), (8, OOM), (6, FITS), (7, OOM), (6, FITS))
    assert bounds(history, LIMITS) == (6, 7)
    assert plan_next(history, LIMITS) is None
    conclusion = conclude(history, LIMITS)
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 6, 7)
    assert conclusion.exact


@pytest.mark.parametrize("failure", [OOM, CRASHED, TIMED_OUT])
def test_resuming_over_a_failure_below_a_fit_keeps_searching_above(failure):
    # The stored history came from a run where 3 failed after 4 fit; the search carries on from 4
    # and never re-tries 3. Same reasoning: the answer is a batch that fit every time.
    history = history_of((4, FITS), (3, failure), (3, failure))
    oracle = Oracle(20, always={3: failure})
    conclusion = run_search(oracle, Limits(start=4, retries=1), history)
    assert 3 not in oracle.asked
    assert oracle.asked == [8, 16, 32, 24, 20, 22, 21, 20]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 20, 21)


# --------------------------------------------------------------------------- resuming and guarding the oracle


def test_resume_after_interrupt_reuses_history_and_gives_the_same_answer():
    class Interrupting(Oracle):
        def __call__(self, batch):
            if len(self.calls) == 5:
                raise KeyboardInterrupt
            return super().__call__(batch)

    history: list[Observation] = []
    first = Interrupting(300)
    with pytest.raises(KeyboardInterrupt):
        run_search(first, Limits(start=2), history)
    assert [o.batch_size for o in history] == first.asked

    second = Oracle(300)
    conclusion = run_search(second, Limits(start=2), history)
    assert (conclusion.max_fitting, conclusion.first_failing) == (300, 301)
    assert not set(first.asked) & set(second.asked)  # nothing re-run
    assert len(conclusion.history) == len(first.asked) + len(second.asked)


def test_resume_after_a_crash_retries_the_crashed_batch_first():
    history = history_of((2, FITS), (4, FITS), (8, CRASHED))
    oracle = Oracle(6)
    conclusion = run_search(oracle, Limits(start=2, retries=1), history)
    assert oracle.asked == [8, 6, 7, 6]
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 6, 7)
    assert conclusion.first_failing_outcome is OOM  # the retry gave a memory verdict


def test_oracle_answering_for_another_batch_is_rejected():
    with pytest.raises(AssertionError):
        run_search(lambda batch: Observation(batch + 1, FITS), Limits(start=2))


@pytest.mark.parametrize("retries,confirmations", [(0, 0), (1, 0), (0, 2), (2, 1)])
def test_run_search_refuses_to_try_a_batch_more_than_most_attempts(monkeypatch, retries, confirmations):
    limits = Limits(start=2, retries=retries, confirmations=confirmations)
    monkeypatch.setattr(search, "plan_next", lambda history, limits, step=None: 2)  # a planner stuck on one batch
    oracle = Oracle(100)
    with pytest.raises(AssertionError, match="more than"):
        run_search(oracle, limits)
    assert oracle.asked == [2] * limits.most_attempts


# --------------------------------------------------------------------------- verdicts and bounds by hand

LIMITS = Limits(start=2)  # retries=1, confirmations=1


@pytest.mark.parametrize(
    "outcomes,retries,expected,flaky",
    [
        ([FITS], 1, FITS, False),
        ([FITS, FITS, FITS], 1, FITS, False),
        ([OOM], 1, OOM, False),
        ([FITS, OOM], 1, OOM, True),
        ([OOM, FITS], 1, OOM, True),
        ([CRASHED], 1, None, False),            # a retry is due
        ([CRASHED], 0, CRASHED, False),         # no retries: final at once
        ([CRASHED, CRASHED], 1, CRASHED, False),
        ([CRASHED, CRASHED], 2, None, False),
        ([TIMED_OUT, TIMED_OUT, TIMED_OUT], 2, TIMED_OUT, False),
        ([CRASHED, TIMED_OUT], 1, TIMED_OUT, False),  # the last failure's class
        ([TIMED_OUT, CRASHED], 1, CRASHED, False),
        ([CRASHED, OOM], 2, OOM, False),        # out of memory if any attempt was
        ([OOM, CRASHED], 2, OOM, False),
        ([CRASHED, FITS], 1, FITS, False),      # issue 47: a crash the retry did not reproduce is no evidence
        ([FITS, CRASHED], 3, FITS, False),      # ... nor one a confirmation met once (the next run must fit)
        ([FITS, TIMED_OUT], 1, FITS, False),
        ([CRASHED, FITS, CRASHED], 1, CRASHED, True),   # reproduced: a failure with its class, and flaky
        ([FITS, TIMED_OUT, TIMED_OUT], 1, TIMED_OUT, True),
        ([CRASHED, FITS, OOM], 1, OOM, True),   # a memory verdict is never set aside
        ([ERROR], 1, ERROR, False),
        ([FITS, ERROR], 1, ERROR, True),
        ([CRASHED, ERROR], 2, ERROR, False),
        ([OOM, ERROR], 1, ERROR, False),        # an error beats out of memory
    ],
)
def test_verdicts(outcomes, retries, expected, flaky):
    history = [obs(8, o) for o in outcomes]
    verdict = verdicts(history, Limits(start=2, retries=retries))[8]
    assert verdict == Verdict(8, expected, len(outcomes), outcomes.count(FITS), flaky)


def test_verdicts_judge_each_batch_separately_and_ignore_order_between_batches():
    history = history_of((2, FITS), (4, CRASHED), (2, FITS), (8, OOM), (4, FITS))
    judged = verdicts(history, LIMITS)
    assert set(judged) == {2, 4, 8}
    assert judged[2] == Verdict(2, FITS, 2, 2, False)
    assert judged[4] == Verdict(4, FITS, 2, 1, False)  # a crash the retry did not reproduce (issue 47)
    assert judged[8] == Verdict(8, OOM, 1, 0, False)
    assert verdicts([], LIMITS) == {}


def test_bounds_use_verdicts():
    # Lower: the largest batch that fit every time; upper: the smallest failing verdict above it.
    assert bounds([], LIMITS) == (None, None)
    assert bounds(history_of((2, FITS), (4, FITS), (8, OOM)), LIMITS) == (4, 8)
    assert bounds(history_of((2, FITS), (4, FITS), (4, OOM), (8, OOM)), LIMITS) == (2, 4)
    # A pending crash bounds nothing yet; once final it does.
    assert bounds(history_of((2, FITS), (4, CRASHED)), LIMITS) == (2, None)
    assert bounds(history_of((2, FITS), (4, CRASHED)), Limits(start=2, retries=0)) == (2, 4)
    assert bounds(history_of((2, FITS), (4, CRASHED), (4, CRASHED)), LIMITS) == (2, 4)
    # An error bounds nothing.
    assert bounds(history_of((2, FITS), (4, ERROR), (8, OOM)), LIMITS) == (2, 8)
    # Failures below the lower bound are ignored.
    assert bounds(history_of((4, FITS), (3, OOM)), LIMITS) == (4, None)
    assert bounds(history_of((4, OOM), (3, OOM)), LIMITS) == (None, 3)


# --------------------------------------------------------------------------- plan_next and conclude by hand


def test_plan_next_starts_at_start():
    assert plan_next([], LIMITS) == 2
    assert plan_next([], Limits(start=7)) == 7


def test_plan_next_doubles_while_fitting():
    assert plan_next([obs(2, FITS)], LIMITS) == 4
    assert plan_next([obs(2, FITS), obs(4, FITS), obs(8, FITS)], LIMITS) == 16


def test_plan_next_clamps_doubling_to_the_cap_then_confirms_the_cap():
    limits = Limits(start=2, cap=10)
    history = [obs(2, FITS), obs(4, FITS), obs(8, FITS)]
    assert plan_next(history, limits) == 10
    history += [obs(10, FITS)]
    assert plan_next(history, limits) == 10  # confirm the cap
    history += [obs(10, FITS)]
    assert plan_next(history, limits) is None
    assert plan_next(history[:-1], Limits(start=2, cap=10, confirmations=0)) is None


def test_plan_next_bisects_between_bounds_then_confirms():
    history = [obs(2, FITS), obs(4, FITS), obs(8, OOM)]
    assert plan_next(history, LIMITS) == 6
    history += [obs(6, FITS)]
    assert plan_next(history, LIMITS) == 7
    history += [obs(7, OOM)]
    assert plan_next(history, LIMITS) == 6  # the bracket is closed: run the maximum again
    history += [obs(6, FITS)]
    assert plan_next(history, LIMITS) is None


@pytest.mark.parametrize("confirmations", [0, 1, 2, 3])
def test_plan_next_confirms_until_one_plus_confirmations_fits(confirmations):
    limits = Limits(start=2, confirmations=confirmations)
    history = history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, OOM))
    proposed = []
    while (batch := plan_next(history, limits)) is not None:
        proposed.append(batch)
        history.append(obs(batch, FITS))
        assert len(proposed) <= 10
    assert proposed == [6] * confirmations


def test_plan_next_after_a_failed_confirmation_bisects_below_the_old_maximum():
    history = history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, OOM), (6, OOM))
    assert bounds(history, LIMITS) == (4, 6)
    assert plan_next(history, LIMITS) == 5


def test_plan_next_ignores_an_oom_below_a_fit():
    # Only fitting verdicts move the lower bound; an out-of-memory below it says nothing new about the edge.
    history = [obs(4, FITS), obs(3, OOM)]
    assert plan_next(history, Limits(start=4)) == 8


def test_plan_next_stops_when_start_does_not_fit():
    assert plan_next([obs(2, OOM)], LIMITS) is None


@pytest.mark.parametrize("outcome", NO_VERDICT)
def test_plan_next_retries_a_crash_or_timeout(outcome):
    assert plan_next([obs(2, outcome)], LIMITS) == 2
    assert plan_next([obs(2, FITS), obs(4, outcome)], LIMITS) == 4
    # Retries spent: the batch fails, and the search goes on below it.
    assert plan_next([obs(2, FITS), obs(4, outcome), obs(4, outcome)], LIMITS) == 3
    assert plan_next([obs(2, FITS), obs(4, outcome)], Limits(start=2, retries=0)) == 3
    assert plan_next([obs(2, outcome), obs(2, outcome)], LIMITS) is None


def test_plan_next_retries_the_smallest_pending_batch_first():
    history = history_of((2, FITS), (16, CRASHED), (4, FITS), (8, TIMED_OUT))
    assert plan_next(history, LIMITS) == 8
    history += [obs(8, FITS)]
    assert plan_next(history, LIMITS) == 16
    history += [obs(16, CRASHED)]
    # 8 fit on its retry, its timeout not reproduced: it fits (issue 47), and 16, crashed twice, fails: (8, 16).
    assert plan_next(history, LIMITS) == 12


def test_plan_next_retries_before_confirming():
    # The bracket (6, 7) is closed, but a crash below it is pending: retry that first.
    history = history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, OOM), (3, CRASHED))
    assert plan_next(history, LIMITS) == 3


def test_plan_next_stops_on_an_error_even_with_a_retry_pending():
    assert plan_next([obs(2, FITS), obs(4, ERROR)], LIMITS) is None
    assert plan_next([obs(2, ERROR)], LIMITS) is None
    assert plan_next(history_of((2, FITS), (8, CRASHED), (4, ERROR)), LIMITS) is None


def test_conclude_edge_found():
    history = history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, OOM), (6, FITS))
    conclusion = conclude(history, LIMITS)
    assert conclusion == Conclusion(StopReason.EDGE_FOUND, 6, 7, OOM, (), tuple(history))
    assert conclusion.exact


def test_conclude_edge_found_over_a_crashed_upper_bound():
    history = history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, CRASHED), (7, CRASHED), (6, FITS))
    conclusion = conclude(history, LIMITS)
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 6, 7)
    assert conclusion.first_failing_outcome is CRASHED
    assert conclusion.exact


def test_conclude_reports_flaky_batches_sorted():
    history = history_of(
        (2, FITS), (4, FITS), (8, CRASHED), (8, FITS), (8, CRASHED), (6, FITS), (7, OOM), (6, OOM), (5, FITS),
        (5, FITS)
    )
    conclusion = conclude(history, LIMITS)
    assert triple(conclusion) == (StopReason.EDGE_FOUND, 5, 6)
    assert conclusion.first_failing_outcome is OOM
    assert conclusion.flaky == (6, 8)  # 8's crash came back: flaky


def test_conclude_start_does_not_fit():
    conclusion = conclude([obs(2, OOM)], LIMITS)
    assert triple(conclusion) == (StopReason.START_DOES_NOT_FIT, None, 2)
    assert conclusion.first_failing_outcome is OOM
    assert not conclusion.exact


@pytest.mark.parametrize("outcome,stop", [(CRASHED, StopReason.CRASHED), (TIMED_OUT, StopReason.TIMED_OUT)])
def test_conclude_start_crashed_or_timed_out(outcome, stop):
    conclusion = conclude([obs(2, outcome), obs(2, outcome)], LIMITS)
    assert triple(conclusion) == (stop, None, 2)
    assert conclusion.first_failing_outcome is outcome
    assert not conclusion.exact
    # A start that crashed, then ran out of memory on the retry, did not fit: a memory verdict.
    assert conclude([obs(2, outcome), obs(2, OOM)], LIMITS).stop is StopReason.START_DOES_NOT_FIT


def test_conclude_capped():
    conclusion = conclude(history_of((2, FITS), (4, FITS), (4, FITS)), Limits(start=2, cap=4))
    assert triple(conclusion) == (StopReason.CAPPED, 4, None)
    assert conclusion.first_failing_outcome is None
    assert conclusion.exact


@pytest.mark.parametrize(
    "history,upper",
    [
        (history_of((2, FITS), (4, FITS), (8, OOM), (6, ERROR)), 8),
        (history_of((2, FITS), (4, FITS), (8, OOM), (6, CRASHED), (6, ERROR)), 8),  # error on the retry
        # An error on the confirmation of 6: 6 no longer fits, so the bounds are (4, 7).
        (history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, OOM), (6, ERROR)), 7),
    ],
)
def test_conclude_on_an_error_keeps_the_bounds_seen(history, upper):
    conclusion = conclude(history, LIMITS)
    assert triple(conclusion) == (StopReason.ERROR, 4, upper)
    assert conclusion.first_failing_outcome is OOM
    assert not conclusion.exact


def test_conclude_on_an_error_ignores_a_pending_retry():
    conclusion = conclude(history_of((2, FITS), (4, CRASHED), (3, ERROR)), LIMITS)
    assert triple(conclusion) == (StopReason.ERROR, 2, None)


def test_conclude_refuses_an_empty_history():
    with pytest.raises(ValueError, match="no trial"):
        conclude([], LIMITS)


@pytest.mark.parametrize(
    "history",
    [
        [obs(2, FITS)],                                       # still doubling
        history_of((2, FITS), (4, FITS), (8, OOM)),           # still bisecting
        history_of((2, FITS), (4, FITS), (8, OOM), (6, FITS), (7, OOM)),  # bracket closed, unconfirmed
        history_of((2, FITS), (4, CRASHED)),                  # a retry is due
        [obs(2, TIMED_OUT)],                                  # a retry of the start is due
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
    assert (limits.retries, limits.confirmations) == (1, 1)
    assert limits.most_attempts == 3  # a fit, one crash that no run reproduced, and the fit that confirms


@pytest.mark.parametrize("retries,confirmations,most", [(0, 0, 1), (1, 0, 2), (0, 3, 5), (2, 1, 3), (2, 2, 4)])
def test_limits_most_attempts(retries, confirmations, most):
    assert Limits(retries=retries, confirmations=confirmations).most_attempts == most


@pytest.mark.parametrize("field", ["retries", "confirmations"])
def test_limits_reject_negative_retries_or_confirmations(field):
    with pytest.raises(ValueError, match="must be >= 0"):
        Limits(**{field: -1})


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


def test_a_history_resumed_under_a_lower_cap_never_answers_above_it():
    history = history_of((2, FITS), (4, FITS), (8, FITS))
    limits = Limits(start=2, cap=5)
    assert plan_next(history, limits) == 5
    conclusion = run_search(lambda b: Observation(b, FITS), limits, list(history))
    assert conclusion.max_fitting == 5 and conclusion.stop is StopReason.CAPPED
