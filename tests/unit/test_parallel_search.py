"""The k-ary search (isoprobe/search/parallel.py) against the sequential one, on simulated devices and faults."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.search.edge_search import run_search
from isoprobe.search.history import Limits, Observation
from isoprobe.search.steps import doubling_step, guided_step
from isoprobe.search.parallel import one_at_a_time, plan_round, run_parallel_search

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "simulations"))
from simulate_search import device  # noqa: E402

GRID = sorted({round(2 * (4096 ** (i / 39))) for i in range(40)})


def rounds_of(oracle):
    """A round oracle from a batch oracle, keeping every round asked for."""
    asked: list[list[int]] = []

    def run(batches, observed):
        asked.append(list(batches))
        one_at_a_time(oracle)(batches, observed)

    return run, asked


@pytest.mark.parametrize("slots", [2, 4, 8])
@pytest.mark.parametrize("noise", [0.0, 0.05])
@pytest.mark.parametrize("step", [guided_step, doubling_step])
def test_the_same_exact_edge_as_the_sequential_search_on_every_simulated_device(slots, noise, step):
    for true_max in GRID:
        for seed in range(2):
            oracle, capacity = device(true_max, seed, noise)
            limits = Limits(start=2, confirmations=1, capacity=capacity)
            sequential = run_search(oracle, limits, step=step)
            oracle, capacity = device(true_max, seed, noise)
            run, asked = rounds_of(oracle)
            found = run_parallel_search(run, limits, slots, step=step)
            parallel = found.conclusion
            assert (parallel.stop, parallel.max_fitting, parallel.first_failing) == (
                sequential.stop, sequential.max_fitting, sequential.first_failing) == (
                StopReason.EDGE_FOUND, true_max, true_max + 1), (true_max, seed)
            assert all(len(r) <= slots for r in asked) and found.rounds == len(asked)
            runs = [o for o in parallel.history if o.batch_size == true_max]
            assert len(runs) >= 2 and all(o.outcome is Outcome.FITS for o in runs)  # tested, and confirmed
            assert any(o.batch_size == true_max + 1 for o in parallel.history)


def test_eight_slots_take_at_most_half_the_rounds_of_one_in_the_median():
    counts = {1: [], 8: []}
    grid = sorted({round(2 * (4096 ** (i / 99))) for i in range(100)})  # the benchmark's grid
    for true_max, seed in [(t, s) for t in grid for s in range(3)]:
        for slots in counts:
            oracle, capacity = device(true_max, seed, 0.01)
            run, _ = rounds_of(oracle)
            counts[slots].append(run_parallel_search(run, Limits(start=2, confirmations=0, capacity=capacity),
                                                     slots).rounds)
    median = {k: sorted(v)[len(v) // 2] for k, v in counts.items()}
    assert median[8] * 2 <= median[1], median


def test_a_slot_that_crashes_mid_round_is_retried_and_only_ever_lowers_the_answer():
    crashes = {("round", 2, 1)}  # the second slot of the second round crashes once
    state = {"round": 0}

    def run(batches, observed):
        state["round"] += 1
        for slot, batch in enumerate(batches):
            if ("round", state["round"], slot) in crashes:
                observed(slot, Observation(batch, Outcome.CRASHED))
            else:
                observed(slot, Observation(batch, Outcome.FITS if batch <= 37 else Outcome.OUT_OF_MEMORY))

    found = run_parallel_search(run, Limits(start=2, cap=100), 4, step=doubling_step)
    crashed = [o.batch_size for o in found.conclusion.history if o.outcome is Outcome.CRASHED]
    assert len(crashed) == 1
    assert sum(o.batch_size == crashed[0] for o in found.conclusion.history) >= 2  # a fresh run decided it
    assert (found.conclusion.max_fitting, found.conclusion.first_failing) == (37, 38)


def test_a_batch_that_fails_once_is_never_reported_and_a_persistent_crash_lowers_the_edge():
    """True edge 40, but 40 runs out of memory on its second run and 39 crashes every time: the answer is below both,
    and it fit every time it ran."""
    counts: dict[int, int] = {}

    def observe(batch):
        counts[batch] = counts.get(batch, 0) + 1
        if batch == 40:
            return Observation(batch, Outcome.FITS if counts[batch] == 1 else Outcome.OUT_OF_MEMORY)
        if batch == 39:
            return Observation(batch, Outcome.CRASHED)
        return Observation(batch, Outcome.FITS if batch <= 40 else Outcome.OUT_OF_MEMORY)

    run = one_at_a_time(observe)

    found = run_parallel_search(run, Limits(start=2, cap=64, confirmations=1), 8, step=doubling_step).conclusion
    assert found.max_fitting is not None and found.max_fitting <= 38
    runs = [o for o in found.history if o.batch_size == found.max_fitting]
    assert len(runs) >= 2 and all(o.outcome is Outcome.FITS for o in runs)
    assert 40 in found.flaky or counts.get(40, 0) <= 1


def test_a_round_never_plans_a_batch_more_often_than_allowed_nor_beyond_the_cap():
    limits = Limits(start=2, cap=50, retries=1, confirmations=1)
    history: list[Observation] = []
    while batches := plan_round(history, limits, 8):
        assert all(1 <= b <= 50 for b in batches)
        history.extend(Observation(b, Outcome.FITS if b <= 33 else Outcome.OUT_OF_MEMORY) for b in batches)
        counts = {b: sum(o.batch_size == b for o in history) for b in {o.batch_size for o in history}}
        assert max(counts.values()) <= limits.most_attempts
    assert plan_round(history, limits, 8) == []


def test_an_error_stops_the_rounds():
    run = one_at_a_time(lambda b: Observation(b, Outcome.ERROR if b >= 8 else Outcome.FITS))
    found = run_parallel_search(run, Limits(start=2, cap=64), 4)
    assert found.conclusion.stop is StopReason.ERROR and found.rounds == 1


def test_one_slot_is_the_sequential_search():
    oracle, capacity = device(515, 0, 0.01)
    sequential = run_search(oracle, Limits(start=2, capacity=capacity))
    oracle, capacity = device(515, 0, 0.01)
    run, asked = rounds_of(oracle)
    found = run_parallel_search(run, Limits(start=2, capacity=capacity), 1)
    assert [b for r in asked for b in r] == [o.batch_size for o in sequential.history]


def test_observations_join_the_history_as_they_are_told_and_an_interrupt_mid_round_keeps_them():
    """A round whose last slot ends first, then a signal before its first slot ends: the history holds what ended."""
    history: list[Observation] = []

    def run(batches, observed):
        if len(history) >= 2:  # the second round: its last slot ends, then the signal comes
            observed(len(batches) - 1, Observation(batches[-1], Outcome.OUT_OF_MEMORY))
            raise KeyboardInterrupt
        for slot in reversed(range(len(batches))):  # the first round ends in reverse slot order
            observed(slot, Observation(batches[slot], Outcome.FITS))

    with pytest.raises(KeyboardInterrupt):
        run_parallel_search(run, Limits(start=2, cap=64), 2, history, step=doubling_step)
    assert [(o.batch_size, o.outcome) for o in history] == [
        (4, Outcome.FITS), (2, Outcome.FITS), (16, Outcome.OUT_OF_MEMORY)]


@pytest.mark.parametrize("answers", [[0, 0, 1], [0]], ids=["a slot told twice", "a slot never told"])
def test_a_round_oracle_must_tell_each_slot_exactly_once(answers):
    def run(batches, observed):
        for slot in answers:
            observed(slot, Observation(batches[slot], Outcome.FITS))

    with pytest.raises(AssertionError):
        run_parallel_search(run, Limits(start=2, cap=64), 2)


@pytest.mark.parametrize("slots", [2, 4])
def test_the_order_in_which_a_round_ends_does_not_change_the_answer(slots):
    for true_max in GRID[::4]:
        oracle, capacity = device(true_max, 0, 0.05)
        limits = Limits(start=2, confirmations=1, capacity=capacity)
        in_order = run_parallel_search(one_at_a_time(oracle), limits, slots, step=guided_step).conclusion
        oracle, capacity = device(true_max, 0, 0.05)

        def reversed_ends(batches, observed):
            for slot in reversed(range(len(batches))):
                observed(slot, oracle(batches[slot]))

        found = run_parallel_search(reversed_ends, limits, slots, step=guided_step).conclusion
        assert (found.stop, found.max_fitting, found.first_failing) == (
            in_order.stop, in_order.max_fitting, in_order.first_failing) == (StopReason.EDGE_FOUND, true_max, true_max + 1)
