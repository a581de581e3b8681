"""Throughput and the memory breakdown, from literal trials: pure functions, no processes."""

from __future__ import annotations

import pytest

from isoprobe.search.insights import fastest_batch_size, memory_breakdown, step_throughput, throughput
from isoprobe.report.outcomes import Outcome
from isoprobe.report.trial import Sizes, Trial


def trial(batch: int, outcome: str = "fits", *, steps=(3.0, 1.0, 1.0), peak: int | None = None,
          purpose: str = "search", sizes: Sizes | None = None, index: int = 1) -> Trial:
    speed, spread = step_throughput(batch, list(steps)) if outcome == "fits" else (None, None)
    return Trial(index=index, batch_size=batch, purpose=purpose, outcome=Outcome(outcome), seconds=5.0,
                 step_seconds=list(steps), samples_per_second=speed, step_seconds_spread=spread,
                 budget_peak_bytes=peak, peak_bytes=peak, sizes=sizes)


def test_the_first_step_is_warm_up_and_left_out():
    speed, spread = step_throughput(32, [10.0, 2.0, 2.0, 2.2])
    assert speed == pytest.approx(32 / 2.0)
    assert spread == pytest.approx(0.1)


def test_one_timed_step_has_no_spread_and_no_timed_step_no_throughput():
    assert step_throughput(8, [5.0, 1.0]) == (8.0, None)
    assert step_throughput(8, [5.0]) == (None, None)
    assert step_throughput(8, []) == (None, None)


def test_fastest_is_the_smallest_batch_within_the_tolerance_of_the_best():
    # MobileNetV3 in the seeds: 127 as fast as 128; 500 as good as 512.
    speeds = {64: 900.0, 127: 1000.0, 128: 1001.0, 500: 1010.0, 512: 1012.0}
    assert fastest_batch_size(speeds, 0.03) == 127
    assert fastest_batch_size(speeds, 0.0) == 512
    assert fastest_batch_size(speeds, 0.2) == 64
    assert fastest_batch_size({}, 0.03) is None


def test_the_curve_keeps_the_best_run_per_batch_and_skips_failures_and_memory_checks():
    trials = [
        trial(2, steps=(3.0, 1.0, 1.0)),            # 2 samples/s
        trial(16, steps=(3.0, 2.0, 2.0)),           # 8 samples/s
        trial(16, steps=(3.0, 4.0, 4.0), purpose="confirmation"),  # slower rerun: not kept
        trial(17, "out_of_memory"),
        trial(17, steps=(3.0, 0.1, 0.1), purpose="memory_check"),  # ran with more memory: not a point
    ]
    curve = throughput(trials, 0.03)
    assert [(p.batch_size, p.samples_per_second) for p in curve.points] == [(2, 2.0), (16, 8.0)]
    assert curve.fastest_batch_size == 16 and curve.best_samples_per_second == 8.0
    assert "tested batch sizes" in curve.note


def test_no_fitting_trial_means_no_curve():
    assert throughput([trial(4, "out_of_memory")], 0.03) is None


def test_breakdown_takes_sizes_from_the_largest_fit_and_activations_from_the_line():
    small = Sizes(parameter_bytes=100, gradient_bytes=100, optimizer_state_bytes=200)
    large = Sizes(parameter_bytes=100, gradient_bytes=100, optimizer_state_bytes=200)
    trials = [
        trial(2, peak=1000 + 2 * 50, sizes=small),
        trial(10, peak=1000 + 10 * 50, sizes=large),
        trial(11, "out_of_memory"),
    ]
    b = memory_breakdown(trials)
    assert b.from_batch_size == 10
    assert (b.parameter_bytes, b.gradient_bytes, b.optimizer_state_bytes) == (100, 100, 200)
    assert b.activation_bytes_per_sample == pytest.approx(50)
    assert b.fixed_bytes == pytest.approx(1000)


def test_breakdown_with_one_fitting_trial_has_sizes_but_no_line():
    b = memory_breakdown([trial(2, peak=5000, sizes=Sizes(parameter_bytes=8))])
    assert b.parameter_bytes == 8 and b.activation_bytes_per_sample is None and b.fixed_bytes is None
    assert memory_breakdown([trial(2, "out_of_memory")]) is None
