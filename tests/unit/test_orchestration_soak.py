"""The recommendation's soak, as orchestration over a scripted executor: run long, move down, withdraw.

The device is memory_hog's under the 1.5 GiB cap (tests/support/scripted_probe.py);
``growth_per_step`` adds memory that stays behind after every step, as a leak
in user code does. The search's trials run search.steps (2) steps and do not
see it; the soak runs recommendation.soak_steps and does.
"""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from isoprobe.errors import Terminated
from isoprobe.executors.scripted import ScriptedExecutor, crashed, inspected, linear
from isoprobe.report.outcomes import Outcome
from isoprobe.report.output import summary_lines
from isoprobe.protocol.messages import Estimate, Estimated
from isoprobe.pipeline.recommendation import DEFAULT_SOAK_STEPS, MAX_SOAKS
from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, MiB, hog_spec, probe
from test_cache_trust import _check_every_cacheable


def soaked_spec(soak_steps: int | None = None, **recommendation) -> dict:
    spec = hog_spec(start_batch_size=12)
    # The soak is what these tests check: the edge's steady confirmation (which would catch a leak before the
    # soak, test_steady_state.py) is off, so the edge is the short trials' as before.
    spec["search"]["steady_steps"] = 0
    spec["recommendation"] = {"headroom": 0.1, **recommendation}
    if soak_steps is not None:
        spec["recommendation"]["soak_steps"] = soak_steps
    return spec


def leaky(growth: int, **kwargs):
    return ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, growth_per_step=growth, **kwargs))


def soaks_of(probed):
    return [t for t in probed.trials if t.purpose == "soak"]


def test_the_recommended_batch_is_soaked_on_cpu_by_default_and_survives():
    probed = probe(soaked_spec(), leaky(0))
    result = probed.result
    (soak,) = soaks_of(probed)
    assert soak.batch_size == result.recommended_batch_size and soak.outcome is Outcome.FITS
    assert probed.executor.calls[soak.index - 1].request.steps == DEFAULT_SOAK_STEPS["cpu"] == 6
    assert len(soak.step_peak_bytes) == len(soak.step_seconds) == 6  # the peak after every step, in the JSON
    recommendation = result.recommendation
    assert recommendation.soak_steps == 6 and [s.survived for s in recommendation.soaks] == [True]
    assert recommendation.soaks[0].trial == soak.index and not recommendation.soaks[0].still_rising
    assert recommendation.measured_peak_bytes == soak.peak_bytes
    assert "survived a soak of 6 steps" in recommendation.note
    assert recommendation.decided_by == "line"  # the soak of the line's batch survived: the line set it
    assert _check_every_cacheable([(probed.result.spec, result)]) == 1


def test_a_soak_gets_a_timeout_stretched_to_its_steps():
    probed = probe(soaked_spec(soak_steps=8), leaky(0))
    timeouts = {c.request.steps: c.timeout for c in probed.executor.calls}
    assert timeouts[8] == pytest.approx(4 * timeouts[None])  # 8 steps where the search's trials run 2


def test_memory_that_grows_every_step_moves_the_recommendation_down_with_the_evidence():
    # 40 MiB stays behind after every step: the search's 2-step trials hardly see it (one step's
    # worth), a 6-step soak of the headroom batch runs past the headroom line and keeps rising.
    probed = probe(soaked_spec(), leaky(40 * MiB))
    result = probed.result
    assert result.max_batch_size is not None  # the edge (for search.steps steps) stands
    soaks = result.recommendation.soaks
    assert len(soaks) >= 2 and not soaks[0].survived and soaks[-1].survived
    assert soaks[0].still_rising and soaks[0].growth_bytes_per_step == pytest.approx(40 * MiB)
    assert [s.batch_size for s in soaks] == sorted((s.batch_size for s in soaks), reverse=True)
    assert result.recommended_batch_size == soaks[-1].batch_size < soaks[0].batch_size
    first = probed.trials[soaks[0].trial - 1]
    assert [b - a for a, b in zip(first.step_peak_bytes, first.step_peak_bytes[1:])] == [40 * MiB] * 5
    assert f"the soak of {soaks[0].batch_size} " in result.recommendation.note
    assert result.recommendation.decided_by == "soak"  # a path the line's batch did not survive: said
    assert _check_every_cacheable([(result.spec, result)]) == 1


def test_a_soak_that_runs_out_of_memory_moves_down_by_its_projected_growth():
    # 150 MiB a step: the headroom batch runs out of memory within the soak.
    probed = probe(soaked_spec(), leaky(150 * MiB))
    soaks = probed.result.recommendation.soaks
    assert soaks[0].outcome is Outcome.OUT_OF_MEMORY and soaks[0].steps_completed < 6
    assert soaks[0].projected_peak_bytes > probed.result.recommendation.capacity_bytes
    assert "ran out of memory after" in probed.result.recommendation.note


def test_growth_no_batch_survives_withdraws_the_recommendation_but_keeps_the_edge():
    # 200 MiB a step: the search's trials (2 steps) fit up to 19; 6 steps need 1000 MiB more than the
    # 720 MiB fixed part leaves under the 1536 MiB cap, whatever the batch.
    probed = probe(soaked_spec(), leaky(200 * MiB))
    result = probed.result
    assert result.max_batch_size == 19 and result.answered  # the edge (for search.steps steps) stands
    assert result.recommended_batch_size is None and result.recommendation.decided_by == "soak"
    assert len(result.recommendation.soaks) <= MAX_SOAKS and not any(s.survived for s in result.recommendation.soaks)
    assert any(line.startswith("isoprobe: no recommendation:") for line in summary_lines(result))
    assert "none survived its soak" in result.message and result.suggestions
    assert _check_every_cacheable([(result.spec, result)]) == 1


def _crash_soaks(times: int):
    """A ``linear`` faults hook: the first ``times`` soak requests crash (the search's trials do not)."""
    crashes = []

    def faults(call):
        if call.request.steps is not None and len(crashes) < times:
            crashes.append(call.number)
            return crashed(signal.SIGKILL)
        return None

    return faults


def test_a_crashed_soak_is_run_once_more_and_twice_withdraws_the_recommendation():
    once = probe(soaked_spec(), leaky(0, faults=_crash_soaks(1)))
    assert [t.outcome for t in soaks_of(once)] == [Outcome.CRASHED, Outcome.FITS]
    assert once.result.recommended_batch_size == soaks_of(once)[-1].batch_size

    twice = probe(soaked_spec(), leaky(0, faults=_crash_soaks(2)))
    assert [t.outcome for t in soaks_of(twice)] == [Outcome.CRASHED, Outcome.CRASHED]
    assert twice.result.recommended_batch_size is None  # unknown never counts as 'fits'
    assert "ended crashed twice" in twice.result.recommendation.note


def test_soak_steps_0_runs_no_trial_for_the_recommendation():
    """Issue 34: 'recommendation.soak_steps: 0 still runs a trial' (a recommendation_check of the advised batch
    when no search trial had run it). 0 means none: the trials are the search's alone, and the result says the
    recommendation was not soaked; with a soak, the same search is followed by the soak and soaked is true."""
    probed = probe(soaked_spec(soak_steps=0), leaky(40 * MiB))
    result = probed.result
    assert {t.purpose for t in result.trials} <= {"search", "retry", "memory_check", "confirmation"}, probed.sequence()
    assert soaks_of(probed) == [] and result.recommendation.soaks == [] and result.recommendation.soak_steps == 0
    assert result.recommended_batch_size is not None and result.recommended_batch_size <= result.max_batch_size
    assert not result.recommendation.soaked and "not soaked (recommendation.soak_steps 0)" in result.recommendation.note
    assert not any(t.batch_size == result.recommended_batch_size for t in result.trials)  # advised, not run
    assert result.recommendation.measured_peak_bytes is None
    assert _check_every_cacheable([(result.spec, result)]) == 1  # still a trusted answer for the cache
    soaked = probe(soaked_spec(), leaky(0)).result
    assert soaked.recommendation.soaked and soaked.trials[-1].purpose == "soak"


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_a_signal_during_the_soak_still_gives_one_document_with_the_trials_so_far(stop):
    plain = probe(soaked_spec(), leaky(0))
    at = soaks_of(plain)[0].index
    device = linear(HOG_FIXED, HOG_PER_SAMPLE)

    def script(call):
        if call.number == at:
            raise stop()
        return device(call)

    stopped = probe(soaked_spec(), ScriptedExecutor(script)).result
    assert stopped.stop_reason.value == ("interrupted" if stop is KeyboardInterrupt else "terminated")
    assert [t.index for t in stopped.trials] == list(range(1, at))
    assert stopped.recommended_batch_size is None


def test_a_plan_never_uses_a_batch_that_did_not_survive_its_soak():
    spec = soaked_spec()
    spec["plan"] = {"target_global_batch": 256, "world_size": 2}
    withdrawn = probe(spec, leaky(200 * MiB)).result
    assert withdrawn.recommended_batch_size is None and withdrawn.accumulation is None
    moved = probe(spec, leaky(40 * MiB)).result
    assert moved.accumulation.micro_batch_size <= moved.recommended_batch_size < moved.recommendation.soaks[0].batch_size


@pytest.mark.parametrize("fmt", ["env", "taskprolog"])
def test_hook_mode_gives_the_fallback_when_no_batch_survived_its_soak(monkeypatch, fmt):
    # Answered (the edge stands) but nothing recommended: a job must still get a batch size, so hook
    # mode gives the fallback with the reason, not an env without ISOPROBE_BATCH_SIZE.
    import isoprobe.cli.run
    from conftest import cli

    withdrawn = probe(soaked_spec(), leaky(200 * MiB)).result
    monkeypatch.setattr(isoprobe.cli.run, "_result_for", lambda args, log: withdrawn)
    run = cli("run", "specs/small-cnn.yaml", "--format", fmt, "--fallback-batch-size", "6")
    assert run.returncode == 0, run.stderr
    assert "ISOPROBE_BATCH_SIZE=6" in run.stdout and "ISOPROBE_FALLBACK=1" in run.stdout
    assert "ISOPROBE_STOP_REASON=no_recommendation" in run.stdout
    assert "none survived its soak" in run.stderr

    plain = cli("run", "specs/small-cnn.yaml", "--format", "env")  # without hook mode: said, not hidden
    assert "ISOPROBE_BATCH_SIZE" not in plain.stdout and "ISOPROBE_MAX_BATCH_SIZE=19" in plain.stdout
    assert "none survived its soak" in plain.stdout


def test_a_user_error_raised_only_after_the_searchs_steps_stops_the_probe_with_exit_4():
    """The user's step raises at step 4 (the search's trials run 2): a bug, not 'memory grows from step to step'.
    (With soak_steps 0 no trial runs past the search's steps: test_soak_steps_0_runs_no_trial_for_the_recommendation.)"""
    from isoprobe.executors.scripted import error
    from isoprobe.report.result import exit_code_for

    soak_steps = None

    def faults(call):
        if call.request.steps is not None:
            return error("deliberate bug at step 4", "KeyError")
        return None

    probed = probe(soaked_spec(soak_steps=soak_steps), leaky(0, faults=faults))
    result = probed.result
    assert result.stop_reason.value == "error" and exit_code_for(result.stop_reason) == 4 and not result.answered
    assert result.recommended_batch_size is None
    assert "raised KeyError: deliberate bug at step 4" in result.message and "grows" not in result.message
    assert not any("grows" in suggestion for suggestion in result.suggestions)
    if soak_steps is None:
        assert [t.outcome for t in soaks_of(probed)] == [Outcome.ERROR]  # no re-run: an error is not a crash
        assert "ended error:" in result.recommendation.note and "twice" not in result.recommendation.note


def _estimated(fixed: int, per_sample: int) -> ScriptedExecutor:
    """memory_hog's device, with an environment check that brings back an exact traced estimate."""
    check = inspected()
    check = replace(check, events=[*check.events,
                                   Estimated(estimate=Estimate(fixed_bytes=fixed, per_sample_bytes=float(per_sample)))])
    return ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE), inspected=check)


@pytest.mark.parametrize("soak_steps", [6, 0, None])
def test_a_headroom_below_where_the_estimate_started_the_search_is_kept_and_proven(soak_steps):
    """Issue 25: the search starts at the estimate's edge (issue 49: the edge itself, 25, then 26), so every batch
    that fit is above a 30 % headroom's line (11); the recommendation is 11, at or below the line (the line from
    the one fitting trial's base reading to its peak), and its soak proves it (soak_steps 0: no trial runs for
    it, issue 34, and the result says it was not soaked; null, the default: the maximum's steady trial proves it,
    issue 35, and the result names that trial). It was 20, reported above its headroom."""
    spec = soaked_spec(soak_steps, headroom=0.3)
    if soak_steps is None:  # the product's default: the steady rule on, a soak only where it adds evidence
        del spec["search"]["steady_steps"]
    probed = probe(spec, _estimated(HOG_FIXED, HOG_PER_SAMPLE))
    result = probed.result
    assert [t.batch_size for t in result.trials[:2]] == [25, 26] and result.max_batch_size == HOG_MAX
    assert min(t.batch_size for t in result.trials if t.purpose == "search") == 25
    recommendation = result.recommendation
    assert result.recommended_batch_size == 11
    assert HOG_FIXED + HOG_PER_SAMPLE * result.recommended_batch_size <= recommendation.target_peak_bytes
    assert recommendation.predicted_peak_bytes <= recommendation.target_peak_bytes
    proof = [t for t in result.trials if t.batch_size == 11 and t.purpose in ("soak", "recommendation_check")]
    if soak_steps is None:
        assert proof == [] and recommendation.soaks == [] and recommendation.soak_steps == 0
        assert recommendation.proven_by_trial == result.trials[0].index and result.trials[0].steady_rule is not None
        assert "no soak of its own" in recommendation.note
        return
    assert recommendation.proven_by_trial is None
    if soak_steps == 0:
        assert proof == [] and not recommendation.soaked and recommendation.measured_peak_bytes is None
        return
    assert proof and all(t.outcome is Outcome.FITS for t in proof) and recommendation.soaked
    assert recommendation.measured_peak_bytes == proof[-1].peak_bytes <= recommendation.target_peak_bytes


# --------------------------------------------------------------------------- a failed soak, explained by its evidence


def _soaks_fail(fault):
    """memory_hog's device, except that every soak request (its own steps) ends as ``fault()`` says."""
    return ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, faults=lambda call: fault() if call.request.steps else None))


def _grows(text: str) -> bool:
    return "grows from step to step" in text


def test_a_soak_out_of_memory_at_its_first_step_is_not_explained_as_growth():
    """Issue 34: 'a soak that fails at step 0 is explained as memory growth': every soak ran out of memory before
    its first step ended, so its peaks show nothing over steps, and a larger batch had fit the search's trials;
    the note and the suggestion said 'memory grows from step to step whatever the batch'. Now each says what the
    soak showed: the first step, the search trial that fit as large a batch, a difference between runs."""
    from isoprobe.executors.scripted import out_of_memory

    result = probe(soaked_spec(), _soaks_fail(lambda: out_of_memory(at_step=1))).result
    assert result.answered and result.recommended_batch_size is None
    soaks = result.recommendation.soaks
    assert soaks and all(s.outcome is Outcome.OUT_OF_MEMORY and s.steps_completed == 0 for s in soaks)
    note = result.recommendation.note
    assert not _grows(note) and not any(_grows(s) for s in result.suggestions), (note, result.suggestions)
    assert f"the soak of {soaks[0].batch_size} ran out of memory at its first step (no step completed, where batch " \
           f"{HOG_MAX} had fit 2 steps in trial" in note
    assert "each of 3 soaks ran out of memory at its first step" in note
    assert any("the runs differ, not the steps" in s for s in result.suggestions)


def test_a_crashed_soak_and_a_jump_after_flat_steps_are_not_explained_as_growth_either():
    """The same class: the explanation came from 'no soak survived', not from what the soaks showed. A soak that
    crashed twice (no verdict on memory at all) suggested 'memory grows'; one that ran out of memory at step 4
    after three steps at the same peak was 'ran out of memory after 3 of 6 steps', then 'memory grows from step
    to step whatever the batch'. Growth is said only where a soak's own peaks grew (the 40 MiB leak: it is)."""
    from isoprobe.executors.scripted import out_of_memory

    crashed_twice = probe(soaked_spec(), leaky(0, faults=_crash_soaks(2))).result
    assert crashed_twice.recommended_batch_size is None
    assert not any(_grows(s) for s in crashed_twice.suggestions), crashed_twice.suggestions
    assert any("without a verdict on memory" in s for s in crashed_twice.suggestions)

    flat = [HOG_FIXED + HOG_PER_SAMPLE * 12] * 3  # three steps at one peak, then out of memory at the fourth
    jumped = probe(soaked_spec(), _soaks_fail(lambda: out_of_memory(at_step=4, step_peaks=flat))).result
    note = jumped.recommendation.note
    assert "ran out of memory at step 4 of 6 after its peak held at" in note and "a jump at that step" in note
    assert not _grows(note) and not any(_grows(s) for s in jumped.suggestions), (note, jumped.suggestions)

    leak = probe(soaked_spec(), leaky(200 * MiB)).result  # memory that does grow: still said
    assert _grows(leak.recommendation.note) and any(_grows(s) for s in leak.suggestions)
