"""The script's cycle (issue 55): an evaluation pass told from the steps' own forwards, the wait's bounds, and
what the result says (``isoprobe.report.cycle``). Pure: recorded counts, no processes."""

from __future__ import annotations

import pytest

from isoprobe.report.cycle import CycleRule, CycleSeen, describe, evaluation_step, seen, waiting_done

RULE = CycleRule(max_steps=60, max_seconds=120.0)


@pytest.mark.parametrize("counts, step", [
    ([0, 0, 0, 0, 0], None),                       # no evaluation at all
    ([0] * 12 + [2] + [0] * 5, 13),                # every 12 steps, after step 12: in step 13's interval
    ([2, 0, 0, 0, 2, 0], 5),                       # Lightning's sanity check before step 1 is not the pass
    ([1, 1, 1, 1, 1, 1], None),                    # a frozen teacher in every step: part of the step
    ([1, 1, 1, 1, 3, 1], 5),                       # a teacher every step, and an evaluation on top
    ([0, 2, 0, 2, 0], 4),                          # every other step: step 3 holds none, so step 4 holds a pass
])
def test_a_pass_is_more_evaluation_forwards_than_every_step_since_the_second(counts, step):
    assert evaluation_step(counts) == step


def test_the_trial_waits_for_the_pass_and_the_window_after_it_then_stops():
    counts = [0] * 12 + [2]
    assert waiting_done(counts, RULE, 5.0, after=5) is None  # the pass's step itself: its rise must settle
    assert waiting_done(counts + [0] * 4, RULE, 5.0, after=5) is None
    assert waiting_done(counts + [0] * 5, RULE, 5.0, after=5) == "seen"
    assert waiting_done(counts, RULE, 5.0, after=0) == "seen"  # a soak: the step after the pass is enough


def test_the_wait_is_bounded_in_steps_and_in_seconds_but_not_once_a_pass_is_seen():
    assert waiting_done([0] * 59, RULE, 10.0) is None
    assert waiting_done([0] * 60, RULE, 10.0) == "steps"
    assert waiting_done([0] * 10, RULE, 120.0) == "seconds"
    assert waiting_done([0] * 59 + [3], RULE, 500.0, after=5) is None  # seen at the bound: its window still runs
    assert waiting_done([0] * 59 + [3] + [0] * 5, RULE, 500.0, after=5) == "seen"
    assert waiting_done([0] * 3, None, 0.0) == "off"


def test_the_record_names_the_pass_its_peak_and_the_checkpoints():
    record = seen([0, 0, 0, 0, 3, 0], [0, 0, 1, 0, 0, 1], [10, 11, 11, 11, 20, 11])
    assert (record.evaluation_step, record.evaluation_forwards, record.evaluation_peak_bytes) == (5, 3, 20)
    assert record.checkpoint_steps == [3, 6] and record.steps == 6


def test_what_the_result_says_for_a_pass_for_none_within_the_bound_and_for_a_whole_run():
    found = seen([0, 0, 0, 0, 3, 0], [0] * 6, [10, 11, 11, 11, 20, 11]).model_copy(update={"waited": True})
    assert describe(found).startswith("evaluation seen at step 5 (3 evaluation forward(s), peak 20 bytes)")
    none = CycleSeen(steps=60, waited=True, bound="steps")
    text = describe(none)
    assert "no evaluation pass within 60 steps" in text and "covers training steps only" in text
    assert "search.cycle_steps" in text
    assert "whole run seen" in describe(CycleSeen(steps=30, waited=True, bound="ended"))
    assert describe(None) is None
