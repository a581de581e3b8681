"""soak.judge and soak.lower_batch: what a soak's per-step peaks say, and where the batch goes next."""

from __future__ import annotations

from isoprobe.search.soak import FALLBACK_STEP_DOWN, judge, lower_batch

MiB = 1024**2
TARGET = 1000 * MiB


def test_a_flat_soak_below_the_target_survives_and_is_not_rising():
    peaks = [900 * MiB, 940 * MiB] + [941 * MiB] * 18  # warm-up, then flat
    judged = judge(True, 20, peaks, TARGET)
    assert judged.survived and not judged.still_rising
    assert abs(judged.growth_bytes_per_step) < MiB


def test_growth_during_the_warm_up_alone_is_not_rising():
    # The first steps allocate the optimizer's state and the allocator's pools: not a leak.
    peaks = [700 * MiB, 850 * MiB, 900 * MiB, 900 * MiB, 900 * MiB, 900 * MiB]
    assert not judge(True, 6, peaks, TARGET).still_rising


def test_a_leak_above_the_target_does_not_survive_and_is_projected():
    peaks = [900 * MiB + k * 48 * MiB for k in range(6)]  # +48 MiB a step: 1140 MiB at the end
    judged = judge(True, 6, peaks, TARGET)
    assert judged.still_rising and not judged.survived
    assert judged.growth_bytes_per_step == 48 * MiB
    assert judged.projected_peak_bytes == peaks[-1]  # every step ran: nothing to project


def test_a_leak_still_below_the_target_survives_flagged():
    peaks = [800 * MiB + k * 10 * MiB for k in range(6)]
    judged = judge(True, 6, peaks, TARGET)
    assert judged.survived and judged.still_rising


def test_noise_below_the_floor_is_not_rising():
    peaks = [900 * MiB, 900 * MiB, 901 * MiB, 902 * MiB, 902 * MiB, 903 * MiB]
    assert not judge(True, 6, peaks, TARGET).still_rising


def test_a_soak_that_ran_out_of_memory_never_survives_and_projects_its_growth_to_the_end():
    peaks = [900 * MiB + k * 50 * MiB for k in range(4)]  # ran out in step 5 of 20
    judged = judge(False, 20, peaks, TARGET)
    assert not judged.survived
    assert judged.projected_peak_bytes == peaks[-1] + 50 * MiB * 16


def test_a_soak_that_stopped_short_without_a_verdict_never_survives():
    assert not judge(True, 20, [900 * MiB] * 5, TARGET).survived  # 'fits' after 5 of 20 steps: not a soak


def test_lower_batch_moves_down_by_what_the_growth_costs_in_samples():
    judged = judge(True, 6, [900 * MiB + k * 48 * MiB for k in range(6)], TARGET)  # 140 MiB over the target
    assert lower_batch(20, judged, 32 * MiB, TARGET) == 20 - 5  # ceil(140 / 32)


def test_lower_batch_rounds_down_to_the_multiple_and_falls_back_without_a_line():
    judged = judge(True, 6, [900 * MiB + k * 48 * MiB for k in range(6)], TARGET)
    assert lower_batch(20, judged, 32 * MiB, TARGET, multiple_of=8) == 8
    assert lower_batch(64, judged, None, TARGET) == 64 - int(64 * FALLBACK_STEP_DOWN)
    early = judge(False, 20, [900 * MiB], TARGET)  # out of memory in step 2: no growth measured
    assert lower_batch(16, early, 32 * MiB, TARGET) == 14
    assert lower_batch(1, early, 32 * MiB, TARGET) == 0  # nothing below 1
