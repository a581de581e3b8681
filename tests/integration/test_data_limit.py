"""Issue 34: isoprobe under a hard data limit (``ulimit -d``) it cannot raise, with real processes.

A user's shell (or batch system) can set RLIMIT_DATA's hard limit; an unprivileged process can lower its
limits but never raise the hard one. Trials once asked for a hard limit 64 MiB above the budget (the room to
credit isoprobe's own modules), so with ``ulimit -d`` at the budget every trial's start failed in its
``preexec_fn`` (exit 1, a traceback, no JSON), and ``IsolatedBatchSizeFinder`` with it. Each test runs its
process without CAP_SYS_RESOURCE (``setpriv``, where the suite runs as root), as a user's would: with the
capability, raising the hard limit succeeds and the failure cannot show.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, SUPPORT


LIMIT = 2 * 1024**3


def unprivileged(command: list[str]) -> list[str]:
    """``command`` without the capability that lets a process raise its hard limits (root has it)."""
    if os.geteuid() != 0:
        return command
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: the hard limit could be raised, the failure cannot show")
    return ["setpriv", "--bounding-set=-sys_resource", "--inh-caps=-sys_resource", *command]


def run_limited(code: str, hard: int = LIMIT) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python whose RLIMIT_DATA is (hard, hard), as ``ulimit -d`` leaves it."""
    script = f"import resource; resource.setrlimit(resource.RLIMIT_DATA, ({hard}, {hard}))\n" + textwrap.dedent(code)
    return subprocess.run(unprivileged([sys.executable, "-c", script]), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_spawned_trial_is_capped_at_the_inherited_hard_limit_not_above_it():
    """The local executor's start (``processes.prepare_child``): the child gets (budget, budget) where the
    inherited hard limit is the budget. Before: SubprocessError 'Exception occurred in preexec_fn'."""
    done = run_limited(f"""
        import os, resource, subprocess, sys
        from isoprobe.executors.processes import prepare_child
        child = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_DATA))"],
                               preexec_fn=prepare_child({LIMIT}, os.getpid()), capture_output=True, text=True)
        print(child.stdout.strip())
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"({LIMIT}, {LIMIT})"


def test_a_forked_trial_caps_itself_at_the_inherited_hard_limit_too():
    """The same class, on the fork server's path (``memory.set_data_cap``, run in each fork): before, ValueError
    'not allowed to raise maximum limit'. A budget below the limit keeps its 64 MiB of room above it where the
    limit allows some: here 32 MiB."""
    below = LIMIT - 32 * 1024**2
    done = run_limited(f"""
        import resource
        from isoprobe.system.data_cap import set_data_cap
        set_data_cap({LIMIT})
        print(resource.getrlimit(resource.RLIMIT_DATA))
        set_data_cap({below})
        print(resource.getrlimit(resource.RLIMIT_DATA))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == [f"({LIMIT}, {LIMIT})", f"({below}, {LIMIT})"]


SPEC = f"""\
model: {{factory: {SUPPORT / 'faults.py'}:faulty, kwargs: {{fault: none, at: 100}}}}
input: {{shape: [16]}}
target: {{classes: 4}}
optimizer: {{name: sgd}}
search: {{start_batch_size: 4, max_batch_size: 4, steps: 2, steady_steps: 0, confirmations: 0, estimate: false}}
device: cpu
recommendation: {{soak_steps: 0}}
"""


def run_cli_limited(tmp_path, *arguments: str) -> subprocess.CompletedProcess:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    command = ["prlimit", f"--data={LIMIT}:{LIMIT}", sys.executable, "-m", "isoprobe", "run", str(spec), "--no-cache",
               *arguments]
    return subprocess.run(unprivileged(command), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux's prlimit")
def test_isoprobe_run_with_the_budget_at_ulimit_d_answers_and_says_what_the_limit_costs(tmp_path):
    """The issue's case through ``isoprobe run``: one trial (the cap, 4) under a budget equal to the hard limit.
    Before: exit 1, 'Exception occurred in preexec_fn', no JSON."""
    done = run_cli_limited(tmp_path, "--memory-budget", str(LIMIT))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["max_batch_size"] == 4
    assert "hard data limit (ulimit -d, 2.00 GiB) leaves no room above the budget" in done.stderr


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux's prlimit")
def test_a_budget_above_ulimit_d_is_a_spec_error_before_any_trial(tmp_path):
    """A budget the trials cannot be given is refused (exit 2) naming memory_budget, the limit and the fix, before
    any trial, instead of every trial failing to start."""
    done = run_cli_limited(tmp_path, "--memory-budget", "3GiB")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "memory_budget" in done.stderr and "hard data limit (RLIMIT_DATA, ulimit -d) is 2.00 GiB" in done.stderr
    assert f"at most {LIMIT} bytes" in done.stderr and "Traceback" not in done.stderr
    assert "trial 1" not in done.stderr.lower()
