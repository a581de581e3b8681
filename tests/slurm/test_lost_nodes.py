"""What Slurm loses under a trial is named, and never waited for past the trial's timeout (issue 47), on the two-node
cluster of conftest.py: a node's step daemon (slurmstepd) killed mid-trial, and a node's own daemon (slurmd) killed.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import marked_processes, wait_for

from slurm_jobs import fault_spec, job_script, step_ids, write_spec


@pytest.fixture(autouse=True)
def idle_nodes(two_node_cluster):
    why = two_node_cluster.wait_idle(90)
    assert why is None, why


def _uts(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/uts")


def step_daemon(cluster, step: str, node: str) -> int | None:
    """The pid of ``node``'s slurmstepd for ``step`` (JOB.STEP): that node's daemons share its UTS namespace."""
    node_ns = _uts(cluster.procs[f"slurmd-{node}"].pid)
    for pid in cluster.steps_alive(step.split(".")[0]):
        try:
            if f"[{step}]" in open(f"/proc/{pid}/cmdline").read() and _uts(pid) == node_ns:
                return pid
        except OSError:
            continue
    return None


def _hanging_probe(cluster, folder, name: str, timeout: float):
    """A probe whose both ranks hang in the trial at batch 2 (a step across n1 and n2), run in the background of a
    batch shell that outlives it: (job id, state folder, exit status file, marker)."""
    state = folder / f"{name}-state"
    state.mkdir()
    marker = f"ISOPROBE_TEST_MARKER=two-node-{name}-{os.getpid()}-{time.monotonic_ns()}"
    spec = write_spec(folder, fault_spec("hang", start=2, at=2, ranks=[0, 1], timeout=timeout, state_dir=str(state)),
                      name)
    status, pidfile = folder / f"{name}.status", folder / f"{name}.pid"
    job_id = cluster.submit(job_script(spec, folder / f"{name}.json", marker=marker, pidfile=pidfile, status=status),
                            nodes=2, ntasks_per_node=1)
    assert wait_for(lambda: len(list(state.glob("committed-*"))) >= 2, 150), cluster.output(job_id, "err")
    return job_id, status, marker


def test_a_step_daemon_lost_mid_trial_is_named_within_the_trial_timeout(two_node_cluster, tmp_path):
    """n2's slurmstepd of the trial's step is SIGKILLed while both ranks run: srun and the ranks end, and Slurm keeps
    listing the step (nothing is left on n2 to say it ended). Before: isoprobe waited silently past its trial
    timeout, until the job was cancelled. Now it stops within the trial's timeout (plus the time it gives Slurm to
    drop an ended step), exit 4, naming n2 and its lost step daemon; no batch is credited."""
    cluster = two_node_cluster
    timeout = 30
    job_id, status, marker = _hanging_probe(cluster, tmp_path, "stepd", timeout)
    try:
        [step] = step_ids(cluster, job_id)
        pid = step_daemon(cluster, step, "n2")
        assert pid is not None, (step, cluster.steps_alive(job_id))
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(status.exists, timeout + 60), (
            f"isoprobe still running {timeout + 60} s after n2's step daemon was killed\n"
            + cluster.output(job_id, "err")[-3000:])
        stopped = time.monotonic() - killed
        err = cluster.output(job_id, "err")
        said = " ".join(err.split())
        assert status.read_text().strip() == "4", err
        assert "n2" in said and "step daemon" in said and step in said, err
        assert err.count("isoprobe: trial") == 0, err  # the batch got no outcome
        print(f"lost step daemon on n2: isoprobe stopped {stopped:.1f} s after")
    finally:
        cluster.command("scancel", job_id, check=False)
        cluster.wait(job_id, timeout=90)
        assert wait_for(lambda: not marked_processes(*marker.split("=", 1)), 30), marked_processes(*marker.split("=", 1))
        cluster.command("scontrol", "update", "NodeName=n1,n2", "State=RESUME", check=False)


def test_a_node_lost_mid_trial_is_named_when_slurm_cancels_the_job(two_node_cluster, tmp_path):
    """n2's node daemon (slurmd) stops answering while both ranks run a step (SIGSTOPped: to Slurm, a daemon killed;
    it comes back after, and no new daemon outlives the test): Slurm marks n2 down after its node timeout
    (SlurmdTimeout=10 on this cluster) and cancels the job, whose SIGTERM stops isoprobe. Before, the probe said only
    "stopped by SIGTERM before an answer"; now it names n2 and that Slurm counts it out of service, on stderr and in
    the result's message."""
    cluster = two_node_cluster
    job_id, _, marker = _hanging_probe(cluster, tmp_path, "slurmd", 300)
    daemon = cluster.procs["slurmd-n2"]
    try:
        os.kill(daemon.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert wait_for(lambda: "isoprobe: 0 trials in" in cluster.output(job_id, "err"), 120), (
            cluster.output(job_id, "err")[-3000:])
        stopped = time.monotonic() - stopped_at
        err = cluster.output(job_id, "err")
        said = " ".join(err.split())
        assert "stopped by SIGTERM" in said and "DUE TO NODE FAILURE" in said, err
        assert "n2 is down" in said and "out of service" in said, err
        result = json.loads((tmp_path / "slurmd.json").read_text())
        assert result["stop_reason"] == "terminated" and "n2 is down" in result["message"], result["message"]
        print(f"node daemon of n2 stopped answering: isoprobe stopped {stopped:.1f} s after, naming n2")
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
        cluster.command("scancel", job_id, check=False)
        cluster.command("scontrol", "update", "NodeName=n2", "State=RESUME", check=False)
        cluster.wait(job_id, timeout=120)
        assert cluster.wait_idle(120) is None
        assert wait_for(lambda: not marked_processes(*marker.split("=", 1)), 60), marked_processes(*marker.split("=", 1))
