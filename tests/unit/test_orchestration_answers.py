"""What a probe answers, as orchestration: the edge, the recommendation, caps, start failures, reclassification,
throughput, the accumulation plan and the views of a result.

The scenarios of tests/integration/test_probe_cpu.py and test_answers.py whose
assertions are about isoprobe's own logic and arithmetic, with a scripted
executor standing in for the children: a device whose peak is a line over the
batch, like memory_hog's under the 1.5 GiB cap (batch 25 fits, 26 does not).
What only a real child shows (the memory it really measured, a real edge in
fresh processes, a real error's traceback, the schema of a real result) stays
in the integration files.
"""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import cli
from isoprobe.executors.scripted import ScriptedExecutor, crashed, error, fits, linear, out_of_memory, timed_out
from isoprobe.report.outcomes import Outcome
from isoprobe.report.output import result_json
from isoprobe.report.trial import Sizes
from scripted_probe import (
    HOG_FIXED,
    HOG_MAX,
    HOG_PER_SAMPLE,
    MODELS,
    GiB,
    KiB,
    MiB,
    fits_timed,
    hog_spec,
    probe,
    with_model,
)


def hog_device(faults=None) -> ScriptedExecutor:
    return ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE, faults=faults))


# --------------------------------------------------------------------------- the edge (test_probe_cpu.py)


@pytest.fixture(scope="module")
def edge():
    """test_probe_cpu's edge fixture (memory_hog, headroom 0.1, multiple_of 4), from 12: the search then
    never runs the recommended 20, so the recommendation check does."""
    spec = hog_spec(start_batch_size=12)
    spec["recommendation"] |= {"headroom": 0.1, "multiple_of": 4}
    return probe(spec, hog_device())


def test_the_edge_answers_with_exit_0(edge):
    result = edge.result
    assert edge.exit_code == 0
    assert result.answered is True
    assert result.stop_reason.value == "edge_found"
    assert result.device.backend == "cpu"
    assert result.device.memory_budget_bytes == int(1.5 * GiB)


def test_edge_is_adjacent_and_every_reported_batch_was_run(edge):
    result = edge.result
    maximum, failing = result.max_batch_size, result.first_failing_batch_size
    assert (maximum, failing) == (HOG_MAX, HOG_MAX + 1)  # the device's true edge
    assert result.first_failing_outcome is Outcome.OUT_OF_MEMORY
    outcomes = {(t.batch_size, t.outcome.value) for t in result.trials}
    assert (maximum, "fits") in outcomes
    assert (failing, "out_of_memory") in outcomes
    assert not any(t.outcome is Outcome.FITS and t.batch_size > maximum for t in result.trials)
    # Issue 35: each proof once. The maximum ran once, as the batch right below a failure, stepping until steady.
    (deciding,) = edge.at(maximum)
    assert deciding.purpose == "search" and deciding.steady_rule is not None
    recommended = result.recommended_batch_size
    assert recommended is not None and recommended <= maximum
    assert recommended % 4 == 0  # recommendation.multiple_of
    # soak_steps 0 (hog_spec): no trial runs for the recommendation (issue 34), and the result says so.
    assert not any(t.purpose == "recommendation_check" for t in result.trials) and not result.recommendation.soaked
    ran = [t for t in result.trials if t.batch_size == recommended]
    assert result.recommendation.measured_peak_bytes == (ran[0].budget_peak_bytes if ran else None)
    assert result.max_steady and not result.max_confirmed
    # It stays the headroom below the capacity, which is the predicted peak at the first failing batch.
    predicted = HOG_FIXED + HOG_PER_SAMPLE * recommended
    assert predicted <= result.recommendation.target_peak_bytes
    assert HOG_FIXED + HOG_PER_SAMPLE * (recommended + 4) > result.recommendation.target_peak_bytes
    fitting_peaks = [t.peak_bytes for t in result.trials if t.outcome is Outcome.FITS]
    assert all(p is not None and p > 0 for p in fitting_peaks)
    line = result.recommendation.memory_model
    assert line.per_sample_bytes == pytest.approx(HOG_PER_SAMPLE) and line.intercept_bytes == pytest.approx(HOG_FIXED)


def test_progress_is_one_line_per_trial(edge):
    trial_lines = [line for line in edge.lines if line.startswith("isoprobe: trial ")]
    assert len(trial_lines) == len(edge.trials)
    assert "batch" in trial_lines[0] and "peak" in trial_lines[0]


def test_the_maximum_alone_is_capped_and_the_maximum_plus_one_alone_does_not_start():
    at_max = probe(hog_spec(start_batch_size=HOG_MAX, max_batch_size=HOG_MAX), hog_device())
    assert at_max.exit_code == 0
    assert at_max.result.max_batch_size == HOG_MAX
    assert at_max.result.limited_by == "max_batch_size" and at_max.result.stop_reason.value == "capped"
    above = HOG_MAX + 1
    past_max = probe(hog_spec(start_batch_size=above, max_batch_size=above), hog_device())
    assert past_max.exit_code == 3
    assert past_max.result.stop_reason.value == "start_does_not_fit"
    assert [t.outcome.value for t in past_max.trials] == ["out_of_memory"]  # out of memory is never retried


def test_a_bug_in_the_model_is_an_error_with_exit_4_not_out_of_memory():
    bug = error("deliberate bug in the model's forward pass", "ValueError")
    probed = probe(with_model(hog_spec(), "broken"), ScriptedExecutor(lambda call: bug))
    result = probed.result
    assert probed.exit_code == 4
    assert result.stop_reason.value == "error"
    assert result.answered is False and result.max_batch_size is None
    [trial] = result.trials  # an error stops the search at once
    assert trial.outcome is Outcome.ERROR
    assert trial.error.type == "ValueError"
    assert "deliberate bug" in trial.error.traceback_tail
    assert result.suggestions == ["fix the error shown in trials[-1].error.traceback_tail, then run again"]


def test_start_batch_that_does_not_fit_exits_3_with_suggestions():
    probed = probe(hog_spec(start_batch_size=64), hog_device())
    result = probed.result
    assert probed.exit_code == 3
    assert result.stop_reason.value == "start_does_not_fit"
    assert result.first_failing_batch_size == 64
    assert [(t.batch_size, t.outcome.value) for t in result.trials] == [(64, "out_of_memory")]
    assert any("training.precision" in s for s in result.suggestions)
    assert any("training.gradient_checkpointing" in s for s in result.suggestions)
    assert any("checkpointing" in s for s in result.suggestions)
    assert any("start_batch_size" in s for s in result.suggestions)  # 64 > 2: a smaller start can help
    assert any("memory_budget" in s for s in result.suggestions)  # the CPU backend's cap can be raised


def test_dataset_size_caps_the_search_and_the_cap_is_tested():
    probed = probe(hog_spec(start_batch_size=2, dataset_size=3), hog_device())
    result = probed.result
    assert probed.exit_code == 0
    assert result.stop_reason.value == "capped" and result.limited_by == "dataset_size"
    assert result.max_batch_size == 3
    assert max(t.batch_size for t in result.trials) == 3
    # The cap itself decides the answer: it steps until steady, once.
    assert [(t.outcome.value, t.steady_rule is not None) for t in probed.at(3)] == [("fits", True)]


def test_max_batch_size_below_the_dataset_size_is_the_cap_that_limits():
    probed = probe(hog_spec(start_batch_size=2, dataset_size=10, max_batch_size=5), hog_device())
    assert probed.result.limited_by == "max_batch_size" and probed.result.max_batch_size == 5
    assert max(t.batch_size for t in probed.trials) == 5


# --------------------------------------------------------------------------- the strategies (test_fast_answers.py)

EXTRA = ("confirmation", "recommendation_check")


@pytest.fixture(scope="module")
def by_strategy():
    """The hog device probed from batch 2 with each search strategy."""
    return {s: probe(hog_spec(start_batch_size=2, strategy=s), hog_device()) for s in ("guided", "doubling")}


def test_both_strategies_find_the_same_exact_edge(by_strategy):
    for probed in by_strategy.values():
        assert probed.result.stop_reason.value == "edge_found"
        assert (probed.result.max_batch_size, probed.result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)


def test_the_guided_search_needs_fewer_trials_to_the_edge(by_strategy):
    # Whether it does on a real device depends on what the trials measure there; the search's own
    # tests (tests/unit/test_search_guided.py) hold it to the real readings seen on the CPU backend.
    guided, doubling = ([t.batch_size for t in by_strategy[s].trials if t.purpose not in EXTRA]
                        for s in ("guided", "doubling"))
    assert doubling[:4] == [2, 4, 8, 16]  # the classic doubles
    assert guided[1] > 4  # the guided search jumps from its first measurement
    assert len(guided) < len(doubling), (guided, doubling)


# --------------------------------------------------------------------------- ambiguous library errors


AMBIGUOUS = "could not create a primitive"


def _ambiguous_under_cap(threshold: int):
    """tests/support/models.py:ambiguous_under_cap: the oneDNN error while the data limit is below ``threshold``."""

    def script(call):
        limit = call.conditions.memory_limit
        if threshold == 0 or (limit is not None and limit < threshold):
            return error(AMBIGUOUS, "RuntimeError")
        return fits(GiB)

    return script


def _ambiguous_spec(threshold: int) -> dict:
    return with_model(hog_spec(start_batch_size=4, max_batch_size=4), "ambiguous_under_cap", threshold=threshold)


def test_ambiguous_library_error_caused_by_the_cap_is_reclassified_with_evidence():
    # Fails under the 1.5 GiB cap, runs under twice that: the evidence says 'memory'.
    probed = probe(_ambiguous_spec(2 * GiB), ScriptedExecutor(_ambiguous_under_cap(2 * GiB)))
    assert probed.exit_code == 3
    first, check = probed.trials
    assert first.outcome is Outcome.OUT_OF_MEMORY and "fit with" in first.reclassified
    assert "trial 2" in first.reclassified and AMBIGUOUS in first.reclassified
    assert first.error.message == AMBIGUOUS  # what the child said is kept next to the verdict
    assert check.purpose == "memory_check" and check.outcome is Outcome.FITS
    assert probed.result.max_batch_size is None  # a fit with more memory never counts
    # The check really ran with twice the budget: as the cap of its process and in its request.
    budget = int(1.5 * GiB)
    assert [(c.conditions.memory_limit, c.budget) for c in probed.executor.calls] == [
        (budget, budget), (2 * budget, 2 * budget)]
    assert any("reclassified as out_of_memory" in line for line in probed.lines)


def test_ambiguous_library_error_that_persists_stays_an_error():
    probed = probe(_ambiguous_spec(0), ScriptedExecutor(_ambiguous_under_cap(0)))
    assert probed.exit_code == 4
    first, check = probed.trials
    assert first.outcome is Outcome.ERROR and first.reclassified is None
    assert check.purpose == "memory_check" and check.outcome is Outcome.ERROR
    assert probed.result.stop_reason.value == "error"


@pytest.mark.parametrize("check_run", [out_of_memory(), crashed(), timed_out(), error("something else")],
                         ids=["out_of_memory", "crashed", "timed_out", "error"])
def test_an_ambiguous_error_stays_an_error_unless_the_memory_check_fits(check_run):
    def script(call):
        return check_run if call.request.memory_budget_bytes > int(1.5 * GiB) else error(AMBIGUOUS, "RuntimeError")

    probed = probe(_ambiguous_spec(2 * GiB), ScriptedExecutor(script))
    first, check = probed.trials
    assert check.purpose == "memory_check" and check.outcome is not Outcome.FITS
    assert first.outcome is Outcome.ERROR and first.reclassified is None
    assert probed.result.stop_reason.value == "error" and probed.exit_code == 4
    assert len(probed.trials) == 2  # one check, no retries


def test_an_ambiguous_error_at_the_edge_is_out_of_memory_and_its_check_never_counts_as_a_fit():
    # Past the true edge the device says 'could not create a primitive' instead of a plain allocation failure.
    def faults(call):
        peak = HOG_FIXED + HOG_PER_SAMPLE * call.batch_size
        if peak > call.conditions.memory_limit:
            return error(AMBIGUOUS, "RuntimeError")
        return None

    spec = hog_spec(start_batch_size=16)
    probed = probe(spec, hog_device(faults))
    result = probed.result
    assert (result.max_batch_size, result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)
    assert result.first_failing_outcome is Outcome.OUT_OF_MEMORY and probed.exit_code == 0
    checks = [t for t in result.trials if t.purpose == "memory_check"]
    assert checks and all(t.outcome is Outcome.FITS and t.batch_size > HOG_MAX for t in checks)
    # The checks' peaks (above the budget) are left out of the line, the recommendation and the breakdown.
    assert result.recommendation.memory_model.per_sample_bytes == pytest.approx(HOG_PER_SAMPLE)
    assert result.recommended_batch_size <= HOG_MAX
    assert result.throughput is not None
    assert all(p.batch_size <= HOG_MAX for p in result.throughput.points)


# --------------------------------------------------------------------------- throughput, plan, views (test_answers.py)

FEATURES = 2048
PARAMETERS = FEATURES * FEATURES + FEATURES  # big_linear: nn.Linear(features, features), weight + bias
SIZES = Sizes(parameter_bytes=PARAMETERS * 4, gradient_bytes=PARAMETERS * 4, optimizer_state_bytes=2 * PARAMETERS * 4)


def _step_seconds(batch: int) -> list[float]:
    """A warm-up step, then two timed ones whose median is 5 ms + 1 ms per sample: throughput saturates."""
    timed = 0.005 + 0.001 * batch
    return [1.0, timed * 0.95, timed * 1.05]


def _big_linear(call):
    peak = 1000 * MiB + 16 * KiB * call.batch_size
    return fits_timed(peak, _step_seconds(call.batch_size), base_bytes=1000 * MiB, sizes=SIZES)


def answers_spec() -> dict:
    return {
        "model": {"factory": f"{MODELS}:big_linear", "kwargs": {"features": FEATURES}},
        "input": {"shape": [FEATURES]},
        "target": {"shape": [FEATURES]},
        "optimizer": {"name": "adam"},
        "search": {"start_batch_size": 2, "max_batch_size": 64, "steps": 3, "confirmations": 0},
        "device": "cpu",
        "memory_budget": "1.5GiB",
        # soak_steps 0: the throughput objective is what is tested here (test_orchestration_soak.py soaks).
        "recommendation": {"objective": "throughput", "throughput_tolerance": 0.5, "soak_steps": 0},
        "plan": {"target_global_batch": 1000, "world_size": 4},
        "allocators": ["default", "expandable_segments:True"],
    }


@pytest.fixture(scope="module")
def probed():
    return probe(answers_spec(), ScriptedExecutor(_big_linear))


def test_every_fitting_trial_reports_its_throughput(probed):
    result = probed.result
    assert probed.exit_code == 0 and result.stop_reason.value == "capped" and result.max_batch_size == 64
    fitting = [t for t in result.trials if t.outcome is Outcome.FITS]
    assert fitting and all(t.samples_per_second > 0 for t in fitting)
    for t in fitting:  # batch / median of the timed steps (the first is warm-up)
        timed = statistics.median(t.step_seconds[1:])
        assert t.samples_per_second == pytest.approx(t.batch_size / timed, rel=1e-2)
        # (slowest - fastest) / median; a steady trial's timed steps have the faster as median
        median = 0.95 if t.steady_rule is not None else 1.0
        assert t.step_seconds_spread == pytest.approx(0.1 / median, abs=1e-3)
    curve = result.throughput
    assert {p.batch_size for p in curve.points} == {t.batch_size for t in fitting}
    assert curve.fastest_batch_size in {p.batch_size for p in curve.points}
    best = max(p.samples_per_second for p in curve.points)
    assert curve.best_samples_per_second == best
    within = [p.batch_size for p in curve.points if p.samples_per_second >= best * (1 - 0.5)]
    assert curve.fastest_batch_size == min(within)  # the smallest tested batch within the tolerance


def test_the_breakdown_is_what_the_largest_fit_measured_and_the_line(probed):
    breakdown = probed.result.memory_breakdown
    assert breakdown.parameter_bytes == PARAMETERS * 4
    assert breakdown.gradient_bytes == PARAMETERS * 4
    assert breakdown.optimizer_state_bytes == 2 * PARAMETERS * 4
    assert breakdown.from_batch_size == 64
    assert breakdown.activation_bytes_per_sample == pytest.approx(16 * KiB)
    assert breakdown.fixed_bytes == pytest.approx(1000 * MiB)


def test_the_plan_reaches_the_global_batch_within_the_recommendation(probed):
    result = probed.result
    plan = result.accumulation
    assert plan.world_size == 4 and plan.world_size_source == "spec"
    assert plan.micro_batch_size <= result.recommended_batch_size
    assert plan.global_batch_size == plan.micro_batch_size * plan.accumulation_steps * 4
    assert plan.difference == plan.global_batch_size - 1000


def test_objective_throughput_recommends_a_tested_batch_no_larger_than_the_headroom_one(probed):
    result = probed.result
    tested = {t.batch_size for t in result.trials if t.outcome is Outcome.FITS}
    assert result.recommended_batch_size in tested
    # The headroom allows 64 here, but a smaller tested batch runs within the tolerance of the best.
    assert result.recommended_batch_size == result.throughput.fastest_batch_size < 64
    assert "objective throughput" in result.recommendation.note
    fastest = [t for t in result.trials if t.batch_size == result.recommended_batch_size]
    assert result.recommendation.measured_peak_bytes == max(t.peak_bytes for t in fastest)


def test_objective_max_keeps_the_headroom_batch(probed):
    spec = answers_spec()
    spec["recommendation"] |= {"objective": "max", "throughput_tolerance": 0.5}
    result = probe(spec, ScriptedExecutor(_big_linear)).result
    assert result.recommended_batch_size == 64 != result.throughput.fastest_batch_size
    assert "objective throughput" not in result.recommendation.note


def test_allocator_candidates_on_the_cpu_backend_are_reported_as_not_applying(probed):
    comparison = probed.result.allocator_comparison
    assert comparison.applies is False and comparison.outcomes == []
    assert "CPU" in comparison.note
    assert all(t.allocator is None for t in probed.trials)  # searched once, with none of them
    assert all(c.conditions.allocator is None for c in probed.executor.calls)  # and no setting was passed on


def test_show_renders_the_same_result_as_a_table(probed, tmp_path):
    result = json.loads(result_json(probed.result))
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    shown = cli("show", str(saved))
    assert shown.returncode == 0, shown.stderr
    for text in ("answer:", "samples/s", "memory breakdown", "optimizer state", "accumulation:",
                 str(result["max_batch_size"])):
        assert text in shown.stdout
    as_json = cli("show", str(saved), "--format", "json")
    assert json.loads(as_json.stdout) == result


def test_run_format_table_prints_the_table_and_auto_prints_json_into_a_pipe(tmp_path, monkeypatch):
    # The real command in this process, its children scripted: isoprobe.pipeline.pipeline.local_executor is the seam.
    executors = []

    def scripted(spec):
        executors.append(ScriptedExecutor(_big_linear))
        return executors[-1]

    monkeypatch.setattr("isoprobe.pipeline.pipeline.local_executor", scripted)
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(answers_spec()))
    table = cli("run", str(path), "--format", "table", "--max-batch-size", "4")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("isoprobe ") and "memory breakdown" in table.stdout
    assert max(executors[-1].batches) == 4 and executors[-1].closed  # the override reached the search
    piped = cli("run", str(path), "--format", "auto", "--max-batch-size", "4")  # stdout is not a terminal here
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["max_batch_size"] == 4
    assert len(executors) == 2 and executors[-1].closed


# --------------------------------------------------------------------------- search.confirmations: 0 (issue 34)


def test_each_proof_runs_once_and_confirmations_ask_for_more():
    """Issue 35: 'each proof once'. The trial that decides the maximum (the batch right below the smallest failure)
    steps until steady, and its fit is the proof: by default (search.confirmations null: 0 for the batch search)
    nothing runs the maximum again, and the result says it is steady, not confirmed. confirmations: 1 runs it once
    more, until steady. steady_steps: 0 turns the steady rule off: every trial is short (issue 34's 'none')."""
    once = probe(hog_spec(start_batch_size=12), hog_device())
    result = once.result
    assert (result.max_batch_size, result.first_failing_batch_size) == (HOG_MAX, HOG_MAX + 1)
    assert "confirmation" not in {t.purpose for t in result.trials}, once.sequence()
    (deciding,) = once.at(HOG_MAX)
    assert deciding.steady_rule is not None and result.max_steady and not result.max_confirmed
    # Only trials that would be the maximum if they fit step until steady: right below the smallest failure above
    # them, or, before anything failed, the check right above the measured line's edge (26 here: it runs out).
    assert all(t.batch_size + 1 == min(fails) if fails else t.outcome is not Outcome.FITS
               for t in result.trials if t.steady_rule is not None
               for fails in [[u.batch_size for u in result.trials
                              if u.outcome is not Outcome.FITS and u.batch_size > t.batch_size]])
    confirmed = probe(hog_spec(start_batch_size=12, confirmations=1), hog_device())
    (again,) = [t for t in confirmed.at(HOG_MAX) if t.purpose == "confirmation"]
    assert again.steady_rule is not None and confirmed.result.max_confirmed and confirmed.result.max_steady
    short = probe(hog_spec(start_batch_size=12, confirmations=0, steady_steps=0), hog_device())
    assert all(call.request.steady is None for call in short.executor.calls)  # nothing stepped until steady
    assert len(short.at(HOG_MAX)) == 1 and not short.result.max_steady and not short.result.max_confirmed


def test_the_trial_that_decides_the_maximum_says_so_on_stderr():
    """Issue 35: the deciding trial is a search trial that steps until steady; its line says so, as the
    confirmation's did, and a recommendation with no trial of its own names no measured peak ('-' before)."""
    probed = probe(hog_spec(start_batch_size=12), hog_device())
    (line,) = [l for l in probed.lines if f"batch {HOG_MAX:>6}" in l and l.startswith("isoprobe: trial")]
    assert "[decides the maximum: " in line and "steps, peak" in line
    from isoprobe.report.output import summary_lines

    (recommended,) = [l for l in summary_lines(probed.result) if l.startswith("isoprobe: recommended")]
    assert probed.result.recommendation.measured_peak_bytes is None and "measured peak -" not in recommended
