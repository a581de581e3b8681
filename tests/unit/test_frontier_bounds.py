"""A frontier's bounds between points, over fake oracles: what a point borrows, and what it saves and never costs.

No processes: the search runs against an edge that is known, so the trials a
borrowed bound saves can be counted exactly, and a wrong direction can be
shown to cost trials but never the answer.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isoprobe.pipeline.frontier import FrontierPlan, run_frontier, tokens_per_batch
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.report.output import Reporter
from isoprobe.search.edge_search import run_search
from isoprobe.search.frontier_bounds import Proven, borrowed_for, bracket, memory_ranks, probe_order
from isoprobe.search.history import Borrowed, Limits, Observation, Prior
from isoprobe.search.steps import doubling_step, guided_step

FITS, OOM = Outcome.FITS, Outcome.OUT_OF_MEMORY


def edge_oracle(edge: int, calls: list[int], fixed: int = 1000, per_sample: int = 100):
    """Every batch up to ``edge`` fits (peak ``fixed + per_sample·batch``), every batch above runs out of memory."""

    def oracle(batch: int) -> Observation:
        calls.append(batch)
        if batch <= edge:
            return Observation(batch, FITS, peak_bytes=fixed + per_sample * batch, base_bytes=fixed)
        return Observation(batch, OOM)

    return oracle


def classic(edge: int, borrowed: Borrowed | None = None) -> tuple[int | None, list[int]]:
    calls: list[int] = []
    conclusion = run_search(edge_oracle(edge, calls), Limits(start=2, borrowed=borrowed), step=doubling_step)
    return conclusion.max_fitting, calls


def test_a_borrowed_fit_skips_the_doubling_below_it():
    # Alone: 2 4 8 16 fit, 32 fails, 24 fits, 28 and 26 fail, 25 fits, 25 again (the confirmation): 10 trials.
    assert classic(25) == (25, [2, 4, 8, 16, 32, 24, 28, 26, 25, 25])
    # With 20 proven elsewhere the doubling starts there, and 20 itself never runs here (25 fit above it):
    # 40 30 fail, 25 fits, 27 26 fail, 25 confirmed: 6 trials.
    assert classic(25, Borrowed(fits=20)) == (25, [40, 30, 25, 27, 26, 25])


def test_a_borrowed_edge_that_holds_is_proven_here_in_three_trials():
    # The bracket is closed before any trial: the maximum runs here, the failure above it runs here, the confirmation.
    assert classic(25, Borrowed(fits=25, fails=26)) == (25, [25, 26, 25])


def test_a_borrowed_failure_is_run_here_before_it_is_the_first_failing_batch():
    max_fitting, calls = classic(25, Borrowed(fails=26))
    assert max_fitting == 25 and 26 in calls and calls[0] == 2


def test_a_wrong_borrowed_fit_is_dropped_and_the_answer_is_this_points_edge():
    # 30 "fit" at a point that needed more memory, but the direction was wrong: 30 fails here.
    max_fitting, calls = classic(25, Borrowed(fits=30))
    assert max_fitting == 25
    assert calls[:6] == [60, 45, 37, 33, 31, 30]  # the bracket above 30 closes, 30 runs here and fails
    assert calls[6] == 2  # the borrowed fit is dropped: the classic start, as a point searched alone begins


def test_a_wrong_borrowed_failure_is_dropped_when_it_fits_here():
    max_fitting, calls = classic(25, Borrowed(fits=10, fails=20))
    assert max_fitting == 25 and 20 in calls


@settings(max_examples=300, deadline=None)
@given(edge=st.integers(1, 80), fits=st.one_of(st.none(), st.integers(1, 100)),
       fails=st.one_of(st.none(), st.integers(1, 100)), guided=st.booleans(),
       prior_slope=st.one_of(st.none(), st.integers(20, 400)))
def test_any_borrowed_bounds_give_this_points_edge_run_here(edge, fits, fails, guided, prior_slope):
    """Right, wrong or contradictory bounds: the answer is the point's own edge, and the maximum ran here and fit."""
    calls: list[int] = []
    prior = Prior(1000, prior_slope) if guided and prior_slope else None
    limits = Limits(start=2, capacity=1000 + 100 * edge + 50, prior=prior, borrowed=Borrowed(fits, fails))
    history: list[Observation] = []
    conclusion = run_search(edge_oracle(edge, calls), limits, history, step=guided_step if guided else doubling_step)
    if edge < 2:
        assert conclusion.stop is StopReason.START_DOES_NOT_FIT and conclusion.max_fitting is None
        return
    assert conclusion.max_fitting == edge
    assert conclusion.first_failing == edge + 1
    assert any(o.batch_size == edge and o.outcome is FITS for o in history)
    assert any(o.batch_size == edge + 1 and o.outcome is OOM for o in history)


@settings(max_examples=200, deadline=None)
@given(edge=st.integers(2, 80), below=st.integers(0, 40), above=st.integers(1, 40))
def test_true_bounds_never_cost_a_trial_outside_them(edge, below, above):
    fits, fails = max(2, edge - below), edge + above
    _, calls = classic(edge, Borrowed(fits, fails))
    assert all(fits <= batch <= fails for batch in calls)


def test_bracket_narrows_with_borrowed_bounds_and_drops_contradicted_ones():
    limits = Limits(start=2, borrowed=Borrowed(fits=10, fails=30))
    assert bracket([], limits) == (10, 30)
    assert bracket([Observation(20, FITS)], limits) == (20, 30)
    assert bracket([Observation(8, OOM)], limits) == (None, 8)        # 8 failed here: the borrowed fit 10 is wrong
    assert bracket([Observation(35, FITS)], limits) == (35, None)     # 35 fit here: the borrowed failure 30 is wrong
    assert bracket([], Limits(start=2, borrowed=Borrowed(fits=30, fails=10))) == (None, None)  # they disagree


def test_memory_ranks_and_order():
    assert memory_ranks([256, 128, 1024, 512], "increasing") == [1, 0, 3, 2]
    assert memory_ranks([256, 128, 1024, 512], "decreasing") == [2, 3, 0, 1]
    assert memory_ranks(["fp32", "bf16-mixed"], "none") is None
    with pytest.raises(ValueError, match="not a number"):
        memory_ranks(["fp32", 2], "increasing")
    assert probe_order([1, 0, 3, 2], 4) == [2, 3, 0, 1]  # the most memory first
    assert probe_order(None, 3) == [0, 1, 2]


def test_borrowed_for_takes_fits_from_above_and_failures_from_below():
    proven = [Proven(3, 5, 6), Proven(0, 40, 41), Proven(2, 10, None)]
    assert borrowed_for(1, proven) == Borrowed(fits=10, fails=41)
    assert borrowed_for(3, [Proven(2, 10, 11)]) == Borrowed(fits=None, fails=11)
    assert borrowed_for(1, []) is None


def test_tokens_per_batch_only_for_an_input_shape_element():
    assert tokens_per_batch("input.shape.0", 512, 12) == 6144
    assert tokens_per_batch("input.shape", [3, 64, 64], 12) is None
    assert tokens_per_batch("training.precision", "fp32", 12) is None
    assert tokens_per_batch("input.shape.0", 512, None) is None


class FakeResult:
    """What ``run_frontier`` reads of a point's result, from a search over a fake oracle."""

    def __init__(self, edge: int, borrowed: Borrowed | None):
        self.max_batch_size, self.calls = classic(edge, borrowed)
        self.first_failing_batch_size, self.first_failing_outcome = edge + 1, OOM
        self.recommended_batch_size, self.answered, self.cache = self.max_batch_size, True, None
        self.stop_reason = StopReason.EDGE_FOUND
        self.trials = self.calls


def test_a_frontier_over_four_lengths_costs_what_its_bounds_imply(monkeypatch):
    """Edges 40, 20, 10, 5 at lengths 128..1024: each point alone 12 + 10 + 8 + 6 = 36 trials; the frontier,
    1024 first, each next point doubling from the edge above it: 6 + 6 + 7 + 8 = 27."""
    import isoprobe.pipeline.frontier as frontier

    monkeypatch.setattr(frontier, "FrontierPoint", lambda **kw: type("P", (), kw)())
    monkeypatch.setattr(frontier, "FrontierResult", lambda **kw: type("R", (), kw)())
    values = [128, 256, 512, 1024]
    edges = {128: 40, 256: 20, 512: 10, 1024: 5}
    specs = values  # run_frontier hands each point's spec to answer_point only: the value stands for it here
    asked: list[tuple[int, Borrowed | None]] = []

    def answer_point(spec, borrowed):
        value = spec
        asked.append((value, borrowed))
        return FakeResult(edges[value], borrowed)

    plan = FrontierPlan("s.yaml", "input.shape.0", values, specs, "increasing")
    result = run_frontier(plan, Reporter(lambda line: None), answer_point)
    assert asked == [(1024, None), (512, Borrowed(5, None)), (256, Borrowed(10, None)), (128, Borrowed(20, None))]
    assert [p.max_batch_size for p in result.points] == [40, 20, 10, 5]
    assert [p.trials for p in result.points] == [8, 7, 6, 6]
    assert sum(len(classic(e)[1]) for e in edges.values()) == 36
    assert result.total_trials == 27
    assert [p.tokens_per_batch for p in result.points] == [5120, 5120, 5120, 5120]
