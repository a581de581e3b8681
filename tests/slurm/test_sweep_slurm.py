"""``isoprobe sweep --executor slurm`` against the suite's real cluster (issue 17): job arrays through submitit.

Tiny CPU specs (tests/support/faults.py:faulty: fits up to ``edge``, the CPU allocator's own
out-of-memory error above it) so that each probe takes seconds and its answer is known:
edges 5, 9 and 13. The sweep runs as a command, as a user runs it, with the cluster's
SLURM_CONF; its report is read from stdout (--format json).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from slurm_jobs import faulty, sweep


EDGES = {"edge5.yaml": 5, "edge9.yaml": 9, "edge13.yaml": 13}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, slurm_cluster):
    folder = tmp_path_factory.mktemp("sweep")
    for name, edge in EDGES.items():
        (folder / name).write_text(json.dumps(faulty("raise", at=99, edge=edge)))
    (folder / "broken.yaml").write_text(json.dumps(faulty("raise", at=2, edge=8)))
    (folder / "hangs.yaml").write_text(json.dumps(faulty("hang", at=2, edge=8, timeout=300)))
    return folder


def job_ids(cluster) -> set[str]:
    """Every job the controller knows (MinJobAge keeps finished ones listed for 10 minutes)."""
    done = cluster.command("scontrol", "show", "job", "-o", check=False)
    return {part.split("=", 1)[1] for line in done.stdout.splitlines() for part in line.split()
            if part.startswith("JobId=")}


def queued(cluster) -> list[str]:
    return cluster.command("squeue", "-h", "-r", "-o", "%i %T").stdout.split("\n")[:-1]


def test_a_sweep_is_one_job_array_and_a_second_one_submits_nothing(slurm_cluster, sweep_dir):
    code, report, stderr, seconds = sweep(slurm_cluster, sweep_dir, "cache", *EDGES)
    assert code == 0, stderr
    slurm_cluster.settle()
    assert report["executor"] == "slurm" and report["submitted"] == 3 and len(report["array_jobs"]) == 1
    array = report["array_jobs"][0]
    for row, (name, edge) in zip(report["rows"], EDGES.items()):
        assert row["spec"] == name and row["target"] == f"partition={slurm_cluster.partition}"
        assert row["answered"] and row["max_batch_size"] == edge and row["error"] is None, row
        assert row["job_id"].startswith(f"{array}_") and not row["cached"]
        entry = json.loads(Path(row["cache_path"]).read_text())  # the full result, in the shared cache
        assert entry["max_batch_size"] == edge and row["trials"] == len(entry["trials"])
    assert len({row["job_id"] for row in report["rows"]}) == 3
    from isoprobe.sweep.model import SweepReport, render_sweep_table

    print(f"\nfirst sweep: {seconds:.1f} s\n{stderr}{render_sweep_table(SweepReport.model_validate(report))}")

    before = job_ids(slurm_cluster)
    code, again, stderr, seconds = sweep(slurm_cluster, sweep_dir, "cache", *EDGES)
    assert code == 0, stderr
    assert again["submitted"] == 0 and again["array_jobs"] == []
    assert job_ids(slurm_cluster) == before  # no new job reached the controller
    for row, first in zip(again["rows"], report["rows"]):
        assert row["cached"] and row["max_batch_size"] == first["max_batch_size"]
        assert row["cache_path"] == first["cache_path"]
    print(f"second (cached) sweep: {seconds:.1f} s")


def test_a_failing_spec_gets_its_error_and_the_others_answer(slurm_cluster, sweep_dir):
    code, report, stderr, _ = sweep(slurm_cluster, sweep_dir, "cache-failing", "edge5.yaml", "broken.yaml",
                                    "missing.yaml")
    slurm_cluster.settle()
    assert code == 4, stderr
    good, broken, missing = report["rows"]
    assert good["answered"] and good["max_batch_size"] == 5 and not good["cached"]
    assert not broken["answered"] and broken["stop_reason"] == "error" and "deliberate" in broken["error"]
    assert broken["job_id"] is not None and broken["cache_path"] is None
    assert not missing["answered"] and missing["error"].startswith("bad spec") and missing["job_id"] is None
    assert report["submitted"] == 2  # the missing spec is refused before submitting


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_a_sweep_cancels_its_array(slurm_cluster, sweep_dir, signum):
    assert queued(slurm_cluster) == []
    proc = sweep(slurm_cluster, sweep_dir, f"cache-hang-{signum}", "hangs.yaml", "edge9.yaml", popen=True)
    try:
        deadline = time.monotonic() + 60
        while not any(line.endswith("RUNNING") for line in queued(slurm_cluster)):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        time.sleep(2)  # the hanging trial has started
        began = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=90)
        stopped = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if signum == signal.SIGINT else 143), err
    assert queued(slurm_cluster) == []  # nothing left queued or running when the sweep returns
    report = json.loads(out)
    assert report["interrupted"] == ("interrupted" if signum == signal.SIGINT else "terminated")
    hang = report["rows"][0]
    assert not hang["answered"] and hang["error"].startswith("cancelled")
    slurm_cluster.settle(timeout=10)
    assert slurm_cluster.steps_alive() == []
    print(f"\ncancelled in {stopped:.1f} s")
