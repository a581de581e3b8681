"""The processes' primitives (``system.primitives``), each with its one definition: a process's state from /proc,
the scheduler autogroup, and Slurm's clients bounded and never raising.

Slurm's clients are stand-in scripts on PATH: one that hangs is what a busy slurmctld looks like to a caller. Before
the primitives were one module, the gang executor's ``scancel`` and the step wait's ``squeue`` waited 30 s and then
raised ``TimeoutExpired`` into the probe (and into the keeper's stop, before it could exit as its child did).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from isoprobe.system import primitives


def _client(folder, name: str, body: str) -> str:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_a_processes_state_and_parent_come_from_proc_and_a_zombie_is_not_alive():
    assert primitives.state_of(os.getpid()) == ("R", os.getppid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while (primitives.state_of(child.pid) or ("",))[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert primitives.state_of(child.pid) == ("Z", os.getpid())  # ended, not reaped
    assert not primitives.alive(child.pid)
    child.wait()
    assert primitives.state_of(child.pid) is None and not primitives.alive(child.pid)


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path):
    """The state is the field after the last ``)``: a process may name itself ``a) b (c``."""
    script = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'a) S 1 (c', 0, 0, 0); print(1, flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"1\n"
        with open(f"/proc/{child.pid}/comm") as handle:
            assert handle.read().strip() == "a) S 1 (c"
        deadline = time.monotonic() + 10
        while (primitives.state_of(child.pid) or ("",))[0] != "S" and time.monotonic() < deadline:
            time.sleep(0.01)  # from its print to its sleep
        assert primitives.state_of(child.pid) == ("S", os.getpid())
        assert (child.pid, "S") in primitives.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_the_autogroup_is_read_only_for_a_session_leader():
    """An autogroup is a session: a process that does not lead its own must never change the one it shares."""
    script = "import sys; sys.path[:0] = [{!r}]; from isoprobe.system import primitives; print(primitives.autogroup_nice())"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(primitives.__file__))))
    shared = subprocess.run([sys.executable, "-c", script.format(root)], capture_output=True, text=True, timeout=30)
    own = subprocess.run([sys.executable, "-c", script.format(root)], capture_output=True, text=True, timeout=30,
                         start_new_session=True)
    assert shared.stdout.strip() == "None", shared.stderr
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("no scheduler autogroups on this kernel")
    assert own.stdout.strip() == "0", own.stderr  # a new session's autogroup starts at 0


def test_a_hung_scancel_is_given_up_on_within_its_bound_and_never_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(primitives, "CLIENT_SECONDS", 0.3)
    scancel = _client(tmp_path, "scancel", "exec sleep 30")
    began = time.monotonic()
    primitives.scancel_now(scancel, "7.0")
    primitives.cancel_slurm_steps(["7.0"], scancel)
    assert time.monotonic() - began < 5


def test_a_squeue_that_does_not_answer_says_nothing_and_the_wait_goes_on_to_its_end(tmp_path, monkeypatch):
    """Unknown is not gone: the steps still count as listed, and the caller hears so at the end of its wait."""
    monkeypatch.setattr(primitives, "CLIENT_SECONDS", 0.2)
    squeue = _client(tmp_path, "squeue", "exec sleep 30")
    scancel = _client(tmp_path, "scancel", f"echo \"$@\" >> {tmp_path}/cancelled")
    began = time.monotonic()
    left = primitives.wait_slurm_steps_gone(["7.0"], 1.0, recancel_after=0.1, recancel_every=0.3, squeue=squeue,
                                            scancel=scancel)
    assert left == ["7.0"] and time.monotonic() - began < 5
    assert "--ctld --signal=KILL 7.0" in (tmp_path / "cancelled").read_text()  # asked again meanwhile


def test_a_squeue_that_no_longer_lists_the_step_ends_the_wait_at_once(tmp_path):
    squeue = _client(tmp_path, "squeue", "echo 8.0")
    began = time.monotonic()
    assert primitives.wait_slurm_steps_gone(["7.0"], 10, recancel_after=1, recancel_every=1, squeue=squeue) == []
    assert time.monotonic() - began < 5
