"""A 'fits' must hold up against what the trial was asked: ``pipeline.plausibility`` over literal runs.

No process is started. Each run is a literal list of the protocol events a
child writes (or a model forges, tests/support/hostile.py:forger), judged by
``classify_exit`` with the trial's ``Asked``: a verdict that cannot be true is
crashed, one above its budget is out of memory, each with the reason in the
evidence, and the probe's answer never rests on either.
"""

from __future__ import annotations

import pytest

from isoprobe.executors import ChildRun
from isoprobe.executors.scripted import ScriptedExecutor, fits, linear
from isoprobe.report.outcomes import Outcome
from isoprobe.pipeline.classify import classify_exit
from isoprobe.pipeline.plausibility import Asked, implausible, over_budget
from isoprobe.pipeline.trial_record import trial_from_run
from isoprobe.protocol.messages import EvalDone, Imported, MemoryReading, ModelBuilt, Started, StepDone, TrialResult
from isoprobe.report.trial import ErrorInfo
from scripted_probe import GiB, MiB, faulty_spec, probe

#: What the environment check read after importing torch (measured here: data 784 MiB, resident 654 MiB).
IMPORTED_MEMORY = MemoryReading(data=784 * MiB, rss=654 * MiB, peak_rss=654 * MiB)
CPU = Asked(steps=2, backend="cpu", budget_bytes=2 * GiB, import_memory=IMPORTED_MEMORY)
CUDA = Asked(steps=2, backend="cuda", budget_bytes=None)
TIMES = [0.31, 0.12]


def verdict(outcome: Outcome = Outcome.FITS, *, phase: str = "done", step_seconds=TIMES, peak=1200 * MiB,
            budget_peak=1300 * MiB, **extra) -> TrialResult:
    return TrialResult(outcome=outcome, phase=phase, step_seconds=list(step_seconds), peak_bytes=peak,
                       budget_peak_bytes=budget_peak, base_bytes=900 * MiB, **extra)


def steps(times=TIMES, numbers=None) -> list[StepDone]:
    numbers = numbers or range(1, len(times) + 1)
    return [StepDone(step=n, seconds=s) for n, s in zip(numbers, times)]


def genuine(**fields) -> list:
    """What a real child writes for a trial that fit: started, imported, model_built, each step, the verdict."""
    return [Started(pid=7), Imported(memory=IMPORTED_MEMORY), ModelBuilt(memory=IMPORTED_MEMORY), *steps(),
            verdict(**fields)]


def judged(events: list, asked: Asked | None = CPU, returncode: int = 0):
    return classify_exit(ChildRun(returncode=returncode, timed_out=False, seconds=1.0, events=events), asked)


def test_a_genuine_fit_stands():
    end = judged(genuine())
    assert end.outcome is Outcome.FITS and end.evidence is None
    assert implausible(genuine(), CPU) is None and over_budget(genuine()[-1], CPU) is None


# --------------------------------------------------------------------------- forged verdicts


def test_a_forged_verdict_alone_is_crashed_with_every_reason():
    # tests/support/hostile.py:forger(well_formed=False): its first forward pass appends a 'fits' line and exits 0.
    events = [Started(pid=7), Imported(memory=IMPORTED_MEMORY), ModelBuilt(memory=IMPORTED_MEMORY),
              verdict(step_seconds=[0.01, 0.01], peak=1000, budget_peak=1000)]
    end = judged(events)
    assert end.outcome is Outcome.CRASHED
    assert end.result is None  # rejected: its numbers are not reported as measurements
    assert end.phase == "model_built"  # the last phase the events show, not the verdict's 'done'
    assert "2 training steps were asked for, the step events show none" in end.evidence
    assert "budget peak 1000 B is below the 784.00 MiB (822083584 B) data segment" in end.evidence
    assert "resident peak 1000 B is below half the 654.00 MiB (685768704 B) resident" in end.evidence


def test_a_well_formed_forgery_with_impossible_memory_is_crashed():
    # tests/support/hostile.py:forger(well_formed=True): step events and matching step times, then a peak of 1000 B.
    forged_times = [0.01, 0.01]
    events = [Started(pid=7), Imported(memory=IMPORTED_MEMORY), ModelBuilt(memory=IMPORTED_MEMORY),
              *steps(forged_times), verdict(step_seconds=forged_times, peak=1000, budget_peak=1000)]
    end = judged(events)
    assert end.outcome is Outcome.CRASHED
    assert "steps" not in end.evidence  # the steps were forged well: only the memory gives it away
    assert "below the 784.00 MiB (822083584 B) data segment that importing torch alone takes" in end.evidence
    assert end.phase == "step 2"


@pytest.mark.parametrize(
    ("numbers", "shown"),
    [([1], "[1]"), ([1, 2, 3], "[1, 2, 3]"), ([2, 1], "[2, 1]"), ([1, 1], "[1, 1]"), ([], "none")],
)
def test_not_exactly_the_asked_steps_is_crashed(numbers, shown):
    events = [Started(pid=7), ModelBuilt(memory=IMPORTED_MEMORY), *steps([0.1] * len(numbers), numbers),
              verdict(step_seconds=[0.1] * len(numbers))]
    end = judged(events)
    assert end.outcome is Outcome.CRASHED
    assert f"2 training steps were asked for, the step events show {shown}" in end.evidence


def test_step_times_that_are_not_the_steps_are_crashed():
    end = judged([Started(pid=7), ModelBuilt(memory=IMPORTED_MEMORY), *steps(), verdict(step_seconds=[0.31, 0.5])])
    assert end.outcome is Outcome.CRASHED
    assert "step_seconds [0.31, 0.5] are not the times of the step events" in end.evidence


def test_no_model_built_before_the_verdict_is_crashed():
    without = [Started(pid=7), Imported(memory=IMPORTED_MEMORY), *steps(), verdict()]
    after = [Started(pid=7), *steps(), verdict(), ModelBuilt(memory=IMPORTED_MEMORY)]
    for events in (without, after):
        end = judged(events)
        assert end.outcome is Outcome.CRASHED and "no model_built event came before the verdict" in end.evidence


@pytest.mark.parametrize("first", [Outcome.OUT_OF_MEMORY, Outcome.FITS])
def test_a_second_verdict_is_crashed(first):
    # A thread of the model's that appends 'fits' after the child's own verdict (an out of memory, say).
    error = ErrorInfo(type="RuntimeError", message="DefaultCPUAllocator: can't allocate memory")
    events = [*genuine()[:-1], verdict(first, error=error if first is Outcome.OUT_OF_MEMORY else None), verdict()]
    end = judged(events)
    assert end.outcome is Outcome.CRASHED and "2 verdicts were written; a child writes exactly one" in end.evidence


def test_fits_before_the_end_of_the_steps_is_crashed():
    end = judged(genuine(phase="step 1"))
    assert end.outcome is Outcome.CRASHED and "'fits' in phase 'step 1'" in end.evidence


def test_an_asked_evaluation_pass_must_have_run():
    asked = Asked(steps=2, backend="cpu", budget_bytes=2 * GiB, eval_pass=True, import_memory=IMPORTED_MEMORY)
    assert "evaluation pass" in judged(genuine(), asked).evidence
    evaluated = [*genuine()[:-1], EvalDone(seconds=0.2), verdict(eval_seconds=0.2)]
    assert judged(evaluated, asked).outcome is Outcome.FITS


def test_a_cpu_fit_without_its_peaks_is_crashed():
    for missing in ({"peak": None}, {"budget_peak": None}):
        end = judged(genuine(**missing))
        assert end.outcome is Outcome.CRASHED and "no peak memory was reported" in end.evidence


def test_each_peak_is_compared_with_the_baseline_in_its_own_units():
    # Resident 700 MiB is below the 784 MiB *data* baseline, but above the 654 MiB *resident* one: it stands.
    assert judged(genuine(peak=700 * MiB)).outcome is Outcome.FITS
    # Resident memory can shrink under memory pressure (clean code pages dropped): the floor is half of it.
    assert judged(genuine(peak=600 * MiB)).outcome is Outcome.FITS
    assert judged(genuine(peak=327 * MiB)).outcome is Outcome.FITS
    end = judged(genuine(peak=326 * MiB))
    assert end.outcome is Outcome.CRASHED and "below half the 654.00 MiB" in end.evidence
    # The data segment's peak against the data baseline: 700 MiB is below what importing took.
    end = judged(genuine(budget_peak=700 * MiB))
    assert end.outcome is Outcome.CRASHED and "budget peak 700.00 MiB" in end.evidence


def test_without_an_import_baseline_only_the_events_are_checked():
    asked = Asked(steps=2, backend="cpu", budget_bytes=2 * GiB, import_memory=None)
    assert judged(genuine(peak=1000, budget_peak=1000), asked).outcome is Outcome.FITS
    assert judged(genuine(peak=1000, budget_peak=1000), Asked(2, "cpu", 2 * GiB, False, MemoryReading()),
                  ).outcome is Outcome.FITS


def test_cuda_peaks_are_not_compared_with_host_memory():
    # On CUDA the peak is the caching allocator's: a small model reserves far less than importing torch takes.
    small = genuine(peak=20 * MiB, budget_peak=20 * MiB, peak_allocated_bytes=18 * MiB)
    assert judged(small, CUDA).outcome is Outcome.FITS
    impossible = genuine(peak=20 * MiB, budget_peak=20 * MiB, peak_allocated_bytes=30 * MiB)
    end = judged(impossible, CUDA)
    assert end.outcome is Outcome.CRASHED and "above the reserved peak" in end.evidence
    assert "no peak memory was reported" in judged(genuine(peak=None), CUDA).evidence


def test_failure_verdicts_and_unasked_runs_are_not_vetted():
    error = ErrorInfo(type="RuntimeError", message="DefaultCPUAllocator: can't allocate memory")
    oom = [Started(pid=7), verdict(Outcome.OUT_OF_MEMORY, phase="step 1", step_seconds=[], peak=None, error=error)]
    assert judged(oom).outcome is Outcome.OUT_OF_MEMORY  # a failure can only lower the answer
    forged = [Started(pid=7), verdict(step_seconds=[0.01], peak=1000, budget_peak=1000)]
    assert judged(forged, asked=None).outcome is Outcome.FITS  # a test of one child, without a probe's asking
    assert judged(forged, returncode=-11).outcome is Outcome.CRASHED  # (and a crash is a crash before any vetting)


# --------------------------------------------------------------------------- over the budget (shared memory)


def test_a_budget_peak_above_the_budget_is_out_of_memory_with_the_numbers():
    # tests/support/hostile.py:memory_hog(shared=True): its MAP_SHARED memory is not in RLIMIT_DATA, but it is
    # in the budget's peak (the data segment, at most the cap, plus the shared mappings).
    end = judged(genuine(budget_peak=2 * GiB + 48 * MiB, peak=1900 * MiB))
    assert end.outcome is Outcome.OUT_OF_MEMORY
    assert end.result is not None and end.result.budget_peak_bytes == 2 * GiB + 48 * MiB  # the evidence is kept
    assert "data segment plus shared mappings peaked at 2.05 GiB (2197815296 B)" in end.evidence
    assert "above the 2.00 GiB (2147483648 B) budget" in end.evidence
    assert "resident" not in end.evidence


def test_a_resident_peak_above_the_budget_is_out_of_memory():
    # Shared memory unmapped before the end is not in the budget's peak, but its pages were resident.
    end = judged(genuine(peak=2 * GiB + 1, budget_peak=2 * GiB))
    assert end.outcome is Outcome.OUT_OF_MEMORY
    assert "its resident peak without the mapped files (shared memory included) was 2.00 GiB (2147483649 B)" \
        in end.evidence


def test_the_mapped_files_resident_pages_do_not_count_against_the_budget():
    # Measured: a fresh install's real 'fits' at 1.611 GB resident under a 1.5 GiB budget, its data segment
    # well under it; how much library code is resident depends on the page cache, not on the trial.
    end = judged(genuine(peak=2 * GiB + 60 * MiB, budget_peak=2 * GiB - 40 * MiB, file_resident_bytes=300 * MiB))
    assert end.outcome is Outcome.FITS
    # Shared memory is anonymous (RssShmem), not a mapped file: the same peak with little file residency is over.
    end = judged(genuine(peak=2 * GiB + 60 * MiB, budget_peak=2 * GiB - 40 * MiB, file_resident_bytes=20 * MiB))
    assert end.outcome is Outcome.OUT_OF_MEMORY
    assert "without the mapped files" in end.evidence


def test_exactly_the_budget_fits_and_a_larger_budget_is_judged_by_its_own():
    assert judged(genuine(peak=2 * GiB, budget_peak=2 * GiB)).outcome is Outcome.FITS
    larger = Asked(steps=2, backend="cpu", budget_bytes=4 * GiB, import_memory=IMPORTED_MEMORY)  # a memory check
    assert judged(genuine(peak=3 * GiB, budget_peak=3 * GiB), larger).outcome is Outcome.FITS
    unbounded = Asked(steps=2, backend="cpu", budget_bytes=None, import_memory=IMPORTED_MEMORY)
    assert judged(genuine(peak=3 * GiB, budget_peak=3 * GiB), unbounded).outcome is Outcome.FITS


def test_on_cuda_a_reading_past_the_budget_context_included_is_out_of_memory():
    # issue 45: the fraction caps the allocator alone; memory outside it that loads after the warm-up (lazily loaded
    # kernels, NCCL's buffers) can put the process past the budget with no allocation failing.
    asked = Asked(steps=2, backend="cuda", budget_bytes=GiB)
    over = judged(genuine(peak=GiB - 300 * 1024**2, budget_peak=GiB + 1), asked)
    assert over.outcome is Outcome.OUT_OF_MEMORY and "above the 1.00 GiB" in over.evidence
    assert judged(genuine(peak=GiB - 300 * 1024**2, budget_peak=GiB), asked).outcome is Outcome.FITS


# --------------------------------------------------------------------------- as the result's trial, and in a probe


def test_the_trial_of_a_rejected_verdict_reports_no_forged_numbers():
    events = [Started(pid=7), ModelBuilt(memory=IMPORTED_MEMORY), verdict(step_seconds=[], peak=1000,
                                                                           budget_peak=1000)]
    run = ChildRun(returncode=0, timed_out=False, seconds=1.0, events=events, stderr_tail="model output\n")
    trial = trial_from_run(run, 3, 16, "search", CPU)
    assert trial.outcome is Outcome.CRASHED
    assert trial.peak_bytes is None and trial.budget_peak_bytes is None and trial.step_seconds == []
    assert trial.samples_per_second is None and trial.sizes is None
    assert trial.reclassified.startswith("implausible 'fits' (not counted): ")
    assert trial.phase == "model_built" and trial.stderr_tail == "model output\n"


def test_the_trial_over_its_budget_keeps_its_peaks_as_evidence():
    run = ChildRun(returncode=0, timed_out=False, seconds=1.0, events=genuine(budget_peak=3 * GiB))
    trial = trial_from_run(run, 1, 16, "search", CPU)
    assert trial.outcome is Outcome.OUT_OF_MEMORY and trial.budget_peak_bytes == 3 * GiB
    assert trial.samples_per_second is None and "above the 2.00 GiB" in trial.reclassified


def _forged_from(batch: int):
    """A device that fits everything, whose model forges a verdict (peak 1000 B) from ``batch`` on."""

    def script(call):
        if call.batch_size >= batch:
            return ChildRun(returncode=0, timed_out=False, seconds=0.1,
                            events=[Started(pid=9), ModelBuilt(memory=IMPORTED_MEMORY),
                                    verdict(step_seconds=[0.01, 0.01], peak=1000, budget_peak=1000)])
        return fits(GiB)

    return script


def test_a_probe_never_answers_with_a_forged_fit():
    probed = probe(faulty_spec(start=7, cap=8), ScriptedExecutor(_forged_from(8)))
    result = probed.result
    assert [t.outcome.value for t in probed.at(8)] == ["crashed", "crashed"]  # the forgery, then its retry
    assert all(t.reclassified and "implausible" in t.reclassified for t in probed.at(8))
    assert result.max_batch_size == 7 and result.first_failing_batch_size == 8
    assert result.first_failing_outcome is Outcome.CRASHED


def test_a_probe_over_shared_memory_answers_the_private_edge():
    # A device like tests/support/hostile.py:memory_hog(shared=True): no allocation ever fails (the cap does not see
    # the shared part), but each trial's budget peak shows it. The answer is the edge private memory has.
    private = linear(GiB, 64 * MiB)
    budget = int(1.5 * GiB)

    def shared(call):
        peak = GiB + 64 * MiB * call.batch_size
        return fits(peak)  # the child reports its real (budget-unit) peak, over the budget or not

    spec = faulty_spec(start=2, cap=None, confirmations=0, retries=0)
    spec["memory_budget"] = "1.5GiB"
    spec["search"]["edge_spread"] = 0  # batch 8 peaks exactly at the cap: the raw edge is what is compared here
    expected = probe(spec, ScriptedExecutor(private)).result
    result = probe(spec, ScriptedExecutor(shared)).result
    assert expected.max_batch_size == (budget - GiB) // (64 * MiB) == 8
    assert result.max_batch_size == expected.max_batch_size and result.first_failing_batch_size == 9
    over = [t for t in result.trials if t.outcome is Outcome.OUT_OF_MEMORY]
    assert over and all("above the 1.50 GiB" in t.reclassified for t in over)


def test_a_reading_a_little_under_the_import_baseline_is_noise_and_far_under_it_is_impossible():
    """A tiny model's trial peaks within a few hundred KiB of what importing torch took, and the VmPeak estimate can
    read under it by as much (plausibility.IMPORT_SLACK_BYTES); a MiB and more below is no reading at all."""
    from isoprobe.pipeline.plausibility import IMPORT_SLACK_BYTES

    times = [0.01, 0.01]
    for below, rejected in ((40 << 10, False), (IMPORT_SLACK_BYTES + 4096, True)):
        peak = IMPORTED_MEMORY.data - below
        events = [Started(pid=7), Imported(memory=IMPORTED_MEMORY), ModelBuilt(memory=IMPORTED_MEMORY),
                  *steps(times), verdict(step_seconds=times, peak=IMPORTED_MEMORY.rss, budget_peak=peak)]
        end = judged(events)
        assert (end.outcome is Outcome.CRASHED) is rejected, end.evidence
