"""What the Slurm tier's gang tests submit: fault specs run as srun steps, and the batch scripts that run isoprobe
on them (one node or two)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from conftest import FAULTS, REPO

PYTHON = sys.executable


def fault_spec(fault: str, *, start: int, at: int, ranks: list[int], timeout: float, **more) -> dict:
    """tests/support/faults.py:faulty as a DDP gang of two run as steps: ``ranks`` commit ``fault`` from batch ``at``
    on."""
    return {
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": fault, "at": at, "ranks": ranks, **more}},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": start, "max_batch_size": at, "steps": 2, "trial_timeout": timeout,
                   "estimate": False, "confirmations": 0, "retries": 0},
        "device": "cpu",
        "memory_budget": "1.5GiB",
        "recommendation": {"soak_steps": 0},
        "distributed": {"strategy": "ddp", "world_size": 2, "launcher": "srun"},
    }


def budget_with_the_edge_inside(local: dict) -> int:
    """A budget, in bytes, half a sample above the worst rank's peak at the edge the local gang found.

    The local gang's edge fits its budget by however little the machine's baseline leaves (measured: 0.7 to
    2.0 MiB free at 29 or 30 under 1100 MiB, with 6.9 MiB a sample), and a rank's reading moves by about a MiB
    between fresh processes: a second probe under the same budget is a coin toss at the edge (CI once saw the
    local gang's first failing batch fit as a step). Half a sample below this budget the local edge still fits
    (it fit with less room) and the next batch still runs out (it ran out with more), by half a sample each
    way, so a step probe under it must answer the local gang's edge unless the steps measure differently."""
    fits = sorted((t["batch_size"], t["budget_peak_bytes"]) for t in local["trials"]
                  if t["outcome"] == "fits" and t["budget_peak_bytes"])
    assert len(fits) >= 2, f"the local gang fit fewer than two batches: {fits}"
    (below, below_peak), (top, top_peak) = fits[-2], fits[-1]
    assert top == local["max_batch_size"], fits
    per_sample = (top_peak - below_peak) / (top - below)
    return int(top_peak + per_sample / 2)


def write_spec(folder: Path, spec: dict, name: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def job_script(spec: Path, out: Path, *, marker: str = "", pidfile: Path | None = None,
               status: Path | None = None, extra: str = "") -> str:
    """A batch script that runs this tree's isoprobe on ``spec``, JSON to ``out``.

    With ``pidfile``: isoprobe runs in the background (its pid written there) and the batch shell stays
    alive after it, so that what ends a step when isoprobe dies is isoprobe's own machinery, not the end
    of the batch step (which would kill every process of the job, srun included); with ``status`` too, its exit
    status is written there. Job control is on (``set -m``): a non-interactive shell starts a background command
    with SIGINT ignored, and a user's Ctrl-C must reach isoprobe as it does in a terminal.
    """
    q = shlex.quote
    lines = [f"export PYTHONPATH={q(str(REPO))}", "export ISOPROBE_CACHE_DIR=\"$PWD/cache-$SLURM_JOB_ID\"",
             f"cd {q(str(out.parent))}"]
    command = f"{q(PYTHON)} -m isoprobe run {q(str(spec))} --no-cache --format json {extra}> {q(str(out))}"
    if pidfile is not None:  # the marker on isoprobe (and what it starts) only, not on the batch shell's sleep
        waited = f"wait $!; echo $? > {q(str(status))}" if status is not None else "wait"
        lines += ["set -m", (f"{marker} " if marker else "") + f"{command} &", f"echo $! > {q(str(pidfile))}", waited,
                  "sleep 300"]
    else:
        lines += ([f"export {marker}"] if marker else []) + [f"exec {command}"]
    return "\n".join(lines) + "\n"


def step_ids(cluster, job_id: str) -> list[str]:
    """The job's steps ``squeue -s`` lists now, other than its batch step."""
    listed = cluster.command("squeue", "-h", "-s", "-j", job_id, "-o", "%i", check=False).stdout.split()
    return [step for step in listed if not step.endswith(".batch") and step.startswith(f"{job_id}.")]


def faulty(fault: str, at: int, edge: int, timeout: float = 60) -> dict:
    return {
        "model": {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": fault, "at": at, "edge": edge}},
        "input": {"shape": [16]},
        "target": {"classes": 4},
        "optimizer": {"name": "sgd"},
        "search": {"start_batch_size": 2, "max_batch_size": 16, "steps": 2, "confirmations": 0,
                   "trial_timeout": timeout},
        "device": "cpu",
        "memory_budget": "2GiB",
        "recommendation": {"soak_steps": 0, "headroom": 0.0},
    }


def sweep(cluster, folder: Path, cache: str, *specs: str, popen: bool = False, timeout: float = 240,
          cpus_per_task: int = 1):
    """Run ``isoprobe sweep --executor slurm`` in ``folder``: (exit code, report, stderr, seconds), or the Popen.
    ``cpus_per_task``: what each array task asks for (a whole node's CPUs put each task on a node of its own)."""
    env = {**cluster.env, "ISOPROBE_CACHE_DIR": str(folder / cache)}
    command = [sys.executable, "-m", "isoprobe", "sweep", *specs, "--executor", "slurm",
               "--partition", cluster.partition, "--cpus-per-task", str(cpus_per_task), "--time", "10",
               "--array-parallelism", "2", "--folder", str(folder / "jobs"), "--format", "json"]
    if popen:
        return subprocess.Popen(command, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    began = time.monotonic()
    done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - began
    report = json.loads(done.stdout) if done.stdout.strip() else None
    return done.returncode, report, done.stderr, seconds
