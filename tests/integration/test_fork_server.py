"""The fork server (search.fork_server, issue 18): every trial a fresh fork of one process that imported once.

Real children on the CPU backend. The containment tests (test_containment.py)
run both ways, spawned and forked; here, what only the fork server has: its
trials are fresh processes, it never creates a CUDA context, a forked trial
measures what a spawned one does, and a server that dies takes its trials
with it, and the probe runs that trial again (its loss is isoprobe's, never the trial's).
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from conftest import SUPPORT, fault_spec, faulty_spec, hog_spec, run_cli, wait_for
from isoprobe.executors.local import LocalExecutor
from isoprobe.pipeline.classify import classify_exit
from isoprobe.pipeline.environment import trial_conditions
from isoprobe.protocol.messages import Started, TrialRequest, TrialResult, Warm, last_of, read_events
from isoprobe.spec.model import Spec


BUDGET = int(1.5 * 1024**3)


def _request(spec: Spec, batch: int) -> TrialRequest:
    return TrialRequest(spec=spec, batch_size=batch, device="cpu", memory_budget_bytes=BUDGET,
                        python_path=[str(SUPPORT)])


def _server_events(workdir: Path) -> list:
    """The fork server's events: the one events file whose ``warm`` was not written by a fork (empty: none yet)."""
    servers = [events for events in map(read_events, workdir.glob("child*.events.jsonl"))
               if any(isinstance(e, Warm) and not e.forked for e in events)]
    assert len(servers) <= 1, servers
    return servers[0] if servers else []


def test_each_trial_is_a_fresh_fork_of_a_server_that_never_created_a_cuda_context(tmp_path):
    spec = Spec.model_validate(hog_spec())
    conditions = trial_conditions(spec, "cpu", BUDGET)
    with LocalExecutor(tmp_path, fork=("cpu",)) as executor:
        runs = [executor.run(_request(spec, 2), conditions, timeout=120, name=f"t{i}") for i in range(2)]
        server = _server_events(tmp_path)
    assert [classify_exit(run).outcome.value for run in runs] == ["fits", "fits"]
    assert all(run.forked and run.warm for run in runs)
    server_pid = last_of(server, Started).pid
    pids = [last_of(run.events, Started).pid for run in runs]
    assert len({server_pid, *pids}) == 3  # a new process each time, and not the server
    assert last_of(server, Warm).cuda_initialized is False
    assert "torch" in last_of(server, Warm).modules
    for run in runs:
        warm = last_of(run.events, Warm)
        assert warm.forked and not warm.cuda_initialized
        # The trial ran torch's intra-op (OpenMP) pool in a fork without hanging: the server never started it.
        assert len(last_of(run.events, TrialResult).step_seconds) == 2


def test_a_forked_trial_measures_what_a_spawned_one_does(tmp_path):
    # The cap counts the data segment: a fork must use what a spawned process (the user's own) uses.
    # Measured here at batch 24 of memory_hog: 1562.84 MB forked, 1562.83 MB spawned (8 MiB less forked
    # before the server's threads were parked in the fork: see child.server._park_threads). Batch 16 here,
    # far from the edge (CI's machine once ran out of memory at 24).
    spec = Spec.model_validate(hog_spec())
    conditions = trial_conditions(spec, "cpu", BUDGET)
    peaks = {}
    for fork in (True, False):
        with LocalExecutor(tmp_path / str(fork), fork=("cpu",) if fork else ()) as executor:
            (tmp_path / str(fork)).mkdir(exist_ok=True)
            run = executor.run(_request(spec, 16), conditions, timeout=300, name="t")
        assert classify_exit(run).outcome.value == "fits"
        peaks[fork] = last_of(run.events, TrialResult).budget_peak_bytes
    assert abs(peaks[True] - peaks[False]) < 4 * 1024**2, peaks  # one sample is ~23 MB; a stack is 8 MiB


def test_a_server_whose_imports_started_openmp_forks_no_trial_and_the_probe_spawns_them(tmp_path, monkeypatch):
    # tests/support/pool_at_import.py runs a parallel tanh when imported: a fork of the server would hang in its first
    # parallel region (measured). The server's canary fork finds that out before any trial is forked.
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
    spec = Spec.model_validate(hog_spec())
    conditions = replace(trial_conditions(spec, "cpu", BUDGET), preload=("torch", "torch._dynamo", "pool_at_import"))
    with LocalExecutor(tmp_path, fork=("cpu",)) as executor:
        runs = [executor.run(_request(spec, 2), conditions, timeout=120, name=f"t{i}") for i in range(2)]
    assert [classify_exit(run).outcome.value for run in runs] == ["fits", "fits"]
    assert not any(run.forked for run in runs)
    said = [p.read_text() for p in tmp_path.glob("child*.stderr") if "fork server" in p.read_text()]
    assert len(said) == 1 and "spawns its trials" in said[0], said  # one server tried, then none again


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_server_lost_during_a_trial_takes_the_trial_with_it_and_the_trial_is_run_again_not_charged(tmp_path, how):
    """The server is isoprobe's, not the trial's: its loss mid-trial is never the trial's outcome (issue 25).

    Killed: its keeper kills the trial, the channel closes. Stopped (SIGSTOP): the trial hangs on to its
    timeout, its keeper then ends it, and the stopped server never reports that end; the wait is bounded
    all the same. Either way the trial is run again, on a fresh server, and its verdict is the re-run's.
    """
    state = tmp_path / "state"
    state.mkdir()
    spec = Spec.model_validate(fault_spec("nth:1:hang", at=2, start=2, cap=2, state_dir=str(state)))
    conditions = trial_conditions(spec, "cpu", None)
    with LocalExecutor(tmp_path, fork=("cpu",)) as executor:
        executor.prestart(conditions)
        server_pid = wait_for(lambda: _started_server(tmp_path), 60)
        assert server_pid, "the fork server did not start"
        killer = _signal_when_committed(state, server_pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        run = executor.run(_request(spec, 2), conditions, timeout=8, name="t")
        killer.join()
    assert run.lost is None and len(run.lost_before) == 1, run
    assert ("is gone" if how == "killed" else "did not report the end") in run.lost_before[0]
    assert run.forked and classify_exit(run).outcome.value == "fits"  # the re-run's: a fresh server's fork
    assert last_of(run.events, Started).pid not in _committed(state)
    # The autouse fixture (conftest.no_leftover_processes) fails the test if the trial, the stopped server or
    # anything else survived.


def _started_server(workdir: Path) -> int | None:
    """The fork server's PID once it is warm, else None."""
    started = last_of(_server_events(workdir), Started)
    return started.pid if started else None


def _committed(state: Path) -> list[int]:
    """The PIDs of the trials that began their fault (tests/support/faults.py writes committed-<pid>)."""
    return [int(path.name.split("-", 1)[1]) for path in state.glob("committed-*")]


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def _signal_when_committed(state: Path, pid: int | None, signum: int, trials: int = 1):
    """A thread that sends ``signum`` to ``pid`` (None: the server of the first trial that began its fault), once
    ``trials`` trials have begun their fault."""
    import threading

    def send() -> None:
        if wait_for(lambda: len(_committed(state)) >= trials, 120):
            # The trial's parent is its keeper, forked by the server.
            target = pid if pid is not None else _parent(_parent(_committed(state)[0]))
            os.kill(target, signum)
            thread.signalled.append(target)

    thread = threading.Thread(target=send)
    thread.signalled = []
    thread.start()
    return thread


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_probe_whose_server_is_lost_at_the_edge_still_finds_the_true_edge(tmp_path, how):
    """Batch 5 is the edge (6 runs out of memory); its first trial sleeps, and its server is lost meanwhile.

    Before issue 25 the lost trial was 'crashed' beside the re-run's 'fits': batch 5 was flaky and the
    answer 4; a stopped server hung the probe for ever.
    """
    state = tmp_path / "state"
    state.mkdir()
    spec = fault_spec("nth:1:sleep:3", at=5, edge=5, start=2, cap=8, timeout=20, state_dir=str(state))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    killer = _signal_when_committed(state, None, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    try:
        done = run_cli("run", str(path), "--format", "json", timeout=400)
    finally:
        killer.join()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["max_batch_size"] == 5, done.stderr
    assert [t["outcome"] for t in result["trials"] if t["batch_size"] == 5] == ["fits"] * len(
        [t for t in result["trials"] if t["batch_size"] == 5])  # the lost trial is not among them
    assert "was run again" in done.stderr and "not counted" in done.stderr
    assert killer.signalled and not _alive(killer.signalled[0])  # the stopped server did not outlive the probe


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_server_lost_mid_round_takes_both_slots_with_it_and_the_probe_still_finds_the_true_edge(tmp_path, how):
    """search.parallel 2: round 1 is [3, 6], and the first trial of every batch from 3 sleeps 5 s; the server is
    lost once both slots are in that sleep, so both are its forks (the environment check runs batch 2: it
    commits no fault). Both are run again on a fresh server, never counted. Batch 7 is the edge.

    Before this was fixed the lost slot reached the probe, which stopped without an answer (exit 4).
    """
    state = tmp_path / "state"
    state.mkdir()
    spec = fault_spec("nth:1:sleep:5", at=3, edge=7, start=3, cap=10, timeout=20, state_dir=str(state), parallel=2)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    killer = _signal_when_committed(state, None, signal.SIGKILL if how == "killed" else signal.SIGSTOP, trials=2)
    try:
        # Bounded: a stopped server's trials are lost 10 s after they end (fork_server_channel.ENDED_REPLY_SECONDS), then
        # run again; the probe must not wait on it for ever (run_cli's timeout fails the test).
        done = run_cli("run", str(path), "--format", "json", timeout=400)
    finally:
        killer.join()
    assert done.returncode == 0, done.stderr
    assert "2 slots: up to 2 trials at once" in done.stderr
    result = json.loads(done.stdout)
    assert (result["max_batch_size"], result["first_failing_batch_size"]) == (7, 8), done.stderr
    assert all(t["outcome"] == "fits" for t in result["trials"] if t["batch_size"] <= 7), done.stderr
    again = [line for line in done.stderr.splitlines() if "was run again" in line]
    assert sorted(re.search(r"\(batch (\d+)\)", line).group(1) for line in again) == ["3", "6"], done.stderr
    assert all("not counted" in line for line in again), done.stderr
    assert killer.signalled and not _alive(killer.signalled[0])  # the lost server did not outlive the probe


def _faulty_spec_file(tmp_path: Path, trial_timeout: float, build_seconds: float = 0.0) -> str:
    spec = faulty_spec("raise", at=10**6, trial_timeout=trial_timeout, build_seconds=build_seconds)  # never reaches the fault: every trial fits
    spec["search"]["max_batch_size"] = 8
    path = tmp_path / "faulty.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_a_fork_stopped_at_a_tiny_timeout_is_reported_as_a_spawned_child_is(tmp_path):
    """The timeout runs from the fork's first report (after it set itself up), as from a spawned child's imports.

    Before issue 25 it ran from the order: a fork killed while it mapped its pages said nothing, and the
    environment check read "did not get past starting Python ... check the Python environment".
    The model takes 2 s to build, so the check is stopped on any machine (CI's once built it within 0.05 s).
    """
    spec = _faulty_spec_file(tmp_path, 0.05, build_seconds=2.0)
    said = {}
    for fork in ("true", "false"):
        done = run_cli("run", spec, "--format", "json", "--set", f"search.fork_server={fork}", timeout=300)
        assert done.returncode == 4, done.stderr
        said[fork] = done.stderr.splitlines()[-1]
    assert said["true"] == said["false"], said
    assert "stopped after search.trial_timeout (0.05 s)" in said["true"] and "raise search.trial_timeout" in said["true"]


def test_a_fork_without_room_for_its_files_is_no_crash_and_the_probe_names_tmpdir(tmp_path, tiny_tmpdir):
    """Before issue 25 the fork that could not write its first event was trial 1, 'crashed' (charged to batch 2)."""
    done = run_cli("run", _faulty_spec_file(tmp_path, 120), "--format", "json", env={"TMPDIR": str(tiny_tmpdir)},
                   timeout=300)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr and "crashed" not in done.stderr, done.stderr
    assert "No space left on device" in done.stderr.splitlines()[-1] and "TMPDIR" in done.stderr.splitlines()[-1]


def test_the_result_schema_documents_the_forked_field():
    schema = json.loads(run_cli("schema").stdout)
    text = json.dumps(schema)
    assert "fork server" in text


@pytest.mark.parametrize("forked", [True, False], ids=["fork server", "warm spare"])
def test_the_process_started_before_the_check_imports_the_models_modules_and_serves_the_first_trial(tmp_path, forked):
    """Issue 35: the fork server (or warm spare) started beside the environment check is told to import the
    modules the check saw the model's code import, not replaced by one that imports torch again while the
    first trial waits (8.6 s measured on the Hugging Face path). Real processes: the server answers the
    ``ImportOrder``, the spare reads its ``IMPORT_LINE``, and the trial runs in that process with them
    imported (tests/unit/test_prestart_extends.py has the rules, without processes)."""
    spec = Spec.model_validate(hog_spec())
    guess = trial_conditions(spec, "cpu", BUDGET)
    conditions = replace(guess, preload=(*guess.preload, "colorsys", "json"))
    with LocalExecutor(tmp_path, warm=not forked, fork=("cpu",) if forked else ()) as executor:
        executor.prestart(guess)
        executor.prestart(conditions)
        run = executor.run(_request(spec, 2), conditions, timeout=120, name="t")
        started = sorted(tmp_path.glob("child*.stdout"))  # one for each process started (the parent opens it)
    assert classify_exit(run).outcome.value == "fits" and run.warm and run.forked is forked
    assert last_of(run.events, Warm).modules[-2:] == ["colorsys", "json"]
    # Started: the server and the trial's fork; or the spare, which ran the trial, and the next trial's spare.
    assert len(started) == 2, started
    if forked:
        assert last_of(_server_events(tmp_path), Warm).modules == list(guess.preload)  # its first report, unchanged
