"""Faults a real trial process commits, and what the parent sees of them: only what a real child can show.

Every scenario runs tests/support/faults.py:faulty, which fits below ``at`` and
misbehaves at or above it. What isoprobe *makes* of each fault (retries,
confirmations, flaky batches, the answer moving down, the stop reason and the
exit code) is orchestration, tested with a scripted executor in
tests/unit/test_orchestration_faults.py for every scenario that was here.
What stays here needs a process: a real segfault, abort, SIGKILL, silent exit
or half-written verdict is classified as crashed, with the signal and
faulthandler's evidence; a real hang is killed at the timeout; a hanging
grandchild holding the pipes dies with its group; junk output and stray
grandchildren do not change a fit; a real exception's traceback reaches the
result.

Most scenarios spend one child through the local executor directly
(``executors.local.run_once``, then the probe's own ``trial_from_run``): no
inspect child, no CLI, no retry. The hang keeps the whole CLI path, so
``search.trial_timeout`` is shown to be what kills it. The autouse
``no_leftover_processes`` fixture (conftest.py) fails any scenario that leaves
a process alive.
"""

from __future__ import annotations

import pytest

from conftest import FAULTS, SUPPORT, fault_spec, run_cli


BUDGET = 2 * 1024**3


def one_trial(fault: str, tmp_path, *, batch: int = 8, timeout: float = 60):
    """One real trial of ``fault`` at ``batch`` in a fresh child, as the probe runs it; its ChildRun and Trial."""
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.environment import trial_conditions
    from isoprobe.pipeline.trial_record import trial_from_run
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    spec = Spec.model_validate(fault_spec(fault, start=batch, cap=batch, timeout=timeout))
    request = TrialRequest(spec=spec, batch_size=batch, device="cpu", memory_budget_bytes=BUDGET,
                           python_path=[str(SUPPORT)])
    run = run_once(request, trial_conditions(spec, "cpu", BUDGET), timeout=timeout, workdir=tmp_path)
    return run, trial_from_run(run, 1, batch, "search")


@pytest.mark.parametrize(
    ("fault", "signal", "evidence"),
    [
        ("segfault", "SIGSEGV", "Segmentation fault"),  # faulthandler's stack, kept as evidence
        ("abort", "SIGABRT", "Aborted"),
        ("sigkill", "SIGKILL", None),
        ("half_result", "SIGKILL", None),  # half a 'fits' verdict line, then SIGKILL: no verdict at all
        ("exit0", None, None),  # exit status 0 without a verdict
    ],
)
def test_a_real_crash_is_crashed_with_its_signal_and_evidence_never_out_of_memory(tmp_path, fault, signal, evidence):
    run, trial = one_trial(fault, tmp_path)
    assert (trial.outcome.value, trial.signal) == ("crashed", signal), run.stderr_tail[-2000:]
    assert trial.error is None and trial.reclassified is None
    assert trial.phase is not None  # how far it got (it started, at least)
    if evidence:
        assert evidence in trial.stderr_tail
    if fault == "exit0":
        assert trial.exit_code == 0


def test_a_hang_is_killed_at_the_timeout(write_spec):
    # 6 s (12 until 2026-11-26): the clock starts once the child has its request, its imports done, so a short
    # timeout kills nothing that was still starting; what is checked is that it, not the hang, ends the trial.
    run = run_cli("run", str(write_spec(fault_spec("hang", start=8, timeout=6, retries=0))))
    assert run.returncode == 4, run.stderr
    result = run.json
    assert result["stop_reason"] == "timed_out"
    [trial] = result["trials"]
    assert trial["outcome"] == "timed_out" and 6 <= trial["seconds"] < 6 + 5


def test_a_hanging_grandchild_holding_the_pipes_times_out_and_dies_with_its_group(tmp_path):
    # The child hangs and so does the grandchild it left holding stdout and stderr: the timeout ends both
    # (no_leftover_processes checks the grandchild), and the parent does not wait on the pipes they hold.
    run, trial = one_trial("grandchild_hang", tmp_path, timeout=6)
    assert trial.outcome.value == "timed_out" and run.timed_out
    assert 6 <= trial.seconds < 6 + 5


def test_a_real_exception_is_an_error_with_its_traceback_tail(tmp_path):
    run, trial = one_trial("raise", tmp_path)
    assert trial.outcome.value == "error", run.stderr_tail[-2000:]
    assert trial.error.type == "KeyError"
    assert "deliberate non-memory bug" in trial.error.traceback_tail
    assert trial.signal is None


@pytest.mark.parametrize("fault", ["garbage", "grandchild"])
def test_noise_and_stray_grandchildren_do_not_change_a_fit(tmp_path, capfd, fault):
    run, trial = one_trial(fault, tmp_path)
    assert trial.outcome.value == "fits", run.stderr_tail[-2000:]
    assert trial.peak_bytes and len(trial.step_seconds) == 2
    # The junk (and the fake verdict among it) went to the child's own files, never to the parent's
    # stdout, where isoprobe prints its one JSON document.
    out, err = capfd.readouterr()
    assert out == "" and err == ""
