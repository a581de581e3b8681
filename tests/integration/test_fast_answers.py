"""Issue 4 end to end on the CPU backend: warm children, and the local executor's spare.

Real child processes, real training steps, a real memory cap. Nothing here
asserts a time: the benchmarks under benchmarks/ measure those. The guided search
and the budget's readings on a real probe are tests/integration/test_probe_cpu.py's
(one probe for both modules).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import hog_spec, run_cli
from isoprobe.executors import Conditions
from isoprobe.executors.local import LocalExecutor
from isoprobe.system.primitives import lift_idle_policy
from isoprobe.pipeline.classify import classify_exit
from isoprobe.protocol.messages import Started, TrialRequest, Warm, last_of, read_events
from isoprobe.spec.model import Spec


GiB = 1024**3


def test_warm_start_can_be_turned_off(write_spec):
    # That it is the default: every trial of test_probe_cpu.py's probe is warm (and forked).
    spec = hog_spec(start_batch_size=2, max_batch_size=4, confirmations=0, steady_steps=0, warm_start=False,
                    fork_server=False)
    cold = run_cli("run", str(write_spec(spec)))
    assert cold.returncode == 0, cold.stderr
    assert cold.json["trials"] and [t["warm_start"] for t in cold.json["trials"]] == [False] * len(cold.json["trials"])


# --------------------------------------------------------------------------- the local executor itself


def _request(batch: int) -> TrialRequest:
    return TrialRequest(spec=Spec.model_validate(hog_spec()), batch_size=batch, device="cpu",
                        memory_budget_bytes=int(1.5 * GiB), python_path=[])


def _conditions(memory_limit: int | None) -> Conditions:
    return Conditions(backend="cpu", allocator=None, memory_limit=memory_limit, preload=("torch", "torch._dynamo"))


def _executor(tmp_path) -> LocalExecutor:
    return LocalExecutor(tmp_path, warm=True)


def test_a_warm_child_imports_first_and_gets_its_request_later_without_cuda(tmp_path):
    with _executor(tmp_path) as executor:
        executor.prestart(_conditions(int(1.5 * GiB)))
        run = executor.run(_request(2), _conditions(int(1.5 * GiB)), timeout=120, name="t1")
    assert run.warm and classify_exit(run).outcome.value == "fits"
    kinds = [e.event for e in run.events]
    assert kinds.index("warm") < kinds.index("request") < kinds.index("model_built"), kinds
    warm = run.events[1]
    assert isinstance(warm, Warm), run.events
    assert warm.modules == ["torch", "torch._dynamo"]
    assert warm.cuda_initialized is False


def test_a_spare_that_died_while_waiting_is_replaced_by_a_cold_start(tmp_path):
    budget = int(1.5 * GiB)
    with _executor(tmp_path) as executor:
        first = executor.run(_request(2), _conditions(budget), timeout=120, name="t1")
        assert not first.warm  # nothing was prestarted
        spare = executor._spare
        assert spare is not None  # started while the first trial ran
        os.killpg(spare.process.pid, signal.SIGKILL)  # its keeper; the kernel then kills the child (PDEATHSIG)
        spare.process.wait()
        second = executor.run(_request(2), _conditions(budget), timeout=120, name="t2")
    assert not second.warm
    assert classify_exit(second).outcome.value == "fits"  # the dead spare is not this trial's crash


def test_a_request_under_another_cap_runs_cold_and_the_spare_waits_for_the_next(tmp_path):
    budget = int(1.5 * GiB)
    with _executor(tmp_path) as executor:
        executor.prestart(_conditions(budget))
        spare = executor._spare
        check = executor.run(_request(2), _conditions(2 * budget), timeout=120, name="check")
        assert not check.warm and executor._spare is spare
        after = executor.run(_request(2), _conditions(budget), timeout=120, name="t2")
    assert after.warm
    assert classify_exit(after).outcome.value == "fits"


def test_closing_the_executor_stops_the_spare(tmp_path):
    executor = _executor(tmp_path)
    executor.prestart(_conditions(None))
    pid = executor._spare.process.pid
    executor.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    # (and the autouse fixture finds no process left behind)


def _may_leave_idle_policy() -> bool:
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20 - os.getpriority(os.PRIO_PROCESS, 0)


def _policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(task)) for task in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not _may_leave_idle_policy(), reason="needs root or RLIMIT_NICE to leave SCHED_IDLE")
def test_a_spare_waits_for_its_request_at_normal_priority(tmp_path):
    # An idle-class spare that is stopped instead of used dies at idle priority: behind a busy
    # machine that took over 30 s, with isoprobe waiting to reap it (docs/measurements.md).
    with _executor(tmp_path) as executor:
        executor.prestart(_conditions(None))
        spare = executor._spare
        events = tmp_path / "child001.events.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and last_of(read_events(events), Warm) is None:
            time.sleep(0.05)
        warm = last_of(read_events(events), Warm)
        assert warm is not None, "the spare never reported its imports"
        assert warm.idle_priority is True  # it did import at idle priority...
        child = last_of(read_events(events), Started).pid  # (spare.process is its keeper, which never goes idle)
        assert child != spare.process.pid
        assert _policies(child) == {os.SCHED_OTHER}  # ...and waits at normal priority


@pytest.mark.skipif(not _may_leave_idle_policy(), reason="needs root or RLIMIT_NICE to leave SCHED_IDLE")
def test_the_executor_lifts_an_idle_child_to_normal_before_stopping_it():
    code = ("import os, threading, time; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)); "
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); print('idle', flush=True); "
            "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "idle\n"
        assert _policies(child.pid) == {os.SCHED_IDLE}  # both threads: a new thread inherits the policy
        lift_idle_policy(child.pid)
        assert _policies(child.pid) == {os.SCHED_OTHER}
    finally:
        child.kill()
        child.wait()
    lift_idle_policy(child.pid)  # a process that is gone: nothing to do, no error


def _autogroup_nice(pid: int | str) -> int | None:
    """The nice value of ``pid``'s autogroup; None where it is in none: the file reads empty for a process of the
    session the machine booted in (init's, in the root task group) or in a cpu cgroup of its own, as CI's runner is."""
    fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    return int(fields[-1]) if fields else None


@pytest.mark.skipif(not _may_leave_idle_policy() or not Path("/proc/self/autogroup").exists(),
                    reason="needs scheduler autogroups, and root or RLIMIT_NICE to leave SCHED_IDLE")
@pytest.mark.parametrize("own_session", [True, False], ids=["own-session", "shared-session"])
def test_an_idle_child_lowers_its_sessions_autogroup_only_when_the_session_is_its_own(own_session):
    """SCHED_IDLE orders threads within one autogroup, and each session is one: a spare (a keeper's setsid) or a Slurm
    rank (its wrapper's setsid) importing ahead lowers its session's autogroup to nice 19 too, and lifting the child
    gives the group its 0 back. A child in a session it shares (here the test's own) leaves the group alone."""
    code = ("import time; from isoprobe.child.main import _lower_priority; _lower_priority(); "
            "print((open('/proc/self/autogroup').read().split() or ['None'])[-1], flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             start_new_session=own_session)
    try:
        assert child.stdout.readline() == ("19\n" if own_session else f"{_autogroup_nice('self')}\n")
        assert _policies(child.pid) == {os.SCHED_IDLE}
        lift_idle_policy(child.pid)
        assert _policies(child.pid) == {os.SCHED_OTHER}
        assert _autogroup_nice(child.pid) == (0 if own_session else _autogroup_nice("self"))
    finally:
        child.kill()
        child.wait()
