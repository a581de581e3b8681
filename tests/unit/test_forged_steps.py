"""Only lines of the trial's own processes, in the shim's order, are a command trial's steps (issue 47, forged:
a script that wrote step lines into the trial's folder was credited with batch 400 where 162 is the edge)."""

from __future__ import annotations

import os
import subprocess
import sys

from isoprobe.child.command_trial import supervisor
from isoprobe.child.command_trial import tree as command_tree  # noqa: E402
from isoprobe.child.command_trial import verdicts as command_verdicts
from isoprobe.protocol.wiring import SHIM_DIR_ENV

from test_command_shim import hello, step, write_lines


def sleeper(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def test_a_process_is_of_the_trial_when_its_environment_names_the_trials_folder(tmp_path):
    ours = sleeper({**os.environ, SHIM_DIR_ENV: str(tmp_path)})
    theirs = sleeper({k: v for k, v in os.environ.items() if k != SHIM_DIR_ENV})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        for pid in (ours.pid, theirs.pid, gone.pid):
            write_lines(tmp_path, pid, hello(), step(1, 100), step(2, 100))
        tree = command_tree.Tree(tmp_path)
        tree.read()
        assert [p.pid for p in tree.ranks()] == [ours.pid]
        assert tree.forged() is None
    finally:
        ours.kill(), theirs.kill()


def test_another_nodes_process_is_taken_at_its_word_as_a_slurm_steps_task(tmp_path):
    write_lines(tmp_path, 4_000_001, {**hello(0, 2), "host": "not-" + os.uname().nodename}, step(1, 100))
    tree = command_tree.Tree(tmp_path)
    tree.read()
    assert [p.pid for p in tree.ranks()] == [4_000_001]


def test_steps_before_a_hello_are_dropped_and_a_second_hello_or_a_step_out_of_order_is_forgery(tmp_path):
    process = sleeper({**os.environ, SHIM_DIR_ENV: str(tmp_path)})
    try:
        write_lines(tmp_path, process.pid, step(1, 1), step(2, 1), step(3, 1))  # before its hello: not the shim's
        tree = command_tree.Tree(tmp_path)
        tree.read()
        assert tree.ranks() == [] and tree.forged() is None
        write_lines(tmp_path, process.pid, hello(), step(1, 100))
        tree.read()
        assert [len(p.steps) for p in tree.ranks()] == [1] and tree.forged() is None
        write_lines(tmp_path, process.pid, step(3, 100))  # step 2 never came
        tree.read()
        assert tree.forged() is not None
        error = command_verdicts.forged_error(tree.forged(), tmp_path)
        assert error.type == "CommandForgedLines" and "cannot have written" in error.message
    finally:
        process.kill()
