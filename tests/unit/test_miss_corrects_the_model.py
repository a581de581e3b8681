"""Issue 49, part 1: a miss corrects the model.

When the edge an estimate (or a measured line) predicts runs out of memory, the next trial is placed from what the
failures and the fits say together, not one sample below (``steps.miss_descent``, ``steps.corrected_line``). The
searches run as the product runs them (``Limits.steady``: each proof once, no confirmation); the bare proof of an
edge is two trials (the maximum, stepped until steady, and one more sample that runs out). ``Limits.correct_misses``
off is the search before the issue, kept for the comparison (``simulate_search.py --compare-policies``).

What the policy can guarantee on a device whose memory is a line (no noise), from these tests:
- an exact estimate: its predicted edge fits, stepping until steady, and the batch above runs out: the bare proof;
- an estimate that errs low (-5, -15, -50 %): its predicted edge fits, and the line through that reading and the
  estimate's intercept finds the edge: bare proof + 1 (3 trials; before: up to 5);
- one that errs high (5, 15 or 50 %): its predicted edge runs out, the next trial assumes it 50 % high
  (``steps.ERROR_BOUND``) and fits, and the line through that reading, steepened to what the failure proves, finds
  the edge: bare proof + 2 (4 trials; before: up to 10).
"""

from __future__ import annotations

import pytest

from isoprobe.report.outcomes import Outcome
from dataclasses import replace

from isoprobe.search import long_run
from isoprobe.search.edge_search import plan_next, run_search
from isoprobe.search.history import Limits, Observation, Prior
from isoprobe.search.steps import ERROR_BOUND, corrected_line, miss_descent
from tests.unit.test_search_guided import Device

MiB = 1 << 20
BARE_PROOF = 2


def _trials(true_max: int, error: float, correct: bool) -> list[int]:
    """The batches tried on a linear device (900 MiB + 3 MiB a sample) from an estimate whose edge is off by
    ``error`` (its slope divided by 1 + error, its intercept right); ``correct`` off: the search before issue 49."""
    base, per_sample = 900 * MiB, 3 * MiB
    device = Device(base, per_sample, base + per_sample * true_max + per_sample // 2)
    prior = Prior(base, per_sample / (1 + error))
    found = run_search(device, Limits(start=2, capacity=device.capacity, prior=prior, steady=True, confirmations=0,
                                      correct_misses=correct))
    assert (found.max_fitting, found.first_failing) == (true_max, true_max + 1)
    runs = [o for o in found.history if o.batch_size == true_max]
    assert all(o.outcome is Outcome.FITS for o in runs) and any(o.steady for o in runs)
    return [o.batch_size for o in found.history]


#: The most trials over the bare proof, per error of the estimate's edge (see the module docstring).
OVER_BARE = {-0.5: 1, -0.15: 1, -0.05: 1, 0.0: 0, 0.05: 2, 0.15: 2, 0.5: 2}


@pytest.mark.parametrize("error", sorted(OVER_BARE))
@pytest.mark.parametrize("true_max", [20, 136, 515, 2000])
def test_an_estimate_off_by_5_15_or_50_percent_either_way_costs_at_most_its_bound(true_max, error):
    after = _trials(true_max, error, True)
    assert len(after) <= BARE_PROOF + OVER_BARE[error], after


@pytest.mark.parametrize("error", [0.05, 0.15, 0.5])
def test_a_high_estimate_costs_one_failure_then_a_fit_then_the_proof(error):
    """The predicted edge runs out, the trial ERROR_BOUND below it fits, and its reading with the failure finds the
    edge: the edge pair is the third and fourth trial."""
    after = _trials(515, error, True)
    assert after[1] == int(after[0] / (1 + ERROR_BOUND)) and sorted(after[2:]) == [515, 516], after


@pytest.mark.parametrize("error", sorted(OVER_BARE))
def test_the_correction_needs_fewer_trials_than_the_walk_down(error):
    """Before and after, over the same devices: never more in total, and fewer wherever the estimate is off by more
    than a sample or two (an estimate 5 % high on an edge of 20 is one sample high: the walk-down found it at once)."""
    edges = [20, 136, 515, 2000]
    before = [len(_trials(t, error, False)) for t in edges]
    after = [len(_trials(t, error, True)) for t in edges]
    assert sum(after) <= sum(before)
    assert all(a <= b for a, b, t in zip(after, before, edges) if t >= 136), (before, after)
    if error > 0:
        assert sum(after) < sum(before)


def test_after_the_predicted_edge_ran_out_the_next_trial_is_the_estimate_corrected_not_one_below():
    limits = Limits(start=2, capacity=1000, prior=Prior(0, 10))  # predicts 100: the first trial
    history = [Observation(100, Outcome.OUT_OF_MEMORY)]
    assert plan_next(history, limits) == miss_descent(limits, 100, 1) == int(100 / (1 + ERROR_BOUND)) == 66
    history.append(Observation(66, Outcome.OUT_OF_MEMORY))
    assert plan_next(history, limits) == int(100 / (1 + ERROR_BOUND) ** 2) == 44  # the factor squared: 2.25
    history.append(Observation(44, Outcome.OUT_OF_MEMORY))
    assert plan_next(history, limits) == int(100 / (1 + ERROR_BOUND) ** 4) == 19  # 5.06


def test_before_issue_49_a_miss_walked_down_one_sample():
    limits = Limits(start=2, capacity=1000, prior=Prior(0, 10), correct_misses=False)
    history = [Observation(101, Outcome.OUT_OF_MEMORY), Observation(100, Outcome.OUT_OF_MEMORY)]
    assert plan_next([], limits) == 101 and plan_next(history[:1], limits) == 100 and plan_next(history, limits) == 99


def test_a_correction_is_never_drawn_from_batches_the_heap_sets():
    """After a miss, a fit below half the failing batch draws no line (its reading is the heap's, not the batch's):
    the step bisects, and the fit there is a reading near the edge."""
    limits = Limits(start=2, capacity=4000 * MiB, margin=8 * MiB)
    history = [_ddp(2), _ddp(4), Observation(44, Outcome.OUT_OF_MEMORY), Observation(43, Outcome.OUT_OF_MEMORY)]
    assert corrected_line(history, limits, 43, misses=1) is None
    assert plan_next(history, limits) == 23


def test_a_miss_by_one_sample_of_a_measured_line_is_still_found_next():
    """The measured small-cnn line (tests/unit/test_search_guided.py): it predicts 137, 138 and 137 run out, and 136
    fits. The failure proves the line 1.4 % flat; taken again, the corrected line predicts 136."""
    from tests.unit.test_search_guided import SMALL_CNN, SMALL_CNN_START

    history = SMALL_CNN_START + [Observation(138, Outcome.OUT_OF_MEMORY), Observation(137, Outcome.OUT_OF_MEMORY)]
    assert plan_next(history, SMALL_CNN) == 136


# --------------------------------------------------------------------------- the two recorded searches


def _small_cnn(batch: int, deciding: bool = False) -> Observation:
    """specs/small-cnn.yaml under 1.25 GiB, one thread, as recorded: 152 is the edge, 153 fits inside the spread (3
    MiB: marginal, a long-run failure when it decides), 154 runs out. 865.6 MiB + 2.7 MiB a sample."""
    peak = int((865.6 + 2.7 * batch) * MiB)
    if peak > SMALL_CNN_LIMITS.capacity:
        return Observation(batch, Outcome.OUT_OF_MEMORY, steady=deciding)
    marginal = deciding and SMALL_CNN_LIMITS.capacity - peak <= SMALL_CNN_LIMITS.margin
    return Observation(batch, Outcome.FITS, peak, int(872 * MiB), long_run=marginal, steady=deciding)


#: The trace's line under-counts the slope: it predicts 175 clear of the 3 MiB spread, so the first trial is 176.
SMALL_CNN_LIMITS = Limits(start=2, capacity=1280 * MiB, margin=3 * MiB, steady=True, confirmations=0,
                          prior=Prior(865.6 * MiB, 411.4 * MiB / 175.5))


def _with_the_long_run(history: list[Observation], limits: Limits, device, margin=None) -> list[Observation]:
    """The short search, then the steady trials below a marginal maximum (``long_run``), as the probe runs them: a
    batch below that already fit stepping until steady runs no second time (``pipeline.steady_edge``)."""
    found = run_search(device, limits, history, margin=margin)
    history = list(found.history)
    if found.long_run_failure is not None:
        failed = found.long_run_failure
        ran = {o.batch_size: True for o in history if o.steady and o.outcome is Outcome.FITS and not o.long_run
               and o.batch_size < failed} | {failed: False}
        while (batch := long_run.next_long_run_batch(ran, 1)) is not None:
            observation = device(batch, True)
            history.append(observation)
            ran[batch] = observation.outcome is Outcome.FITS and not observation.long_run
    return history


def _after_first_miss(history: list[Observation], first_miss: int) -> list[int]:
    batches = [o.batch_size for o in history]
    return batches[batches.index(first_miss) + 1:]


def test_recorded_small_cnn_before_walks_down_through_failures():
    history = _with_the_long_run([], replace(SMALL_CNN_LIMITS, correct_misses=False), _small_cnn)
    batches = [o.batch_size for o in history]
    # The recorded search walked 176, 175, 174, then 130 (x0.75), 153 (marginal), 152: 6 trials. Here 153's first
    # trial is short (nothing asked it to decide before issue 49), so 154 and a steady 153 come before 152.
    assert batches[:4] == [176, 175, 174, 130] and batches[-1] == 152 and len(batches) >= 6, batches


def test_recorded_small_cnn_after_the_miss_corrects_the_model():
    history = _with_the_long_run([], SMALL_CNN_LIMITS, _small_cnn)
    batches = [o.batch_size for o in history]
    assert batches[0] == 175 and history[0].steady  # the predicted edge, deciding: it runs out
    assert batches[-1] == 152 and history[-1].steady and history[-1].outcome is Outcome.FITS
    assert len(batches) <= BARE_PROOF + 2
    # 175 / 1.5 is 116, which fits; the line through it predicts 153 inside the spread (marginal: it steps until
    # steady and fails in the long run), then 152 proves the maximum.
    assert batches == [175, 116, 153, 152], batches


def _ddp(batch: int, deciding: bool = False) -> Observation:
    """The torchrun DDP language model probed as a command, no estimate, as recorded: 2 and 4 read the heap (the line
    through them predicts 43), 30 fits inside the 8 MiB spread (marginal), 29 clears it, 31 runs out."""
    capacity, margin = DDP_LIMITS.capacity, DDP_LIMITS.margin
    if batch in (2, 4):
        return Observation(batch, Outcome.FITS, {2: 1563, 4: 1680}[batch] * MiB, 1450 * MiB,
                           steady=deciding)
    peak = (1295 + 90 * batch) * MiB
    if peak > capacity:
        return Observation(batch, Outcome.OUT_OF_MEMORY, steady=deciding)
    return Observation(batch, Outcome.FITS, peak, 1320 * MiB, long_run=deciding and capacity - peak <= margin,
                       steady=deciding)


DDP_LIMITS = Limits(start=2, capacity=4000 * MiB, margin=8 * MiB, steady=True, confirmations=0)


def test_recorded_ddp_command_before_walks_down_through_failures():
    history = _with_the_long_run([_ddp(2), _ddp(4)], replace(DDP_LIMITS, correct_misses=False), _ddp)
    assert [o.batch_size for o in history] == [2, 4, 44, 43, 42, 23, 31, 30, 29]  # the recorded search: 9 trials


def test_recorded_ddp_command_after_the_miss_corrects_the_model():
    """Part 1 alone: from the recorded opening (2 and 4, before a command reported its base reading) the miss at 44 and
    43 is corrected at once: 23, then the edge pair."""
    history = _with_the_long_run([_ddp(2), _ddp(4)], DDP_LIMITS, _ddp)
    batches = [o.batch_size for o in history]
    assert batches[:4] == [2, 4, 44, 43]
    assert batches[-1] == 29 and history[-1].steady and history[-1].outcome is Outcome.FITS
    assert len(_after_first_miss(history, 43)) <= 3
    assert batches == [2, 4, 44, 43, 23, 30, 29], batches  # the line through 23 reaches 8 MiB short 0.06 above 30


def test_recorded_ddp_command_with_its_base_reading_opens_far_apart():
    """Part 2: a command's trial reports what it held right after its step (``ShimStep.held_budget_bytes``), so its
    first trial alone gives a slope (the heap's: 56 MiB a sample where the batch costs 90) and the second goes half
    the way to that line's edge, 23, far from the heap; the line through 23 puts the edge a sixteenth of a sample
    above 30, so 30 is checked first, stepping until steady (``steps.edge_first``): marginal, and 29 proves the
    maximum. 4 trials: the bare proof + 2 (recorded: 9)."""
    history = _with_the_long_run([], DDP_LIMITS, _ddp)
    assert [o.batch_size for o in history] == [2, 23, 30, 29]
    assert history[-1].steady and history[-1].outcome is Outcome.FITS and history[2].long_run


# --------------------------------------------------------------------------- the floor the trials measured


def _lightning(batch: int, deciding: bool = False) -> Observation:
    """The LightningCLI script under 1085 MiB, shaped on a probe of 2026-11-28: 2 reads 902.5 MiB over a base of
    891.72 (901.74 in that probe: its small batches' readings move by a MiB between runs), 20 reads 992.25 over
    893.64, then 5.03 MiB a sample (38 read 1082.76); its floor 4.97 MiB (its heap churns 3.97 MiB a step, plus 1):
    38 fits with 2.2 MiB free, inside the floor (marginal), 39 runs out."""
    floor = 4.97 * MiB
    peak = 902.5 * MiB if batch == 2 else (992.25 + 5.03 * (batch - 20)) * MiB
    if peak > LIGHTNING_LIMITS.capacity:
        return Observation(batch, Outcome.OUT_OF_MEMORY, steady=deciding)
    marginal = deciding and LIGHTNING_LIMITS.capacity - peak <= floor
    return Observation(batch, Outcome.FITS, int(peak), int((891.72 if batch == 2 else 893.64) * MiB),
                       long_run=marginal, steady=deciding)


#: The floor known before any trial: a command's least (1 MiB over a churn not yet measured).
LIGHTNING_LIMITS = Limits(start=2, capacity=1085 * MiB, margin=1 * MiB, steady=True, confirmations=0)


def test_the_floor_the_trials_measured_steers_the_next_trial():
    """With the floor of the start (1 MiB) the line through 2 and 18 puts the edge at 38, so 39 is checked, runs
    out, and 38 is marginal: 5 trials, as the table's probe ran (docs/measurements.md). Asked before each trial, the
    floor its fits measured (4.97 MiB, once 18 has read the heap's churn) puts the edge at 37, and 38 checks it,
    stepping until steady: marginal, and 37 proves the maximum. 4 trials: the bare proof + 2."""
    fixed = _with_the_long_run([], LIGHTNING_LIMITS, _lightning)
    assert [o.batch_size for o in fixed] == [2, 18, 39, 38, 37]
    seen: list[int] = []

    def measured_floor() -> int:
        return int(4.97 * MiB) if seen and max(seen) >= 18 else 1 * MiB

    def device(batch: int, deciding: bool = False) -> Observation:
        observation = _lightning(batch, deciding)
        if observation.outcome is Outcome.FITS:
            seen.append(batch)
        return observation

    refreshed = _with_the_long_run([], LIGHTNING_LIMITS, device, margin=measured_floor)
    assert [o.batch_size for o in refreshed] == [2, 18, 38, 37]
    assert refreshed[2].steady and refreshed[2].long_run and refreshed[-1].steady
