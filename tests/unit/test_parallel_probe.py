"""search.parallel through the probe with scripted children: the same answer as one slot, a crashing slot retried."""

from __future__ import annotations

import signal

import pytest

from isoprobe.executors.scripted import ScriptedExecutor, crashed, linear
from isoprobe.probe.parallel import cpu_slot_limit
from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, hog_spec, probe


def with_slots(slots, **search):
    spec = hog_spec(**search)
    spec["search"]["parallel"] = slots
    return spec


def test_two_slots_find_the_one_slot_answer_and_every_trial_is_in_the_result():
    one = probe(with_slots(1), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    two = probe(with_slots(2), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    assert (two.result.max_batch_size, two.result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)
    assert (one.result.max_batch_size, one.result.stop_reason) == (two.result.max_batch_size, two.result.stop_reason)
    assert [t.index for t in two.trials] == list(range(1, len(two.trials) + 1))
    assert any("2 slots" in line for line in two.lines)
    assert all(t.outcome.value == "fits" for t in two.at(HOG_MAX))


def test_a_slot_that_crashes_mid_round_is_retried_in_a_fresh_process():
    def faults(call):
        return crashed(signal.SIGSEGV) if call.number == 3 else None

    two = probe(with_slots(2), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, faults=faults)))
    crashed_trial = two.trials[2]
    assert crashed_trial.outcome.value == "crashed"
    assert any(t.purpose == "retry" and t.batch_size == crashed_trial.batch_size for t in two.trials[3:])
    assert two.result.max_batch_size == HOG_MAX and two.result.first_failing_batch_size == HOG_MAX + 1


@pytest.mark.parametrize("budget, cores, ram, slots", [
    (1 << 30, 2, 24 << 30, 2), (8 << 30, 16, 24 << 30, 2), (1 << 30, 1, 64 << 30, 1), (32 << 30, 8, 16 << 30, 1)])
def test_cpu_slots_are_bounded_by_cores_and_by_the_budgets_within_ram(budget, cores, ram, slots):
    assert cpu_slot_limit(budget, cores, ram) == slots
