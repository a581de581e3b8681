"""Stopping a child is bounded: a keeper that does not end its tree when told is killed from the parent.

Real processes (a keeper over ``sleep``), no torch. The autouse fixture
(conftest.no_leftover_processes) fails a test that leaves any of them behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from isoprobe.errors import ProbeError
from isoprobe.executors import Conditions
from isoprobe.system import keeper, primitives
from isoprobe.executors import child_process
from isoprobe.executors.child_process import StartedChild, stop_child
from isoprobe.system.primitives import alive


def _kept_sleep(tmp_path: Path) -> StartedChild:
    """``sleep 600`` under a real keeper whose lifeline this test holds, as ``LocalExecutor._spawn`` starts one."""
    read, write = os.pipe()
    process = subprocess.Popen(keeper.command(read, [shutil.which("sleep"), "600"]), pass_fds=(read,), start_new_session=True,
                               stdin=subprocess.DEVNULL)
    os.close(read)
    return StartedChild(process, write, tmp_path / "e.jsonl", tmp_path / "e.stderr", Conditions(backend="cpu"),
                        warm=False)



def _below(pid: int) -> list[int]:
    return [child for child, _ in primitives.descendants(pid)]


def test_a_stopped_keeper_is_killed_with_its_tree_after_the_bound_not_waited_for_for_ever(tmp_path, monkeypatch):
    monkeypatch.setattr(child_process, "STOP_SECONDS", 0.5, raising=False)
    child = _kept_sleep(tmp_path)
    deadline = time.monotonic() + 30
    while not _below(child.process.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    trial = _below(child.process.pid)
    assert trial, "the keeper did not start its child"
    os.kill(child.process.pid, signal.SIGSTOP)  # a stopped keeper does not see its lifeline close
    stop_child(child)
    assert child.process.returncode == -signal.SIGKILL  # killed from here
    for pid in trial:  # its child went with it (SIGKILL, and PDEATHSIG besides): gone, or dead and not yet reaped
        assert not alive(pid), pid


def test_a_keeper_that_ends_its_tree_when_told_is_only_reaped(tmp_path):
    child = _kept_sleep(tmp_path)
    stop_child(child)
    assert child.process.returncode == -signal.SIGKILL  # exits as its child did: killed by the keeper
    assert child.lifeline_write == -1


def test_a_child_that_cannot_be_ended_at_all_is_an_error_not_a_hang(tmp_path, monkeypatch):
    class Unending:
        pid = os.getpid()  # never killed: _kill_tree is replaced below
        stdin = None

        def wait(self, timeout):
            raise subprocess.TimeoutExpired("unending", timeout)

    monkeypatch.setattr(child_process, "_kill_tree", lambda pid: None)
    read, write = os.pipe()
    os.close(read)
    child = StartedChild(Unending(), write, tmp_path / "e", tmp_path / "s", Conditions(backend="cpu"), warm=False)
    with pytest.raises(ProbeError, match="did not end"):
        stop_child(child, seconds=0.01)
