"""What a finished child's run means: ``classify_exit`` over literal runs built from protocol events.

No process is started here. Every way a child can end (a verdict and a clean
exit, a verdict then a crash, no verdict, a signal, a timeout, the kernel's OOM
killer, a verdict cut short or malformed on the way) is one literal ``ChildRun``.
"""

from __future__ import annotations


import pytest

from isoprobe.executors import ChildRun
from isoprobe.report.outcomes import Outcome
from isoprobe.pipeline.classify import TrialEnd, classify_exit, last_phase
from isoprobe.protocol.messages import (
    EvalDone,
    Imported,
    MemoryReading,
    ModelBuilt,
    RequestReceived,
    Started,
    StepDone,
    TrialResult,
    Warm,
    event_line,
    parse_events,
    read_events,
)
from isoprobe.report.trial import ErrorInfo

from test_protocol import _REMOVED, tampered  # one way to forge a line, shared with the protocol tests

STARTED = Started(pid=1)
IMPORTED = Imported(memory=MemoryReading(peak_rss=1))
BUILT = ModelBuilt(memory=MemoryReading())


def step(n: int) -> StepDone:
    return StepDone(step=n, seconds=0.1)


def result(outcome: Outcome, phase: str = "done", **extra) -> TrialResult:
    return TrialResult(outcome=outcome, phase=phase, **extra)


def run(returncode: int = 0, events: list | None = None, timed_out: bool = False) -> ChildRun:
    return ChildRun(returncode=returncode, timed_out=timed_out, seconds=1.0, events=events or [])




# --------------------------------------------------------------------------- the child's verdict


def test_result_fits_and_clean_exit_is_fits():
    events = [STARTED, IMPORTED, BUILT, step(1), step(2), result(Outcome.FITS, phase="done", peak_bytes=123)]
    end = classify_exit(run(0, events))
    assert end.outcome is Outcome.FITS
    assert end.result == events[-1]
    assert end.result.peak_bytes == 123
    assert end.phase == "done"
    assert end.signal_name is None
    assert end.evidence is None


def test_result_fits_then_segfault_is_crashed():
    end = classify_exit(run(-11, [STARTED, step(1), result(Outcome.FITS, phase="done")]))
    assert end.outcome is Outcome.CRASHED
    assert end.signal_name == "SIGSEGV"
    assert end.result is not None and end.result.outcome is Outcome.FITS


def test_result_fits_then_nonzero_exit_is_crashed():
    end = classify_exit(run(1, [result(Outcome.FITS, phase="done")]))
    assert end.outcome is Outcome.CRASHED
    assert end.signal_name is None


def test_no_result_and_clean_exit_is_crashed():
    end = classify_exit(run(0, [STARTED, IMPORTED]))
    assert end.outcome is Outcome.CRASHED
    assert end.result is None
    assert end.signal_name is None
    assert end.phase == "imported"


def test_no_result_and_sigkill_is_crashed():
    end = classify_exit(run(-9, [STARTED, IMPORTED, BUILT, step(1)]))
    assert end == TrialEnd(Outcome.CRASHED, None, "step 1", "SIGKILL")


def test_no_events_at_all():
    end = classify_exit(run(-6, []))
    assert end == TrialEnd(Outcome.CRASHED, None, None, "SIGABRT")


def test_unknown_signal_number_still_named():
    end = classify_exit(run(-200, []))
    assert end.outcome is Outcome.CRASHED
    assert end.signal_name == "signal 200"


def test_timed_out_wins_over_everything():
    end = classify_exit(run(-9, [STARTED, step(1), result(Outcome.FITS, phase="done")], timed_out=True))
    assert end.outcome is Outcome.TIMED_OUT
    assert end.signal_name == "SIGKILL"
    no_result = classify_exit(run(-15, [STARTED, BUILT], timed_out=True))
    assert no_result.outcome is Outcome.TIMED_OUT
    assert no_result.phase == "model_built"


def test_result_out_of_memory_and_clean_exit_is_out_of_memory():
    error = ErrorInfo(type="torch.OutOfMemoryError", message="CUDA out of memory.")
    end = classify_exit(run(0, [STARTED, BUILT, result(Outcome.OUT_OF_MEMORY, phase="model_built", error=error)]))
    assert end.outcome is Outcome.OUT_OF_MEMORY
    assert end.result.error == error
    assert end.phase == "model_built"


def test_failure_verdict_stands_despite_unclean_exit():
    end = classify_exit(run(-11, [result(Outcome.OUT_OF_MEMORY, phase="step 1")]))
    assert end.outcome is Outcome.OUT_OF_MEMORY
    assert end.signal_name == "SIGSEGV"
    assert classify_exit(run(1, [result(Outcome.ERROR, phase="model_built")])).outcome is Outcome.ERROR


def test_the_last_result_counts():
    events = [result(Outcome.OUT_OF_MEMORY, phase="step 1"), result(Outcome.FITS, phase="done")]
    assert classify_exit(run(0, events)).outcome is Outcome.FITS


# --------------------------------------------------------------------------- a verdict that does not parse


@pytest.mark.parametrize("outcome", ["garbage", "", None, 7, "FITS", ["fits"], "crashed", "timed_out"])
def test_result_with_garbage_outcome_is_dropped_and_the_run_is_crashed(outcome):
    # A child may only claim fits, out_of_memory or error; anything else in its verdict line is not a verdict.
    data = event_line(STARTED) + tampered(result(Outcome.FITS), outcome=outcome)
    events = parse_events(data)
    assert events == [STARTED]
    assert not any(isinstance(e, TrialResult) for e in events)
    end = classify_exit(run(0, events))
    assert end.outcome is Outcome.CRASHED
    assert end.result is None
    assert end.phase == "started"


def test_result_without_outcome_is_dropped_and_the_run_is_crashed():
    events = parse_events(tampered(result(Outcome.FITS), outcome=_REMOVED))
    assert events == []
    assert classify_exit(run(0, events)).outcome is Outcome.CRASHED


def test_result_with_a_field_of_the_wrong_type_is_dropped_and_the_run_is_crashed():
    first_step = step(1)
    data = event_line(STARTED) + event_line(first_step) + tampered(result(Outcome.FITS), peak_bytes="a lot")
    events = parse_events(data)
    assert events == [STARTED, first_step]
    end = classify_exit(run(0, events))
    assert end.outcome is Outcome.CRASHED and end.result is None and end.phase == "step 1"


def test_truncated_result_reads_as_crashed(tmp_path):
    path = tmp_path / "e.jsonl"
    whole = event_line(result(Outcome.FITS, phase="done", peak_bytes=123))
    path.write_bytes(event_line(STARTED) + event_line(step(1)) + whole[: len(whole) // 2])
    end = classify_exit(ChildRun(returncode=-9, timed_out=False, seconds=2.0, events=read_events(path)))
    assert end.outcome is Outcome.CRASHED
    assert end.phase == "step 1"
    assert end.signal_name == "SIGKILL"


# --------------------------------------------------------------------------- the last phase


def test_phase_is_taken_from_the_last_step_event():
    end = classify_exit(run(-9, [STARTED, IMPORTED, BUILT, step(1), step(2), step(3)]))
    assert end.phase == "step 3"


def test_phase_ignores_events_that_are_not_phases():
    not_phases = [EvalDone(seconds=0.2), RequestReceived(path="/tmp/r.json"),
                  Warm(modules=["torch"], seconds=1.0, cuda_initialized=False, idle_priority=False)]
    end = classify_exit(run(-9, [STARTED, IMPORTED, BUILT, step(2), *not_phases]))
    assert end.phase == "step 2"
    assert last_phase([STARTED, *not_phases]) == "started"
    assert last_phase(not_phases) is None


def test_phase_of_a_verdict_is_the_verdicts_own():
    assert last_phase([STARTED, step(1), result(Outcome.OUT_OF_MEMORY, phase="step 2")]) == "step 2"


# --------------------------------------------------------------------------- the kernel's OOM killer


def test_sigkill_while_the_cgroup_counted_an_oom_kill_is_out_of_memory():
    end = classify_exit(ChildRun(returncode=-9, timed_out=False, seconds=1.0, events=[], oom_kills=1))
    assert end.outcome is Outcome.OUT_OF_MEMORY
    assert "oom_kill" in end.evidence


@pytest.mark.parametrize("oom_kills", [0, None])
def test_sigkill_without_kernel_evidence_stays_crashed(oom_kills):
    end = classify_exit(ChildRun(returncode=-9, timed_out=False, seconds=1.0, events=[], oom_kills=oom_kills))
    assert end.outcome is Outcome.CRASHED and end.evidence is None


# --------------------------------------------------------------------------- vetted against what was asked


def test_without_what_was_asked_the_childs_verdict_is_taken_as_written():
    # A test of one child passes no Asked; the probe always does (tests/unit/test_plausibility.py has the rules).
    from isoprobe.pipeline.plausibility import Asked

    said = [STARTED, result(Outcome.FITS, phase="done", peak_bytes=1000)]  # no model, no steps
    assert classify_exit(run(0, said)).outcome is Outcome.FITS
    vetted = classify_exit(run(0, said), Asked(steps=2, backend="cpu"))
    assert vetted.outcome is Outcome.CRASHED and vetted.result is None and vetted.phase == "started"
    assert "no model_built event came before the verdict" in vetted.evidence


def test_the_last_phase_can_leave_the_verdicts_claim_out():
    events = [STARTED, IMPORTED, BUILT, step(1), result(Outcome.FITS, phase="done")]
    assert last_phase(events) == "done"
    assert last_phase(events, verdicts=False) == "step 1"
