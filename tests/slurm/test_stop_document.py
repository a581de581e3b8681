"""Slurm jobs stopped mid-probe leave the stop's document where their stdout goes (issue 56, item 2).

Slurm ends a job (its time limit, ``scancel``) with SIGTERM to every process of the job, then SIGKILL KillWait
seconds later (30 by default; 2 on the test cluster). isoprobe must print its document in between: exit 143, the
trials so far, and a message that says why the SIGTERM came where Slurm says so (``system.slurm_job`` asks
``scontrol`` once). A time limit takes a minute or more to fall here (slurmctld checks the limits every 30 s): its
message is checked with a fake scontrol in tests/unit/test_slurm_time_limit.py, and was measured once on this
cluster with ``--time=1`` (docs/slurm.md, "Stopped by Slurm"). These jobs are cancelled instead, which takes
seconds and goes through the same path with the real scontrol, which must then name no time limit.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import yaml

from conftest import faulty_spec

REPO = Path(__file__).resolve().parents[2]


def probing(cluster, spec: Path, cache: Path, out: Path) -> str:
    """A job that runs ``isoprobe run SPEC --format json > OUT`` with the shared cache ``cache``; its id."""
    return cluster.submit(
        f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:/usr/bin:/bin\n"
        f"export ISOPROBE_CACHE_DIR={shlex.quote(str(cache))}\n"
        f"cd {shlex.quote(str(REPO))}\n"
        f"python -m isoprobe run {shlex.quote(str(spec))} --format json > {shlex.quote(str(out))}\n")


def said_in_time(cluster, job: str, words: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while words not in cluster.output(job, "err") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert words in cluster.output(job, "err"), cluster.output(job, "err")


def cancelled(cluster, job: str, out: Path) -> tuple[dict, float]:
    """``scancel`` the job; its document, and the seconds from the scancel to it.

    The batch shell dies of the SIGTERM at once and Slurm counts the job done (60 ms after, measured); isoprobe,
    re-parented (proctrack/linuxproc no longer follows it), writes its document after that: so it is waited for.
    """
    began = time.monotonic()
    cluster.command("scancel", job)
    while not out.read_text().endswith("}\n") and time.monotonic() - began < 30:
        time.sleep(0.02)
    took = time.monotonic() - began
    assert cluster.wait(job, timeout=60) == "CANCELLED"
    said = cluster.output(job, "err")
    assert out.read_text().endswith("}\n"), f"no document 30 s after scancel\n{said}"
    assert took < 2, f"the document came {took:.2f} s after scancel, past the test cluster's KillWait (2 s)\n{said}"
    return json.loads(out.read_text()), took


def test_jobs_cancelled_mid_probe_and_while_waiting_for_it_leave_their_documents(slurm_cluster, tmp_path):
    """Two jobs of one setup (an array's): the first probes, the second waits on the cache's lock for its answer.
    Before issue 56 the second, cancelled there, exited 143 with one line on stderr and nothing on stdout."""
    spec = tmp_path / "hang.yaml"
    spec.write_text(yaml.safe_dump(faulty_spec("hang", at=3, trial_timeout=300)))  # batch 2 fits, 3 hangs
    cache, first_out, second_out = tmp_path / "cache", tmp_path / "first.json", tmp_path / "second.json"
    first = probing(slurm_cluster, spec, cache, first_out)
    jobs = [first]
    try:
        said_in_time(slurm_cluster, first, "isoprobe: trial ")  # trial 2 (batch 3) runs next, and hangs
        jobs.append(second := probing(slurm_cluster, spec, cache, second_out))
        said_in_time(slurm_cluster, second, "another isoprobe is probing this setup")

        waiting, _ = cancelled(slurm_cluster, second, second_out)
        assert waiting["stop_reason"] == "terminated" and waiting["answered"] is False and waiting["trials"] == []
        assert waiting["message"] == "stopped by SIGTERM before the first trial"

        probed, _ = cancelled(slurm_cluster, first, first_out)
        assert probed["stop_reason"] == "terminated" and probed["answered"] is False
        assert [(t["batch_size"], t["outcome"]) for t in probed["trials"]] == [(2, "fits")]
        assert probed["message"] == "stopped by SIGTERM before an answer; largest batch that fit so far: 2"
    finally:  # a failed check: nothing of the jobs may outlive the test (each isoprobe ends with its SIGTERM)
        slurm_cluster.command("scancel", *jobs, check=False)
        for job in jobs:
            slurm_cluster.wait(job, timeout=60)
