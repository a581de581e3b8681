"""Nothing a probe starts outlives it, whatever the trial does; a trial's timeout means the same warm or cold.

Issue 14, classes 1, 2 and 7, with real processes:

- a model that starts processes outside its session (``start_new_session``, a
  double fork with ``setsid``), on a probe that ends normally, times out or is
  interrupted;
- isoprobe killed (SIGKILL, SIGHUP) while its trial holds the GIL, and while
  its trial is stopped: nothing a watchdog inside the trial could handle;
- a slow step under a tight ``trial_timeout``: a warm and a cold probe give the
  same answer, the timeout runs from the request's delivery, and a verdict
  written before the deadline is told apart from none.

Processes are found by a mark in their environment, which everything the probe
starts inherits (the keeper, the child, a ``sleep`` in a session of its own),
so a leftover is found even where it was re-parented away from pytest (the
autouse ``no_leftover_processes`` fixture sees only pytest's descendants).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import FAULTS, REPO, SUPPORT, fault_spec, marked_processes, run_cli, wait_for


MARK_ENV = "ISOPROBE_TEST_CONTAINMENT_MARK"
BUDGET = 2 * 1024**3


def _state(pid: int | str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def marked(mark: str) -> list[str]:
    """Every live (non-zombie) process whose environment carries ``mark``, as 'pid state command'."""
    return marked_processes(MARK_ENV, mark)


@pytest.fixture
def mark():
    """A mark for this test's processes; whatever still carries it at the end is killed (and the test fails)."""
    value = uuid.uuid4().hex
    yield value
    for line in marked(value):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def spec(fault: str, *, at: int, edge: int | None = None, start: int = 2, cap: int | None = None,
         timeout: float = 60, state_dir: Path | None = None, **search) -> dict:
    return fault_spec(fault, at=at, edge=edge, start=start, cap=cap, timeout=timeout,
                      state_dir=str(state_dir) if state_dir else None, headroom=None, **search)


#: How a trial's process starts (search.fork_server): the containment must hold for both.
STARTS = pytest.mark.parametrize("fork_server", [False, True], ids=["spawned", "forked"])


def _default_hangup() -> None:
    """SIGHUP's default action in isoprobe, as a shell gives it: a runner started under ``nohup`` ignores
    SIGHUP and its children inherit that, so a SIGHUP sent by a test would not end isoprobe (rightly: that is
    what ``nohup`` asks for) and the test would measure the runner, not the containment."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start_isoprobe(path: Path, mark: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "isoprobe", "run", str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, MARK_ENV: mark}, preexec_fn=_default_hangup)


def _described(trials: list[dict]) -> str:
    """What a trial that should not be there says about itself (how it ended, why, its stderr's end)."""
    keys = ("index", "batch_size", "purpose", "outcome", "phase", "exit_code", "signal", "reclassified", "seconds",
            "warm_start", "forked", "peak_bytes", "budget_peak_bytes", "stderr_tail")
    return "\n".join(repr({key: trial.get(key) for key in keys}) for trial in trials)


def committed(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob("committed-*"))


# --------------------------------------------------------------------------- class 1: leaving the session


@STARTS
@pytest.mark.parametrize("fault", ["escape_session", "escape_double_fork"])
def test_processes_that_leave_the_trials_session_die_with_it_and_the_answer_stands(write_spec, tmp_path, mark, fault,
                                                                                   fork_server):
    # Every trial's forward (and the environment check's) starts a `sleep 600` in a session of its own.
    path = write_spec(spec(fault, at=1, edge=3, cap=6, state_dir=tmp_path, fork_server=fork_server))
    run = run_cli("run", str(path), env={MARK_ENV: mark})
    left = marked(mark)  # at once: isoprobe has exited, so nothing of it may be alive now
    assert left == [], left
    assert run.returncode == 0, run.stderr
    result = run.json
    assert (result["max_batch_size"], result["first_failing_batch_size"]) == (3, 4)
    assert result["flaky_batch_sizes"] == []
    unexpected = [t for t in result["trials"] if t["outcome"] not in ("fits", "out_of_memory")]
    assert unexpected == [], _described(unexpected)
    fitting = [t for t in result["trials"] if t["outcome"] == "fits"]
    assert len(committed(tmp_path)) >= len(fitting) + 1  # each of them (and the environment check) escaped


@STARTS
def test_a_timed_out_trial_takes_its_escaped_processes_with_it(write_spec, tmp_path, mark, fork_server):
    path = write_spec(spec("escape_double_fork+hang", at=3, start=3, cap=3, timeout=8, retries=0,
                           state_dir=tmp_path, fork_server=fork_server))
    run = run_cli("run", str(path), env={MARK_ENV: mark})
    left = marked(mark)
    assert left == [], left
    assert run.returncode == 4, run.stderr
    [trial] = run.json["trials"]
    assert trial["outcome"] == "timed_out" and 8 <= trial["seconds"] < 8 + 5
    assert len(committed(tmp_path)) == 1


@STARTS
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_takes_the_escaped_processes_with_the_trial(write_spec, tmp_path, mark, signum, code,
                                                                 fork_server):
    # Batch 2 fits; every larger batch escapes, then hangs: the signal lands while an escaped sleep lives.
    process = start_isoprobe(write_spec(spec("escape_session+hang", at=3, state_dir=tmp_path, timeout=300,
                                             fork_server=fork_server)), mark)
    try:
        assert wait_for(lambda: committed(tmp_path), 120), "no trial reached its fault"
        assert wait_for(lambda: any(" sleep 600" in line for line in marked(mark)), 10)
        sent = time.monotonic()
        process.send_signal(signum)
        process.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        process.kill()
        process.wait()
    left = marked(mark)
    assert left == [], left
    assert process.returncode == code
    assert took < 3


# --------------------------------------------------------------------------- class 2: the parent dies


@STARTS
@pytest.mark.parametrize("fault", ["spin", "stop"])
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP])
def test_when_isoprobe_dies_nothing_of_a_trial_survives_even_one_holding_the_gil_or_stopped(
        write_spec, tmp_path, mark, fault, signum, fork_server):
    # spin: the forward backtracks in a regex for ever, holding the GIL (no Python thread of the trial runs);
    # stop: the trial SIGSTOPs itself (nothing of it runs). The first trial (batch 4) does it; the environment
    # check (batch 2) does not.
    process = start_isoprobe(write_spec(spec(fault, at=3, start=4, state_dir=tmp_path, timeout=300,
                                             fork_server=fork_server)), mark)
    try:
        [note] = wait_for(lambda: committed(tmp_path), 120) or [None]
        assert note is not None, "the trial never reached its fault"
        trial = int(note.name.split("-")[1])
        expected = "T" if fault == "stop" else "R"
        assert wait_for(lambda: _state(trial) == expected, 10), (_state(trial), marked(mark))
        os.kill(process.pid, signum)
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == -signum
    # The keepers see their lifelines close and kill their trees; they are then pytest's (a subreaper) to reap.
    left = wait_for(lambda: not marked(mark), 5) or marked(mark)
    assert left is True, left


# --------------------------------------------------------------------------- class 7: the same timeout warm or cold


def test_warm_cold_and_forked_probes_agree_when_a_step_is_slow(write_spec, mark):
    # Each fitting trial sleeps 4 s in its first forward, under a 7 s timeout; batches above 3 run out of memory.
    # The search starts at the edge and the recommendation is the maximum (no headroom): each probe runs 3, 4
    # and 3 again (two fitting trials of 4 s, each under the timeout only if it counts from delivery).
    answers = {}
    for start, search in {"warm": {"warm_start": True, "fork_server": False},
                          "cold": {"warm_start": False, "fork_server": False},
                          "forked": {"fork_server": True}}.items():
        path = write_spec(fault_spec("sleep:4", at=2, edge=3, start=3, cap=6, timeout=7, **search),
                          name=f"{start}.yaml")
        run = run_cli("run", str(path), env={MARK_ENV: mark})
        assert run.returncode == 0, run.stderr
        result = run.json
        trials = result["trials"]
        assert result["flaky_batch_sizes"] == [], trials
        assert {t["outcome"] for t in trials} <= {"fits", "out_of_memory"}, trials
        assert all(4 <= t["seconds"] < 7 for t in trials if t["outcome"] == "fits"), trials
        assert all(t["warm_start"] is (start != "cold") for t in trials)
        assert all(t["forked"] is (start == "forked") for t in trials)
        assert sum(t["outcome"] == "fits" for t in trials) >= 2, trials
        answers[start] = (result["max_batch_size"], result["first_failing_batch_size"])
    assert answers == {"warm": (3, 4), "cold": (3, 4), "forked": (3, 4)}
    assert marked(mark) == []


def _one_trial(fault: str, tmp_path: Path, *, timeout: float, batch: int = 2):
    from isoprobe.executors.local import run_once
    from isoprobe.pipeline.environment import trial_conditions
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    parsed = Spec.model_validate(spec(fault, at=2, timeout=timeout))
    request = TrialRequest(spec=parsed, batch_size=batch, device="cpu", memory_budget_bytes=BUDGET,
                           python_path=[str(SUPPORT)])
    conditions = trial_conditions(parsed, "cpu", BUDGET)
    began = time.monotonic()
    run = run_once(request, conditions, timeout=timeout, workdir=tmp_path)
    return run, conditions, time.monotonic() - began


def test_a_cold_trials_timeout_runs_from_delivery_after_the_same_imports_as_a_warm_one(tmp_path):
    from isoprobe.pipeline.classify import classify_exit
    from isoprobe.protocol.messages import Warm, last_of

    run, conditions, wall = _one_trial("sleep:4", tmp_path, timeout=7)
    assert not run.warm and not run.timed_out
    assert classify_exit(run).outcome.value == "fits", run.stderr_tail[-2000:]
    kinds = [e.event for e in run.events]
    assert kinds.index("warm") < kinds.index("request") < kinds.index("imported"), kinds
    warm = last_of(run.events, Warm)
    assert warm.modules == list(conditions.preload)  # what a spare imports ahead: torch, torch._dynamo
    assert warm.idle_priority is False  # started on demand: it imported at normal priority
    assert 4 <= run.seconds < 7
    assert wall >= run.seconds + warm.seconds  # the import was before the clock started


@pytest.mark.parametrize(("fault", "verdict"), [("hang_on_exit", True), ("hang", False)])
def test_a_verdict_written_before_the_deadline_is_told_apart_from_none(tmp_path, fault, verdict):
    from isoprobe.protocol.messages import TrialResult, last_of

    run, _, _ = _one_trial(fault, tmp_path, timeout=6)
    assert run.timed_out
    assert run.verdict_at_timeout is verdict
    result = last_of(run.events, TrialResult)
    assert (result.outcome.value if result else None) == ("fits" if verdict else None)
    # hang_on_exit: killed after the deadline plus the grace to exit; hang: at the deadline.
    assert 6 + (2 if verdict else 0) <= run.seconds < 6 + (2 if verdict else 0) + 3


def test_the_events_channel_is_out_of_the_models_reach(tmp_path):
    from isoprobe.pipeline.classify import classify_exit

    run, _, _ = _one_trial("channel_hidden", tmp_path, timeout=60)
    end = classify_exit(run)
    assert end.outcome.value == "fits", (end.result and end.result.error, run.stderr_tail[-2000:])


# --------------------------------------------------------------------------- the keeper by itself (no torch)


def _keep(script: str, *, close_after: float | None = None) -> int:
    """``sh -c script`` under a keeper, as the executor starts a child; its exit status as Popen reports it."""
    from isoprobe.system import keeper

    read, write = os.pipe()
    process = subprocess.Popen(keeper.command(read, ["/bin/sh", "-c", script]), pass_fds=(read,),
                               start_new_session=True)
    os.close(read)
    try:
        if close_after is not None:
            time.sleep(close_after)
            os.close(write)
            write = -1
        return process.wait(timeout=30)
    finally:
        if write >= 0:
            os.close(write)
        process.kill()
        process.wait()


@pytest.mark.parametrize(("script", "status"), [("exit 3", 3), ("exit 0", 0), ("kill -SEGV $$", -signal.SIGSEGV),
                                                ("kill -KILL $$", -signal.SIGKILL)])
def test_the_keeper_ends_as_its_child_did(script, status):
    assert _keep(script) == status


def test_the_keeper_kills_every_descendant_in_any_session_and_on_a_closed_lifeline(mark):
    marker = f"{MARK_ENV}={mark}"
    escaped = f"export {marker}; setsid sleep 600 & (setsid sh -c 'sleep 601 &'); "
    assert _keep(escaped + "exit 5") == 5  # the child ends on its own: the escaped ones go with it
    assert marked(mark) == []
    assert _keep(escaped + "kill -STOP $$", close_after=0.5) == -signal.SIGKILL  # stopped, then the lifeline closes
    assert marked(mark) == []
