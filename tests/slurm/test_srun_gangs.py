"""Gang trials as Slurm job steps (issue 29), on the real single-node cluster of conftest.py.

Debian 12's slurmd cannot run two node daemons on one host (that takes a
``--enable-multiple-slurmd`` build; the ``slurm-wlm-emulator`` package has one,
but installing it replaces the machine's slurmd through update-alternatives), so
every step here runs its ranks as tasks of one node: the same ``srun`` path,
the same rank wrapper and supervision as across nodes.

Each test runs isoprobe inside a batch job of two tasks, as a user's job
script does, with ``distributed.launcher: srun``: the gloo ranks of every
trial are one job step. Tiny CPU specs, few trials (a step's ranks import torch
cold: about 10 to 25 s a trial on 2 busy cores).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import MODELS, marked_processes, wait_for

from slurm_jobs import budget_with_the_edge_inside, fault_spec, job_script, step_ids, write_spec


def _run(cluster, script: str, timeout: float = 240):
    job = cluster.run(script, timeout=timeout, ntasks=2)
    return job


@pytest.fixture(scope="module")
def folder(tmp_path_factory, slurm_cluster):
    return tmp_path_factory.mktemp("srun-gangs")


def test_a_steps_edge_is_the_local_gangs_for_the_same_world_size(slurm_cluster, folder):
    """The local gang finds the per-rank edge of a real memory model under a real cap; fresh srun steps of two
    ranks, started on either side of it, agree: the edge fits as a step and the next batch runs out of memory.

    The steps run under a budget that puts the local edge half a sample inside it
    (slurm_jobs.budget_with_the_edge_inside):
    under the first budget the local edge had a MiB or two to spare, and CI once saw its first failing batch fit
    as a step."""
    spec = {
        "model": {"factory": f"{MODELS}:memory_hog", "kwargs": {"features": 262144, "depth": 4}},
        "input": {"shape": [262144]},
        "target": {"classes": 10},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": 2, "steps": 2, "trial_timeout": 120, "confirmations": 0, "steady_steps": 0},
        "device": "cpu",
        "memory_budget": "1100MiB",
        "recommendation": {"soak_steps": 0},
        "distributed": {"strategy": "ddp", "world_size": 2, "launcher": "local"},
    }
    local_out = folder / "edge-local.json"
    job = _run(slurm_cluster, job_script(write_spec(folder, spec, "edge-local"), local_out))
    assert job.state == "COMPLETED", job.describe()
    local = json.loads(local_out.read_text())
    edge, failing = local["max_batch_size"], local["first_failing_batch_size"]
    assert edge and failing == edge + 1, local["message"]
    assert local["distributed"]["launcher"] == "local"

    spec["memory_budget"] = budget_with_the_edge_inside(local)
    spec["distributed"]["launcher"] = "srun"
    spec["search"].update(start_batch_size=edge, max_batch_size=edge + 1, estimate=False)
    srun_out = folder / "edge-srun.json"
    job = _run(slurm_cluster, job_script(write_spec(folder, spec, "edge-srun"), srun_out))
    assert job.state == "COMPLETED", job.describe()
    stepped = json.loads(srun_out.read_text())
    assert (stepped["max_batch_size"], stepped["first_failing_batch_size"]) == (edge, failing), stepped["trials"]
    assert stepped["distributed"]["launcher"] == "srun"
    assert stepped["distributed"]["nodes"] == [slurm_cluster.node]
    assert stepped["distributed"]["world_size"] == 2
    at_edge = [t for t in stepped["trials"] if t["batch_size"] == edge and t["outcome"] == "fits"]
    assert at_edge and all(rank["node"] == slurm_cluster.node for rank in at_edge[0]["ranks"])
    # The same ranks' peak, in the budget's units, within the run-to-run noise of fresh processes.
    local_peak = max(r["budget_peak_bytes"] for t in local["trials"] if t["batch_size"] == edge
                     and t["outcome"] == "fits" for r in t["ranks"])
    srun_peak = max(r["budget_peak_bytes"] for r in at_edge[0]["ranks"])
    assert abs(srun_peak - local_peak) < 8 * 2**20, (srun_peak, local_peak)
    assert step_ids(slurm_cluster, job.job_id) == []


def test_a_rank_out_of_memory_ends_the_step_at_once_and_is_named_with_its_node(slurm_cluster, folder):
    """Rank 1 alone runs out of memory at batch 4 (a real allocation under its cap); rank 0 waits in DDP's
    all-reduce. The step ends within seconds, not at the 120 s timeout, and the trial is rank 1's, on its node."""
    out = folder / "oom.json"
    job = _run(slurm_cluster, job_script(write_spec(folder, fault_spec("alloc", start=3, at=4, ranks=[1], timeout=120),
                                                 "oom"), out))
    assert job.state == "COMPLETED", job.describe()
    result = json.loads(out.read_text())
    assert (result["max_batch_size"], result["first_failing_batch_size"]) == (3, 4), result["trials"]
    [failing] = [t for t in result["trials"] if t["batch_size"] == 4]
    assert failing["outcome"] == "out_of_memory" and failing["failed_rank"] == 1, failing
    assert failing["ranks"][1]["outcome"] == "out_of_memory" and failing["ranks"][0]["stopped_by_gang"]
    assert failing["ranks"][1]["node"] == slurm_cluster.node
    assert failing["seconds"] < 30 and failing["gang_stop_seconds"] < 10, failing
    assert f"rank 1 on {slurm_cluster.node}" in job.stderr


def test_a_hung_rank_ends_the_step_at_the_trial_timeout_and_leaves_nothing(slurm_cluster, folder):
    marker = f"ISOPROBE_TEST_MARKER=srun-hang-{os.getpid()}-{time.monotonic_ns()}"
    out = folder / "hang.json"
    job = _run(slurm_cluster, job_script(write_spec(folder, fault_spec("hang", start=3, at=4, ranks=[1], timeout=10),
                                                 "hang"), out, marker=marker))
    assert job.state == "COMPLETED", job.describe()
    result = json.loads(out.read_text())
    [hung] = [t for t in result["trials"] if t["batch_size"] == 4]
    assert hung["outcome"] == "timed_out" and 10 <= hung["seconds"] < 20, hung
    assert hung["failed_rank"] == 1, hung["ranks"]  # it never finished its forward pass; rank 0 did
    assert result["max_batch_size"] == 3 and result["first_failing_outcome"] == "timed_out"
    assert step_ids(slurm_cluster, job.job_id) == []
    assert not marked_processes(*marker.split("=", 1))


def test_slurm_refusing_the_step_is_no_outcome_of_the_batch(slurm_cluster, folder):
    """Three ranks in an allocation of two tasks: srun refuses the step twice; exit 4 with Slurm's words."""
    spec = fault_spec("alloc", start=2, at=4, ranks=[1], timeout=60)
    spec["distributed"]["world_size"] = 3
    out = folder / "refused.json"
    job = _run(slurm_cluster, job_script(write_spec(folder, spec, "refused"), out))
    assert job.state == "FAILED" and job.exit_code == "4:0", job.describe()
    assert "Slurm refused the job step" in job.stderr and "That is the allocation, not the batch" in job.stderr
    assert "More processors requested than permitted" in job.stderr  # Slurm's own words, passed on
    assert job.stderr.count("isoprobe: trial") == 0  # no trial was counted
    assert step_ids(slurm_cluster, job.job_id) == []


def test_isoprobe_killed_mid_step_leaves_no_step_and_no_process(slurm_cluster, folder):
    """SIGKILL, which isoprobe cannot catch: srun's keeper kills srun, and slurmstepd then the step's tasks."""
    state = folder / "kill-state"
    state.mkdir()
    marker = f"ISOPROBE_TEST_MARKER=srun-kill-{os.getpid()}-{time.monotonic_ns()}"
    pidfile = folder / "kill.pid"
    spec = write_spec(folder, fault_spec("hang", start=2, at=2, ranks=[0, 1], timeout=300, state_dir=str(state)), "kill")
    job_id = slurm_cluster.submit(job_script(spec, folder / "kill.json", marker=marker, pidfile=pidfile), ntasks=2)
    try:
        assert wait_for(lambda: len(list(state.glob("committed-*"))) >= 2, 150), slurm_cluster.output(job_id, "err")
        steps = step_ids(slurm_cluster, job_id)
        assert len(steps) == 1, steps
        assert len(marked_processes(*marker.split("=", 1))) >= 3  # isoprobe, srun, the ranks
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        killed = time.monotonic()
        gone = wait_for(lambda: not step_ids(slurm_cluster, job_id) and not marked_processes(*marker.split("=", 1)), 15)
        latency = time.monotonic() - killed
        assert gone, (step_ids(slurm_cluster, job_id), marked_processes(*marker.split("=", 1)))
        print(f"isoprobe SIGKILLed: no step and no process after {latency:.2f} s")
        assert slurm_cluster.job_info(job_id).get("JobState") == "RUNNING"  # the job outlived isoprobe: not its end
    finally:
        slurm_cluster.command("scancel", job_id, check=False)
        slurm_cluster.wait(job_id, timeout=60)
