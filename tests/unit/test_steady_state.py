"""Steady state as the criterion for the maximum: the rule (isoprobe.report.steady), and probes of scripted devices whose
memory grows over steps (growth that stops, a leak that never does), through the real search and classification.

The scripted device (executors.scripted.linear with ``growth``) steps as a real child does when its request
carries a steady rule: until ``steady.should_stop``, or out of memory at the first step over the budget.
"""

from __future__ import annotations

import pytest

from isoprobe.report import steady
from isoprobe.search import long_run
from isoprobe.executors.scripted import ScriptedExecutor, fits, gang, linear
from isoprobe.report.outcomes import Outcome, StopReason
from isoprobe.pipeline.plausibility import Asked
from isoprobe.pipeline.trial_record import trial_from_run
from isoprobe.protocol.messages import TrialRequest
from isoprobe.spec.model import Spec

from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, MiB, hog_spec, probe

RULE = steady.SteadyRule(min_steps=2, max_steps=30)


# --------------------------------------------------------------------------- the rule


def test_a_peak_is_steady_only_after_it_held_still_for_the_whole_window():
    flat = [100 * MiB] * (steady.WINDOW_STEPS + 1)
    assert steady.is_steady(flat, RULE)
    assert not steady.is_steady(flat[:-1], RULE)  # one step short of the window: not yet
    # The measured trap (FSDP2 rank 0, ZeRO-1 rank 1): four flat steps, then a rise of a few MiB.
    plateau = [90 * MiB, 95 * MiB, 96 * MiB, 96 * MiB, 96 * MiB, 96 * MiB, 98 * MiB]
    assert not any(steady.is_steady(plateau[:n], RULE) for n in range(1, len(plateau) + 1))
    risen = [100 * MiB] * steady.WINDOW_STEPS + [100 * MiB + steady.TOLERANCE_BYTES + 4096]
    assert not steady.is_steady(risen, RULE)
    within = [100 * MiB] * steady.WINDOW_STEPS + [100 * MiB + steady.TOLERANCE_BYTES]
    assert steady.is_steady(within, RULE)


def test_a_trial_stops_when_steady_or_at_the_cap_and_never_before_its_minimum():
    rule = steady.SteadyRule(min_steps=8, max_steps=12)
    assert not steady.should_stop([5] * 7, rule)  # steady, but the search's steps are not done
    assert steady.should_stop([5] * 8, rule)
    rising = [k * MiB for k in range(12)]
    assert not steady.should_stop(rising[:11], rule) and steady.should_stop(rising, rule)


def test_the_rule_follows_the_spec_and_a_cap_too_small_to_see_a_steady_peak_is_raised():
    assert steady.rule_for(3, None).max_steps == steady.DEFAULT_MAX_STEPS
    assert steady.rule_for(3, 0) is None
    assert steady.rule_for(3, 2).max_steps == steady.WINDOW_STEPS + 1
    assert steady.rule_for(40, 10).max_steps == 40


def test_the_long_run_search_jumps_by_the_growth_doubles_down_then_bisects():
    assert long_run.first_jump([1000, 1010, 1040, 1070], 2, None, 10.0) == 6  # 60 grown after step 2
    assert long_run.first_jump([1000, 1040], 2, 1100, 10.0) == 6  # out of memory: at least up to the capacity
    assert long_run.first_jump([1000, 1040], 2, 1100, None) == 1
    ran = {60: False}
    assert long_run.next_long_run_batch(ran, 4) == 56
    ran[56] = False
    assert long_run.next_long_run_batch(ran, 4) == 48  # no steady batch yet: twice as far
    ran[48] = True
    assert long_run.next_long_run_batch(ran, 4) == 52  # then bisection between 48 and 56
    ran.update({52: True, 54: False, 53: True})
    assert long_run.next_long_run_batch(ran, 4) is None
    assert long_run.next_long_run_batch({1: False}, 4) is None  # batch 1 failed: nothing holds


# --------------------------------------------------------------------------- probes


def _growing_then_steady(k: int) -> int:
    """10 MiB more after each of the first ten steps, then nothing."""
    return 10 * MiB * min(k - 1, 10)


def test_memory_that_grows_for_ten_steps_then_stops_gets_the_edge_of_its_steady_state():
    probed = probe(hog_spec(), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, growth=_growing_then_steady)))
    result = probed.result
    budget = 1536 * MiB
    steady_edge = (budget - HOG_FIXED - 100 * MiB) // HOG_PER_SAMPLE  # 22: what a long run holds
    assert steady_edge == 22 and HOG_MAX == 25
    assert probed.exit_code == 0 and result.stop_reason is StopReason.EDGE_FOUND
    assert result.max_batch_size == steady_edge
    # 23 either runs out in the long run or its peak reaches the capacity less the spread first, which ends it
    # (steady.past_the_margin: it cannot be the maximum however long it runs): marginal, then.
    assert result.first_failing_batch_size == steady_edge + 1 or \
        steady_edge + 1 in [m.batch_size for m in result.edge_margin.marginal]
    # The short trials' edge (25) is the check right above the line's edge, so it steps on as the edge's proof
    # would, and runs out at step 3: the long run decides below it, and 24 and 23 fail it. 23 stops at the margin
    # of the least spread the probe could end with (1.5 MiB: its trials read no heap churn, so the floor ends at
    # 8 MiB), and is marginal.
    assert result.short_max_batch_size == HOG_MAX and 23 in [m.batch_size for m in result.edge_margin.marginal]
    assert "batch 22 fits" in result.message and f"{HOG_MAX} fit 2 steps but its peak kept rising" in result.message
    deciding = [t for t in result.trials if t.purpose in ("confirmation", "long_run")]
    assert deciding and all(t.steady_rule is not None for t in deciding)
    (proof,) = [t for t in deciding if t.batch_size == steady_edge]
    assert proof.outcome is Outcome.FITS
    assert len(proof.step_seconds) == 11 + steady.WINDOW_STEPS  # grew to step 11, then held for the window
    assert len(proof.step_budget_peak_bytes) == len(proof.step_seconds)
    # The search's own trials stay short: only the trials that decide the maximum pay for the long run.
    assert all(len(t.step_seconds) == 2 for t in result.trials if t.purpose == "search" and t.outcome is Outcome.FITS)


def test_memory_that_never_stops_growing_is_reported_as_such_with_no_maximum():
    leak = ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, growth=lambda k: MiB * (k - 1)))
    result = probe(hog_spec(), leak).result
    assert result.stop_reason is StopReason.STILL_RISING and not result.answered
    assert result.max_batch_size is None  # no step proved any batch holds the long run
    assert result.short_max_batch_size == HOG_MAX
    assert result.first_failing_outcome is Outcome.STILL_RISING
    assert "no batch holds the long run" in result.message
    still = [t for t in result.trials if t.outcome is Outcome.STILL_RISING]
    assert still and all(len(t.step_seconds) == steady.DEFAULT_MAX_STEPS for t in still)
    assert min(t.batch_size for t in result.trials if t.purpose == "long_run") == result.first_failing_batch_size


def test_a_steady_device_costs_a_few_more_steps_of_one_trial_and_the_edge_is_unchanged():
    """Issue 35: the trial that decides the maximum steps until steady (the window and one), no second process.
    The check right above the line's edge (26) is asked to step on too, and runs out at once."""
    probed = probe(hog_spec(), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE)))
    result = probed.result
    assert (result.max_batch_size, result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)
    assert result.short_max_batch_size is None
    (deciding,) = [t for t in result.trials if t.steady_rule is not None and t.outcome is Outcome.FITS]
    assert deciding.batch_size == HOG_MAX and len(deciding.step_seconds) == steady.WINDOW_STEPS + 1
    assert all(len(t.step_seconds) <= 2 for t in result.trials if t is not deciding)  # search.steps, or fewer
    assert not [t for t in result.trials if t.purpose in ("long_run", "confirmation")]


def test_steady_steps_0_keeps_every_trial_short():
    spec = hog_spec(steady_steps=0)
    probed = probe(spec, ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, growth=_growing_then_steady)))
    assert probed.result.max_batch_size == HOG_MAX and probed.result.short_max_batch_size is None
    assert all(c.request.steady is None for c in probed.executor.calls)


def _request(batch: int = 8) -> TrialRequest:
    return TrialRequest(spec=Spec.model_validate(hog_spec()), batch_size=batch, device="cpu", steady=RULE)


def test_a_gang_is_steady_only_when_every_rank_is():
    asked = Asked(steps=2, backend="cpu", steady=RULE)
    flat = [900 * MiB] * 8
    rising = [900 * MiB + k * MiB for k in range(8)]
    run = gang(fits(flat[-1], step_peaks=flat), fits(rising[-1], step_peaks=rising))
    trial = trial_from_run(run, 1, 8, "confirmation", asked)
    assert trial.outcome is Outcome.STILL_RISING and "still rising after 8 steps" in trial.reclassified
    assert [r.outcome for r in trial.ranks] == [Outcome.FITS, Outcome.STILL_RISING]
    both = trial_from_run(gang(fits(flat[-1], step_peaks=flat), fits(flat[-1], step_peaks=flat)), 1, 8,
                          "confirmation", asked)
    assert both.outcome is Outcome.FITS


@pytest.mark.parametrize("steps, verdict", [(1, Outcome.CRASHED), (31, Outcome.CRASHED), (30, Outcome.STILL_RISING)])
def test_a_deciding_trial_must_run_between_its_minimum_and_its_cap(steps, verdict):
    peaks = [900 * MiB + k * MiB for k in range(steps)]
    asked = Asked(steps=2, backend="cpu", steady=RULE)
    trial = trial_from_run(fits(peaks[-1], step_peaks=peaks), 1, 8, "confirmation", asked)
    assert trial.outcome is verdict


# --------------------------------------------------------------------------- the pure search


def test_the_search_confirms_with_a_steady_trial_and_stops_at_a_long_run_failure():
    from isoprobe.search.edge_search import conclude, plan_next
    from isoprobe.search.history import Limits, Observation, verdicts

    limits = Limits(start=2, confirmations=1)
    history = [Observation(2, Outcome.FITS, 100), Observation(4, Outcome.OUT_OF_MEMORY), Observation(3, Outcome.FITS, 150)]
    assert plan_next(history, limits) == 3  # the confirmation (the product runs it until steady)
    assert plan_next(history, Limits(start=2, confirmations=0)) is None  # none asked: none run (issue 34)
    history.append(Observation(3, Outcome.OUT_OF_MEMORY, long_run=True))
    judged = verdicts(history, limits)[3]
    assert judged.outcome is Outcome.OUT_OF_MEMORY and not judged.flaky and judged.long_run
    assert plan_next(history, limits) is None  # the short search is over
    conclusion = conclude(history, limits)
    assert conclusion.long_run_failure == 3 and not conclusion.exact and conclusion.max_fitting == 2
    # A failure in a confirmation's first steps is no long-run failure: the batch is flaky, as before, and the
    # search goes on (the next maximum's steady confirmation).
    flaky = history[:3] + [Observation(3, Outcome.OUT_OF_MEMORY)]
    assert verdicts(flaky, limits)[3].flaky and plan_next(flaky, limits) == 2


# --------------------------------------------------------------------------- a quiet heap's window

QUIET = steady.SteadyRule(min_steps=3, max_steps=30, quiet_window=steady.QUIET_WINDOW_STEPS)


def test_a_quiet_heap_is_steady_after_the_shorter_window_and_any_loud_or_unread_step_keeps_the_long_one():
    """The window waits out the heap's growth pauses; a process whose heap churned at most a MiB in every step after
    the first has none (docs/steady-state.md, "A quiet heap"). Step 1 builds what the run keeps: its churn is not
    judged."""
    flat = [90 * MiB] + [100 * MiB] * 4  # step 2 reaches the peak, steps 3 to 5 hold it: the quiet window
    quiet = [50 * MiB] + [MiB // 4] * 4
    assert steady.is_steady(flat, QUIET, quiet) and steady.should_stop(flat, QUIET, quiet)
    assert not steady.is_steady(flat[:-1], QUIET, quiet[:-1])  # steps 3 and 4 only: not yet
    assert not steady.is_steady(flat, QUIET)  # no churn read: the window of 5
    assert not steady.is_steady(flat, QUIET, quiet[:-1] + [steady.QUIET_CHURN_BYTES + 1])  # one loud step
    assert not steady.is_steady(flat, QUIET, quiet[:-1] + [None])  # one step unread
    assert not steady.is_steady(flat, RULE, quiet)  # a rule without the quiet window (a gang, a command)
    assert steady.window_for(quiet, QUIET) == 3 and steady.window_for(quiet, RULE) == steady.WINDOW_STEPS
    rising = [90 * MiB, 100 * MiB, 100 * MiB, 100 * MiB, 101 * MiB]
    assert not steady.is_steady(rising, QUIET, quiet)  # the peak must still hold still over the window


def test_only_one_process_of_isoprobes_own_on_the_cpu_gets_the_quiet_window():
    assert steady.rule_for(3, None, quiet=True).quiet_window == steady.QUIET_WINDOW_STEPS
    assert steady.rule_for(3, None).quiet_window is None
    plain = probe(hog_spec(), ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE))).result
    assert {t.steady_rule.quiet_window for t in plain.trials if t.steady_rule} == {steady.QUIET_WINDOW_STEPS}
    ddp = hog_spec()
    ddp["distributed"] = {"strategy": "ddp", "world_size": 2}
    device = linear(HOG_FIXED, HOG_PER_SAMPLE)
    ranks = probe(ddp, ScriptedExecutor(lambda call: gang(device(call), device(call)))).result
    assert {t.steady_rule.quiet_window for t in ranks.trials if t.steady_rule} == {None}


def test_the_parent_judges_the_quiet_window_from_the_steps_churns_as_the_child_did():
    """A deciding trial that stopped after 5 steps fits where its steps read a quiet heap, and is still_rising where
    one of them did not: the child's stop is checked, never taken on trust."""
    from isoprobe.pipeline.classify import still_rising
    from isoprobe.protocol.messages import StepDone

    asked = Asked(steps=3, backend="cpu", steady=QUIET)
    peaks = [90 * MiB] + [100 * MiB] * 4

    def events(churns):
        return [StepDone(step=k + 1, seconds=1.0, budget_peak_bytes=p, heap_churn_bytes=c)
                for k, (p, c) in enumerate(zip(peaks, churns))]
    assert still_rising(events([50 * MiB] + [0] * 4), asked) is None
    assert "over the last 5" in still_rising(events([50 * MiB, 0, 0, 2 * MiB, 0]), asked)


def test_a_batch_the_search_already_ran_until_steady_is_not_run_again_below_a_marginal_one():
    """The 64-pixel Trainer's path (docs/steady-state.md): the line's edge (24) steps until steady and clears the
    spread; 25 fits only inside the spread. The long-run search below 25 starts from what the probe proved: 24 is
    the maximum, and no second process runs it (before, it ran again, 7 steps)."""
    budget_fixed = 1536 * MiB - 4 * MiB - 25 * HOG_PER_SAMPLE  # 25: 4 MiB free (inside 8 MiB), 24: 36 MiB
    big = linear(budget_fixed, HOG_PER_SAMPLE)
    small = linear(budget_fixed + 3 * HOG_PER_SAMPLE // 2, HOG_PER_SAMPLE)  # small batches peak above the line
    result = probe(hog_spec(), ScriptedExecutor(lambda call: (small if call.batch_size < 16 else big)(call))).result
    assert (result.max_batch_size, [m.batch_size for m in result.edge_margin.marginal]) == (24, [25])
    (proof,) = [t for t in result.trials if t.batch_size == 24]
    assert proof.outcome is Outcome.FITS and proof.steady_rule is not None and proof.purpose == "search"
    assert result.max_steady


def test_the_childs_step_hook_stops_a_quiet_heap_after_the_shorter_window(monkeypatch):
    """The child applies the quiet window itself (``child.core.step_report.StepHook``): with a flat peak from step 2 and a
    quiet heap it stops after step 5, with a loud one after step 7. A child that ignored ``quiet_window`` would
    step on to 7 in both (the parent's re-judgement accepts either, so only this sees it)."""
    from types import SimpleNamespace

    from isoprobe.child.core import step_report

    def steps_until_stop(churn: int) -> int:
        peaks = iter([90 * MiB] + [100 * MiB] * 29)
        monkeypatch.setattr(step_report, "step_memory", lambda torch, device: {
            "peak_bytes": 0, "held_bytes": 0, "budget_peak_bytes": next(peaks), "heap_churn_bytes": churn})
        request = _request().model_copy(update={"steady": QUIET})
        hook = step_report.StepHook(None, SimpleNamespace(type="cpu"), request, SimpleNamespace(emit=lambda e: None),
                                    step_report.Progress())
        for step in range(1, 31):
            hook.begin()
            if hook.after_step():
                return step
        return 30
    assert steps_until_stop(MiB // 4) == 1 + steady.QUIET_WINDOW_STEPS + 1
    assert steps_until_stop(2 * MiB) == 1 + steady.WINDOW_STEPS + 1


KiB = 1 << 10


def _slice_keeping_device(kept_per_sample: int, every: int):
    """A device whose script keeps a slice of every batch (issue 47's leak): ``kept_per_sample`` bytes a sample,
    handed back to the heap in jumps every ``every`` steps (the heap grows by whole chunks), as a running peak."""
    from isoprobe.executors.scripted import _asked_steps, out_of_memory

    def script(call):
        first = HOG_FIXED + HOG_PER_SAMPLE * call.batch_size
        rule, peaks = call.request.steady, []
        while True:
            k = len(peaks) + 1
            peak = first + ((k - 1) // every) * every * kept_per_sample * call.batch_size
            if call.budget is not None and peak > call.budget:
                return out_of_memory(at_step=k, step_peaks=peaks)
            peaks.append(max(peaks[-1] if peaks else 0, peak))
            if steady.should_stop(peaks, rule) if rule is not None else len(peaks) >= (_asked_steps() or 3):
                return fits(peaks[-1], base_bytes=HOG_FIXED, step_peaks=peaks)

    return script


def test_a_leak_that_rises_in_jumps_is_not_read_as_steady_below_batches_seen_still_rising():
    """A script keeping 1 KiB of every sample a step, handed to the heap in jumps every 4 steps: the batches near
    the edge (25) are still rising at the cap, but 16 rose by no more than 256 KiB over its last 5 steps, "held
    still", and was the answer (issue 47: 15 "survived", and ran out at step 1,326 of a real run). Now a deciding
    trial's window is long enough for the rise the still-rising trials showed, scaled to its batch: no batch is
    credited whose leak its window could have seen."""
    probed = probe(hog_spec(), ScriptedExecutor(_slice_keeping_device(4 * KiB, 4)))
    result = probed.result
    rising = [t.batch_size for t in result.trials if t.outcome is Outcome.STILL_RISING]
    assert rising and result.max_batch_size is not None and result.max_batch_size < min(rising)
    for trial in result.trials:
        if trial.outcome is Outcome.FITS and trial.steady_rule is not None:
            rule, leak_a_step = trial.steady_rule, KiB * trial.batch_size
            assert rule.window * leak_a_step > rule.tolerance_bytes or rule.window == rule.max_steps - 1
            assert leak_a_step * rule.window <= 2 * rule.tolerance_bytes  # what fit leaked less than it could see
    assert result.max_batch_size == 2  # 16 before: 240 KiB jumps fit inside a 5-step window's tolerance
    assert "still rising" in result.message


def test_the_window_a_rising_rate_needs_is_long_enough_to_see_it_twice_and_the_quiet_window_is_off():
    rule = steady.rule_for(3, None, quiet=True)
    assert steady.watching_for(rule, None) == rule
    watching = steady.watching_for(rule, 40 * KiB)
    assert watching.window == 13 and watching.quiet_window is None  # 2 x 256 KiB / 40 KiB, rounded up
    assert steady.watching_for(rule, 1.0).window == rule.max_steps - 1  # never past the cap
    assert steady.rising_rate([0, 0, 0, 100, 200, 300]) == 100.0
    assert steady.rising_rate([0, 10, 20]) is None
