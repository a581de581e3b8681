"""A hook inside one of the probe's own trials does nothing, and a step whose ranks a TaskProlog holds is named
(issue 56: the TaskProlog of docs/slurm.md ran for every task of the probe's own trial steps, each started
``isoprobe run`` again and waited for the probe's own cache lock; no rank ever started, and after 2 x 120 s the probe
blamed the allocation).
"""

from __future__ import annotations

import os
import subprocess
import sys

from isoprobe.executors.processes import child_environment
from isoprobe.executors.srun_nodes import held_tasks, task_prolog_words
from isoprobe.protocol.wiring import TRIAL_ENV

from conftest import REPO


def test_every_trial_process_carries_the_probes_mark(tmp_path):
    env = child_environment({"PATH": "/bin"}, backend="cpu", allocator=None, events_path=tmp_path / "events")
    assert env[TRIAL_ENV] == str(os.getpid())


def test_a_hook_inside_a_trial_prints_nothing_and_succeeds_at_once():
    env = {**os.environ, TRIAL_ENV: "4242", "PYTHONPATH": str(REPO)}
    for form in ("taskprolog", "env"):
        done = subprocess.run([sys.executable, "-m", "isoprobe", "run", str(REPO / "specs" / "resnet50.yaml"),
                               "--format", form, "--fallback-batch-size", "16"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stdout) == (0, ""), done.stderr
        assert "inside a trial of probe 4242" in done.stderr


def _process(proc, pid: int, command: list[str], environ: dict[str, str]) -> None:
    folder = proc / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(word.encode() for word in command) + b"\0")
    (folder / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\0")


def test_the_tasks_a_prolog_holds_are_named_with_their_node(tmp_path):
    proc = tmp_path / "proc"
    step = {TRIAL_ENV: "77", "SLURM_STEP_ID": "3", "SLURM_JOB_ID": "9"}
    _process(proc, 101, ["/bin/sh", "/etc/slurm/isoprobe-taskprolog.sh"], {**step, "SLURMD_NODENAME": "n2"})
    _process(proc, 102, [sys.executable, "-m", "isoprobe.child.srun_rank", "x"], step)  # a rank that started
    _process(proc, 103, ["/bin/sh", "prolog"], {**step, TRIAL_ENV: "78"})             # another probe's
    _process(proc, 104, ["/bin/sh", "prolog"], {TRIAL_ENV: "77"})                     # no step: the probe's child
    (proc / "self").mkdir()
    assert held_tasks(77, str(proc)) == ["pid 101 on n2: /bin/sh /etc/slurm/isoprobe-taskprolog.sh"]
    assert task_prolog_words(os.getpid()) == ""  # this machine: no task holds a step of this process's
