"""Gang steps started ahead (``search.warm_start`` with ``distributed.launcher: srun``), with real ranks under a
stand-in srun, on a machine without Slurm.

The stand-in does what Slurm 22.05's srun does for isoprobe's steps: it starts ``--ntasks`` copies of the entry with
``SLURM_PROCID``/``SLURM_STEP_ID`` set and their output in ``--output``/``--error``, forwards its stdin to every task
line by line with ``--input=all`` (none otherwise), kills the others when one exits badly, and exits when they all
have. The ranks are real: ``child.srun_rank`` and the child entry, a DDP gang over gloo. The two-node tier
(tests/slurm/test_two_nodes.py) runs the same steps on a real cluster.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from conftest import faulty_spec, marked_processes, wait_for


STAND_IN_SRUN = r'''#!PYTHON
import json, os, signal, subprocess, sys, threading, time
args = sys.argv[1:]
if "--overlap" in args and os.environ.get("STAND_IN_NO_OVERLAP"):
    sys.exit("srun: unrecognized option '--overlap'")  # as a Slurm before 20.11 would
entry = next(i for i, a in enumerate(args) if not a.startswith("--"))
options, entry = args[:entry], args[entry:]
tasks = int(next(a.split("=", 1)[1] for a in options if a.startswith("--ntasks=")))
with open(LOG, "a") as log:
    step = sum(1 for _ in open(LOG)) if os.path.exists(LOG) else 0
    log.write(json.dumps({"step": step, "options": options, "entry": entry}) + "\n")
out = next(a.split("=", 1)[1] for a in options if a.startswith("--output="))
err = next(a.split("=", 1)[1] for a in options if a.startswith("--error="))
forward = "--input=all" in options
procs = []
for rank in range(tasks):
    env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID="0", SLURM_JOB_ID="77", SLURM_STEP_ID=str(step),
               SLURMD_NODENAME=f"n{rank + 1}", SLURM_NTASKS=str(tasks))
    procs.append(subprocess.Popen(entry, env=env, stdin=subprocess.PIPE if forward else subprocess.DEVNULL,
                                  stdout=open(out.replace("%t", str(rank)), "wb"),
                                  stderr=open(err.replace("%t", str(rank)), "wb")))
def pump():
    for line in sys.stdin.buffer:
        for proc in procs:
            try:
                proc.stdin.write(line); proc.stdin.flush()
            except OSError:
                pass
    for proc in procs:
        try:
            proc.stdin.close()
        except OSError:
            pass
if forward:
    threading.Thread(target=pump, daemon=True).start()
while True:
    codes = [proc.poll() for proc in procs]
    if any(code not in (None, 0) for code in codes):
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        sys.exit(1)
    if all(code == 0 for code in codes):
        sys.exit(0)
    time.sleep(0.01)
'''


@pytest.fixture
def executor(tmp_path, monkeypatch):
    """A SrunGangExecutor with steps ahead, over the stand-in srun (and scancel, squeue that say nothing)."""
    from isoprobe.executors.local import LocalExecutor
    from isoprobe.executors.srun_gang import SrunGangExecutor

    monkeypatch.setenv("ISOPROBE_TEST_MARKER", f"srun-ahead-{os.getpid()}-{time.monotonic_ns()}")
    slurm = tmp_path / "bin"
    slurm.mkdir()
    (slurm / "srun").write_text(STAND_IN_SRUN.replace("PYTHON", sys.executable, 1)
                                .replace("LOG", repr(str(tmp_path / "srun.log")), 3))
    for name, body in (("scancel", "#!/bin/sh\nexit 0\n"), ("squeue", "#!/bin/sh\nexit 0\n")):
        (slurm / name).write_text(body)
    for program in slurm.iterdir():
        program.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    with SrunGangExecutor(LocalExecutor(workdir, warm=False), nodes=2, srun=str(slurm / "srun"),
                          scancel=str(slurm / "scancel"), squeue=str(slurm / "squeue"), ahead=True, world=2) as gang:
        yield gang
    marker = os.environ["ISOPROBE_TEST_MARKER"]
    assert wait_for(lambda: not marked_processes("ISOPROBE_TEST_MARKER", marker), 20), \
        marked_processes("ISOPROBE_TEST_MARKER", marker)  # nothing of either step outlives the executor


def _request(batch: int):
    from isoprobe.protocol.messages import TrialRequest
    from isoprobe.spec.model import Spec

    raw = faulty_spec("alloc", at=50, trial_timeout=60)
    raw["distributed"] = {"strategy": "ddp", "world_size": 2, "launcher": "srun"}
    return TrialRequest(spec=Spec.model_validate(raw), batch_size=batch, device="cpu")


def _conditions(limit: int = 2 * 2**30):
    from isoprobe.executors import Conditions

    return Conditions(backend="cpu", memory_limit=limit, threads=1)


def _steps(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]


def _fits(run) -> bool:
    from isoprobe.protocol.messages import Outcome, TrialResult, last_of

    return len(run.ranks) == 2 and all(last_of(r.events, TrialResult).outcome is Outcome.FITS for r in run.ranks)


def test_the_next_trial_runs_in_the_step_started_while_the_one_before_ran(executor, tmp_path):
    """Trial 1's step is started when it is due; the step of trial 2 is started beside it (--overlap, srun's stdin
    forwarded to its ranks), and its ranks were started before trial 2's requests were written (how far their imports
    got by then is the machine's: at idle priority, on a busy machine, not far). The step started
    ahead of a third trial that never comes is ended with the executor: its ranks read end of file."""
    first = executor.run(_request(2), _conditions(), timeout=60, name="trial001-b2")
    second = executor.run(_request(3), _conditions(), timeout=60, name="trial002-b3")
    assert _fits(first) and _fits(second), (first, second)
    steps = {Path(step["entry"][-3]).name: step for step in _steps(tmp_path)}  # by folder (STEP_DIR SOFT HARD)
    assert sorted(steps) == ["ahead001.step", "ahead002.step", "trial001-b2.step"], steps  # one ahead a trial
    assert "--overlap" not in steps["trial001-b2.step"]["options"]
    assert "--input=none" in steps["trial001-b2.step"]["options"]
    for name in ("ahead001.step", "ahead002.step"):
        assert {"--overlap", "--input=all"} <= set(steps[name]["options"]) and "--ahead" in steps[name]["entry"]
    folder = executor.local.workdir / "ahead001.step"
    assert json.loads((folder / "trial.json").read_text()) == {"trial": "trial002-b3", "batch_size": 3}
    requested = (folder / "rank0.request.json").stat().st_mtime
    started = [(folder / f"rank{rank}.task.json").stat().st_mtime for rank in (0, 1)]
    assert max(started) < requested, (started, requested)  # its ranks were running before trial 2 was due
    assert [rank.node for rank in second.ranks] == ["n1", "n2"]


def test_a_step_started_ahead_under_other_conditions_is_ended_and_not_used(executor, tmp_path):
    """The trial after it runs under another cap (as a memory check would): the step started ahead is ended, and the
    trial gets a step started for it."""
    assert _fits(executor.run(_request(2), _conditions(), timeout=60, name="trial001-b2"))
    assert _fits(executor.run(_request(3), _conditions(3 * 2**30), timeout=60, name="trial002-b3"))
    assert (executor.local.workdir / "trial002-b3.step" / "trial.json").exists()
    assert not (executor.local.workdir / "ahead001.step" / "trial.json").exists()  # never given a trial
    assert not (executor.local.workdir / "ahead001.step" / "rank0.request.json").exists()


def test_the_first_trials_step_starts_when_the_probe_announces_its_conditions(executor, tmp_path):
    """``prestart`` (the pipeline calls it before the environment check): the first trial's step is started then, and
    the first trial runs in it; announced again under other conditions, it is replaced."""
    executor.prestart(_conditions(3 * 2**30))
    executor.prestart(_conditions())  # the check saw otherwise: the first step is ended, another started
    assert _fits(executor.run(_request(2), _conditions(), timeout=60, name="trial001-b2"))
    work = executor.local.workdir
    assert not (work / "ahead001.step" / "trial.json").exists()
    assert json.loads((work / "ahead002.step" / "trial.json").read_text())["trial"] == "trial001-b2"
    assert not (work / "trial001-b2.step").exists()


def test_a_slurm_that_refuses_steps_ahead_costs_two_tries_then_none(executor, tmp_path, monkeypatch):
    """A Slurm without --overlap (or a site that forbids it) refuses every step started ahead: each trial still gets
    a step of its own and its answer; after two refused, no more are asked for."""
    monkeypatch.setenv("STAND_IN_NO_OVERLAP", "1")
    for trial, batch in enumerate((2, 3, 4, 5), start=1):
        assert _fits(executor.run(_request(batch), _conditions(), timeout=60, name=f"trial{trial:03d}-b{batch}"))
    work = executor.local.workdir
    assert sorted(path.name for path in work.glob("*.step")) == [
        "ahead001.step", "ahead002.step", "trial001-b2.step", "trial002-b3.step", "trial003-b4.step",
        "trial004-b5.step"]
    assert all((work / f"trial00{n}-b{n + 1}.step" / "trial.json").exists() for n in range(1, 5))
