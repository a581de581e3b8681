"""The token-budget search (``search.token_budget``) over fake oracles: a memory model where the truth is known.

The truth for every oracle here is computed independently of the search: each
length's edge e_L by counting up from 1, the budget as min over L of
L * (e_L + 1) - 1.
"""

from __future__ import annotations

import math

import pytest

from isoprobe.report.outcomes import Outcome
from isoprobe.search.token_budget import search_budget


def memory_oracle(per_sample, capacity):
    """fits(n, L): n samples of length L need n * per_sample(L) bytes; fits under ``capacity``."""
    def fits(samples: int, length: int) -> Outcome:
        return Outcome.FITS if samples * per_sample(length) <= capacity else Outcome.OUT_OF_MEMORY
    return fits


def true_edge(fits, length: int) -> int:
    n = 0
    while fits(n + 1, length) is Outcome.FITS:
        n += 1
    return n


def true_budget(fits, lengths):
    limits = {length: length * (true_edge(fits, length) + 1) - 1 for length in lengths}
    smallest = min(limits.values())
    return smallest, max(length for length, limit in limits.items() if limit == smallest)


def counting(fits):
    calls = []

    def oracle(samples, length):
        calls.append((samples, length))
        return fits(samples, length)
    return oracle, calls


LENGTHS = [16, 24, 32, 48, 64, 96, 128]
MODELS = {
    "attention (quadratic: the longest binds)": lambda L: 400 * L + 3 * L * L,
    "per-sample overhead (the shortest binds)": lambda L: 30_000 + 100 * L,
    "linear in tokens (floors decide)": lambda L: 1000 * L,
    "mixed": lambda L: 9_000 + 300 * L + L * L,
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("capacity", [2_000_000, 7_777_777])
def test_the_budget_is_the_minimum_over_lengths_of_each_lengths_limit(name, capacity):
    fits = memory_oracle(MODELS[name], capacity)
    found = search_budget(fits, LENGTHS)
    budget, binding = true_budget(fits, LENGTHS)
    assert (found.budget, found.binding_length) == (budget, binding)
    assert found.edge(binding).max_fitting == true_edge(fits, binding)
    assert found.edge(binding).first_failing == true_edge(fits, binding) + 1
    # every bucket of a sampler filled to the budget fits, and one more token's worth at the binding one does not
    for length in LENGTHS:
        assert fits(budget // length, length) is Outcome.FITS
    assert fits((budget + 1) // binding, binding) is Outcome.OUT_OF_MEMORY


@pytest.mark.parametrize("name", MODELS)
def test_reuse_needs_far_fewer_trials_than_a_search_per_length(name):
    fits = memory_oracle(MODELS[name], 5_000_000)
    oracle, calls = counting(fits)
    found = search_budget(oracle, LENGTHS)
    alone = 0
    for length in LENGTHS:
        single, single_calls = counting(fits)
        search_budget(single, [length])
        alone += len(single_calls)
    assert len(found.trials) == len(calls)
    assert len(calls) * 2 <= alone, (len(calls), alone)
    assert len(set(calls)) == len(calls) - 1  # no point asked twice but the binding batch's confirmation


def test_when_the_longest_binds_every_shorter_length_costs_one_trial():
    """Quadratic memory: the longest length's edge search, its confirmation, and one probe per other length
    (ceil(U / L) - 1 samples, which fits): the shorter lengths are ruled out without an edge search."""
    fits = memory_oracle(MODELS["attention (quadratic: the longest binds)"], 5_000_000)
    alone, alone_calls = counting(fits)
    search_budget(alone, [128])
    oracle, calls = counting(fits)
    found = search_budget(oracle, LENGTHS)
    assert found.binding_length == 128
    assert len(calls) == len(alone_calls) + len(LENGTHS) - 1
    for length in LENGTHS[:-1]:
        assert calls.count  # noqa: B018
        assert [n for n, at in calls if at == length] == [math.ceil(128 * found.edge(128).first_failing / length) - 1]


def test_a_fit_at_a_longer_length_is_a_floor_at_every_shorter_one():
    """Memory that does not depend on the length: once the longest length's edge e is known, every shorter
    length starts its bisection at e (a fit at a longer length), never from one sample."""
    fits = memory_oracle(lambda L: 50_000, 5_000_000)  # 100 samples at any length
    oracle, calls = counting(fits)
    found = search_budget(oracle, [32, 64, 128])
    assert found.budget == 32 * 101 - 1 and found.binding_length == 32
    shorter = [n for n, at in calls[:-1] if at < 128]  # the last is the binding batch's confirmation
    assert min(shorter) > 100, shorter  # nothing at or below the proven floor is run again


def test_the_sample_cap_is_a_samplers_own_limit():
    fits = memory_oracle(lambda L: 1000 * L, 1_000_000)  # edge 1000 // L
    found = search_budget(fits, [10, 100], cap=50)
    # at 10 the cap fits (50 <= 100): no limit there; at 100 the edge is 10
    assert (found.budget, found.binding_length) == (100 * 11 - 1, 100)
    assert max(n for n, _, _ in found.trials) <= 50
    everything = search_budget(fits, [10, 20], cap=5)
    assert everything.capped and everything.budget == 20 * 5 and everything.binding_length is None


@pytest.mark.parametrize("outcome", [Outcome.ERROR, Outcome.CRASHED, Outcome.TIMED_OUT, Outcome.STILL_RISING])
def test_a_trial_that_is_no_memory_verdict_stops_without_a_budget(outcome):
    base = memory_oracle(lambda L: 1000 * L, 1_000_000)

    def fits(samples, length):
        return outcome if length == 10 else base(samples, length)
    found = search_budget(fits, [10, 100])
    assert found.budget is None and found.stop is outcome


def test_nothing_fits_at_the_binding_length_gives_no_budget():
    found = search_budget(memory_oracle(lambda L: 1000 * L, 50_000), [10, 100])
    assert found.budget is None and found.binding_length == 100 and found.stop is None


def test_a_binding_batch_that_fails_its_confirmation_gives_no_budget():
    seen = set()

    def flaky(samples, length):
        if samples <= 9 and (samples, length) in seen and length == 100 and samples == 9:
            return Outcome.OUT_OF_MEMORY
        seen.add((samples, length))
        return Outcome.FITS if samples * length <= 999 else Outcome.OUT_OF_MEMORY
    found = search_budget(flaky, [100])
    assert found.budget is None and found.stop is Outcome.OUT_OF_MEMORY
    assert found.trials[-1] == (9, 100, Outcome.OUT_OF_MEMORY)


@pytest.mark.parametrize("lengths", [[], [0], [-3], [2.5], [10, 0]])
def test_lengths_must_be_positive_integers(lengths):
    with pytest.raises(ValueError, match="positive integers"):
        search_budget(memory_oracle(lambda L: L, 100), lengths)


def test_a_crash_is_run_again_and_a_crash_that_persists_stops():
    base = memory_oracle(lambda L: 1000 * L, 1_000_000)
    crashes = {(4, 100): 1}  # the first attempt at 4 x 100 crashes, the retry runs

    def once(samples, length):
        if crashes.get((samples, length), 0) > 0:
            crashes[(samples, length)] -= 1
            return Outcome.CRASHED
        return base(samples, length)
    found = search_budget(once, [10, 100], retries=1)
    assert (found.budget, found.binding_length) == true_budget(base, [10, 100])
    assert [t for t in found.trials if t[:2] == (4, 100)] == [(4, 100, Outcome.CRASHED), (4, 100, Outcome.FITS)]
    always = search_budget(lambda n, L: Outcome.CRASHED if (n, L) == (4, 100) else base(n, L), [10, 100], retries=1)
    assert always.budget is None and always.stop is Outcome.CRASHED
    assert [t for t in always.trials if t[:2] == (4, 100)] == [(4, 100, Outcome.CRASHED)] * 2
