"""No probe drains a node (issue 47), on the two-node cluster of conftest.py.

Why a node drained: slurmstepd arms its unkillable-step monitor (``UnkillableStepTimeout``, 60 s by default) when a
step gets a *terminate* request, and ``scancel --signal=KILL JOB.STEP`` sends exactly that, straight to each node's
slurmd (Slurm 22.05's scancel calls ``slurm_terminate_job_step``: REQUEST_TERMINATE_TASKS). isoprobe ended every
trial's step that way, and asked again every few seconds while the step stayed listed: any task of the step that
slurmstepd had not reaped 60 s after the first request then drained its node ("Kill task failed"), the probe's trial
took 67 s (its 60 s wait for the step to leave squeue, then the drain let it go), and the next tests found the node
drained. Measured (a task Slurm's SIGKILL skips, cancelled with each command, this cluster): ``scancel --signal=KILL``
drained n1 and n2 61 s later; ``scancel --ctld --signal=KILL`` (through slurmctld: REQUEST_SIGNAL_TASKS, the same
SIGKILL to the same processes) armed nothing. isoprobe now always asks through slurmctld
(``primitives.KILL_THROUGH_SLURMCTLD``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_jobs import PYTHON, fault_spec, job_script, step_ids, write_spec
from .test_two_nodes import HOOK_WORKLOAD, _hook_job, _said, hook_budget, run_on_two_nodes


#: How many times the loaded test runs the out-of-memory gang probe and the pre-job hook (10 for issue 47's record;
#: 1 by default: each run is about 4 minutes of a 40-minute CI).
LOADED_RUNS = int(os.environ.get("ISOPROBE_LOADED_RUNS", "1"))
#: States a node may be seen in right after a job: anything else (drain, draining, drained, down...) has left idle.
SETTLING = {"idle", "completing", "allocated", "mixed"}


@pytest.fixture(autouse=True)
def idle_nodes(two_node_cluster):
    why = two_node_cluster.wait_idle(90)
    assert why is None, why


def _recording_scancel(folder: Path) -> Path:
    """A folder whose ``scancel`` appends its arguments to ``scancel.calls`` and runs the real one."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    real = subprocess.run(["sh", "-c", "command -v scancel"], capture_output=True, text=True).stdout.strip()
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(folder / "scancel.calls"))}\n'
                                     f'exec {shlex.quote(real)} "$@"\n')
    (bin_dir / "scancel").chmod(0o755)
    return bin_dir


def test_isoprobe_never_arms_slurms_unkillable_step_timer_when_it_ends_a_step(two_node_cluster, tmp_path):
    """Rank 1 on n2 runs out of memory at batch 4; isoprobe ends that step (and the others) through Slurm. Every
    kill it asks of Slurm goes through slurmctld (``--ctld``): none is a terminate request to the nodes, which arms
    slurmstepd's UnkillableStepTimeout and drains a node whose tasks are slow to be reaped."""
    bin_dir = _recording_scancel(tmp_path)
    out = tmp_path / "oom.json"
    spec = write_spec(tmp_path, fault_spec("alloc", start=3, at=4, ranks=[1], timeout=120), "oom")
    job = run_on_two_nodes(two_node_cluster, f"export PATH={shlex.quote(str(bin_dir))}:$PATH\n" + job_script(spec, out))
    assert job.state == "COMPLETED", job.describe()
    result = json.loads(out.read_text())
    assert (result["max_batch_size"], result["first_failing_batch_size"]) == (3, 4), result["trials"]
    calls = (tmp_path / "scancel.calls").read_text().splitlines()
    kills = [call for call in calls if "--signal=KILL" in call.split()]
    assert kills, calls  # the out-of-memory trial's step was killed through Slurm
    assert all("--ctld" in call.split() for call in kills), calls
    assert step_ids(two_node_cluster, job.job_id) == []


# ------------------------------------------------------------------------------------- both cores loaded, N runs


@contextlib.contextmanager
def both_cores_loaded():
    """Two busy processes (one a core) for the ``with`` block, ended by their PIDs after it."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
               for _ in range(2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.send_signal(signal.SIGKILL)
            burner.wait()


def _kill_task_failures(cluster) -> int:
    return sum(path.read_text(errors="replace").count("Kill task failed") +
               path.read_text(errors="replace").count("NOT ENDING WITH SIGNALS")
               for path in cluster.logs.glob("*.log"))


def _settled_states(cluster, seconds: float = 60) -> dict[str, str]:
    """The nodes' states once both are idle again (or after ``seconds``): every state seen on the way is one a node
    passes through after a job; a drain (or anything else) is asserted against at once."""
    deadline = time.monotonic() + seconds
    while True:
        states = cluster.node_states()
        left = {node: state for node, state in states.items() if state.rstrip("*") not in SETTLING}
        assert not left, f"a node left idle: {states}"
        if all(state == "idle" for state in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def test_loaded_runs_of_the_oom_gang_and_the_hook_leave_every_node_idle(two_node_cluster, tmp_path_factory):
    """Both cores busy (two spinning processes beside the cluster's): ``ISOPROBE_LOADED_RUNS`` times, the
    out-of-memory gang probe (rank 1 on n2 out of memory at batch 4, rank 0 on n1 killed by Slurm) and the pre-job
    hook (a probe whose out-of-memory trials kill a rank on n1, training at its maximum, then one above it, where a
    rank runs out and Slurm kills its peer). After each, no node has left idle and no slurmd logged an unkillable
    step. The budget of the hook's workload is found once a session, by a local gang, before the load starts
    (test_two_nodes.hook_budget, shared with the unloaded hook test there, which also trains at the recommended
    batch: a training that fits ends no step, so it is not repeated here)."""
    cluster = two_node_cluster
    budget = hook_budget(cluster, tmp_path_factory.mktemp("loaded-calibration"))
    failures_before = _kill_task_failures(cluster)
    record = []
    with both_cores_loaded():
        for run in range(1, LOADED_RUNS + 1):
            folder = tmp_path_factory.mktemp(f"loaded-{run}")
            began = time.monotonic()
            out = folder / "oom.json"
            spec = write_spec(folder, fault_spec("alloc", start=3, at=4, ranks=[1], timeout=120), "oom")
            job = run_on_two_nodes(cluster, job_script(spec, out), timeout=300)
            assert job.state == "COMPLETED", job.describe()
            result = json.loads(out.read_text())
            assert (result["max_batch_size"], result["first_failing_batch_size"]) == (3, 4), result["trials"]
            [failing] = [t for t in result["trials"] if t["batch_size"] == 4]
            assert failing["outcome"] == "out_of_memory" and failing["gang_stop_seconds"] < 10, failing
            after_oom = _settled_states(cluster)

            spec = write_spec(folder, {**HOOK_WORKLOAD, "memory_budget": budget,
                                       "distributed": {"strategy": "ddp", "world_size": 2}}, "hook")
            first = run_on_two_nodes(cluster, _hook_job(spec, folder, budget, '"$ISOPROBE_MAX_BATCH_SIZE"'),
                                     timeout=900)
            assert first.state == "COMPLETED", first.describe()
            said = _said(first.stdout)
            assert said["hit"] == "0" and said[f"train_{said['max']}"] == "0", first.describe()
            second = run_on_two_nodes(cluster, _hook_job(spec, folder, budget,
                                                         '"$((ISOPROBE_MAX_BATCH_SIZE + 1))"'), timeout=600)
            assert second.state == "COMPLETED", second.describe()
            above = int(said["max"]) + 1
            assert _said(second.stdout)[f"train_{above}"] != "0", second.describe()
            after_hook = _settled_states(cluster)
            unkillable = _kill_task_failures(cluster) - failures_before
            line = (f"loaded run {run}/{LOADED_RUNS}: after the oom gang {after_oom} (its step ended "
                    f"{failing['gang_stop_seconds']:.2f} s after rank 1 ran out), after the hook {after_hook} "
                    f"(max {said['max']}, probe {said['probe_seconds']} s), unkillable steps logged {unkillable}, "
                    f"{time.monotonic() - began:.0f} s")
            print(line, flush=True)
            record.append(line)
            assert unkillable == 0, "\n".join(record) + "\n" + cluster.daemon_logs("slurmd-n1")
            assert all(state == "idle" for state in (*after_oom.values(), *after_hook.values())), "\n".join(record)
