"""The hostile-spec corpus: every file in tests/bad_specs/ and the exact message it must produce.

Each bad spec must give exit code 2, one clear message naming the file, the
field and the fix, and no traceback; on stdout nothing from ``validate``, and from
``run`` the ``bad_spec`` document (issue 56: every stop of ``run`` prints one). The static ones are
caught by ``isoprobe validate`` without importing torch (a fraction of a second
each here); the ``run-*`` ones need the model built, so ``isoprobe run`` catches
them in its inspect child before any trial (tests/integration/test_bad_specs_run.py).
The corpus itself, each file's message, is tests/support/bad_spec_corpus.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bad_spec_corpus import BAD, NEEDS_THE_MODEL, STATIC, assert_refused
from conftest import cli, run_cli


def test_the_corpus_is_complete():
    files = {p.name for p in BAD.glob("*.yaml")}
    assert files == {name for name, *_ in STATIC} | {name for name, _ in NEEDS_THE_MODEL}
    assert len(files) >= 30


@pytest.mark.parametrize(("name", "first_line", "fix"), STATIC, ids=[row[0] for row in STATIC])
def test_static_bad_spec_is_refused_with_its_message(name, first_line, fix):
    path = BAD / name
    assert_refused(cli("validate", str(path)), path, first_line.replace("{here}", str(BAD)), fix)


def test_the_srun_launcher_outside_a_slurm_allocation_is_refused_before_anything_runs(tmp_path):
    """distributed.launcher srun needs a job to step in: without SLURM_JOB_ID, exit 2 before any child starts."""
    import json

    from conftest import MODELS

    path = tmp_path / "srun-outside.yaml"
    path.write_text(json.dumps({"model": {"factory": f"{MODELS}:memory_hog"}, "input": {"shape": [16]},
                                "target": {"classes": 4}, "device": "cpu",
                                "distributed": {"strategy": "ddp", "launcher": "srun"}}))
    run = run_cli("run", str(path), env={"SLURM_JOB_ID": "", "SLURM_JOBID": ""})  # run_cli adds to os.environ
    assert_refused(run, path, "distributed.launcher: srun: a job step needs a Slurm allocation, and SLURM_JOB_ID "
                    "is not set", "run isoprobe inside the job", document=True)
    assert "checking the environment" not in run.stderr  # refused before the environment check's child


def _gang_spec(tmp_path: Path, name: str, **top) -> Path:
    import json

    from conftest import MODELS

    path = tmp_path / name
    path.write_text(json.dumps({"model": {"factory": f"{MODELS}:memory_hog"}, "input": {"shape": [16]},
                                "target": {"classes": 4}, "device": "cpu", **top}))
    return path


@pytest.mark.parametrize("launcher, nodes", [("srun", "1"), ("auto", "2")])
def test_the_srun_launcher_without_slurms_clients_on_path_is_refused_before_the_environment_check(
        tmp_path, launcher, nodes):
    """Issue 34: srun asked for (or chosen by auto in a two-node job) where srun is not on PATH was found only when
    the first trial's step started, after the environment check (28 s there), as exit 4. The parent can look it up
    without torch: exit 2 before any child, naming the field and the fix."""
    path = _gang_spec(tmp_path, f"srun-{launcher}.yaml", distributed={"strategy": "ddp", "launcher": launcher})
    run = cli("run", str(path), env={"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": nodes, "PATH": str(tmp_path)})
    assert_refused(run, path, "distributed.launcher: srun", "run isoprobe where Slurm's client commands", document=True)
    assert "srun, scancel, squeue are not on PATH here" in run.stderr
    assert ("auto chose srun: job 77 has 2 nodes" in run.stderr) == (launcher == "auto")
    assert "checking the environment" not in run.stderr


def test_a_cpu_gang_the_machines_ram_cannot_hold_is_refused_before_the_environment_check(tmp_path):
    """The other precondition of the class: a CPU gang whose budgets add up past 80 % of the RAM needs no torch to
    see, but was refused only after the environment check. Now before any child."""
    path = _gang_spec(tmp_path, "gang-ram.yaml", memory_budget="1000TiB",
                      distributed={"strategy": "ddp", "world_size": 2, "launcher": "local"})
    run = cli("run", str(path))
    assert_refused(run, path, "distributed.world_size: 2 ranks of 1024000.00 GiB each need",
                    "lower distributed.world_size or memory_budget", document=True)
    assert "checking the environment" not in run.stderr
