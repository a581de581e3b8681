"""Ctrl-C and SIGTERM in the middle of a trial: partial result, right exit code, no child left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, faulty_spec, hog_spec, wait_for as _wait_for


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def hanging_after_first_trial() -> dict:
    return faulty_spec("hang", at=3, trial_timeout=300)


@pytest.mark.parametrize(("signum", "code", "reason"), [(signal.SIGINT, 130, "interrupted"),
                                                         (signal.SIGTERM, 143, "terminated")])
def test_signal_mid_trial_kills_the_child_and_prints_the_trials_so_far(write_spec, signum, code, reason):
    # Batch 2 fits; every larger batch hangs until killed. So the signal always lands mid-trial,
    # however few trials the search needs (a spec that merely runs long races with the search).
    path = write_spec(hanging_after_first_trial())
    process = subprocess.Popen(
        [sys.executable, "-m", "isoprobe", "run", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    # Wait for the first finished trial, then for the next child to be running.
    deadline = time.monotonic() + 120
    seen_trial = False
    while time.monotonic() < deadline and not seen_trial:
        line = process.stderr.readline()
        seen_trial = line.startswith("isoprobe: trial ")
    assert seen_trial, "no trial finished in time"
    children = []
    while time.monotonic() < deadline and not children:
        children = _children_of(process.pid)
        time.sleep(0.05)
    assert children, "no child process was running"

    sent = time.monotonic()
    process.send_signal(signum)
    while any(_alive(pid) for pid in children) and time.monotonic() - sent < 5:
        time.sleep(0.02)
    gone_after = time.monotonic() - sent
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == code
    assert not any(_alive(pid) for pid in children), "a trial's process outlived the interrupt"
    assert gone_after < 2.0, f"the trial's group took {gone_after:.2f} s to die"

    result = json.loads(stdout)
    assert result["stop_reason"] == reason
    assert result["answered"] is False
    assert len(result["trials"]) >= 1


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        children = _children_of(frontier.pop())
        found += children
        frontier += children
    return found


def _grandchild_sleeping_under(pid: int) -> list[int]:
    """The whole tree under ``pid`` once the trial's hanging grandchild (``sleep 1000``) exists, else []."""
    tree = _descendants(pid)
    for member in tree:
        try:
            if open(f"/proc/{member}/cmdline", "rb").read().split(b"\0")[:2] == [b"sleep", b"1000"]:
                return tree
        except OSError:
            continue
    return []


def _hanging_grandchild_spec(write_spec):
    from conftest import FAULTS

    spec = hog_spec(start_batch_size=2, max_batch_size=2)
    spec["model"] = {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": "grandchild_hang", "at": 2}}
    spec["input"] = {"shape": [16]}
    spec["target"] = {"classes": 4}
    return write_spec(spec)


def test_sigkill_to_the_parent_leaves_no_child_nor_grandchild(write_spec):
    path = _hanging_grandchild_spec(write_spec)
    process = subprocess.Popen(
        [sys.executable, "-m", "isoprobe", "run", str(path)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    # The trial child and its hanging grandchild (sleep), both under isoprobe.
    tree = _wait_for(lambda: _grandchild_sleeping_under(process.pid), 60)
    assert len(tree) >= 2, f"no trial with a grandchild appeared: {tree}"
    process.kill()
    process.wait()
    killed = time.monotonic()
    _wait_for(lambda: not any(_alive(pid) for pid in tree), 5)
    survivors = [pid for pid in tree if _alive(pid)]
    assert not survivors, f"survived the parent's SIGKILL: {survivors}"
    assert time.monotonic() - killed < 3


def test_as_pid_1_in_a_fresh_pid_namespace_sigterm_stops_cleanly(write_spec):
    if os.geteuid() != 0 or subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"]).returncode:
        pytest.skip("needs root and unshare --pid")
    path = _hanging_grandchild_spec(write_spec)
    outer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "isoprobe", "run", str(path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    # unshare's child is isoprobe, PID 1 inside the namespace; wait until its trial (and grandchild) run.
    isoprobe = _wait_for(lambda: (_children_of(outer.pid) or [None])[0], 30)
    assert isoprobe, "isoprobe did not start"
    tree = _wait_for(lambda: _grandchild_sleeping_under(isoprobe), 60)
    assert tree, "no trial with a grandchild started"
    with open(f"/proc/{isoprobe}/status") as status:
        assert "NSpid:" in (line := next(l for l in status if l.startswith("NSpid:"))) and line.split()[-1] == "1"
    sent = time.monotonic()
    os.kill(isoprobe, signal.SIGTERM)
    stdout, stderr = outer.communicate(timeout=30)
    took = time.monotonic() - sent
    assert outer.returncode == 143, stderr
    assert stdout, stderr
    assert json.loads(stdout)["stop_reason"] == "terminated"
    assert took < 5, stderr
    assert not any(_alive(pid) for pid in tree)


def test_sigterm_during_the_environment_check_still_prints_one_json_document(write_spec):
    process = subprocess.Popen(
        [sys.executable, "-m", "isoprobe", "run", str(write_spec(hog_spec()))],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert _wait_for(lambda: _children_of(process.pid), 30), "the inspect child did not start"
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    result = json.loads(stdout)
    assert result["stop_reason"] == "terminated" and result["trials"] == []


def test_a_signal_while_the_first_spare_starts_still_gives_one_json_document(tmp_path, monkeypatch):
    # The spare is started with SIGINT/SIGTERM held (executors.processes.signals_deferred); a signal that
    # came meanwhile lands as the start ends. Raised right there, it must still end in a result document.
    from isoprobe.errors import Terminated
    from isoprobe.executors.local import LocalExecutor
    from isoprobe.report.output import Reporter
    from isoprobe.pipeline.pipeline import run_probe
    from isoprobe.spec.load import load_spec

    prestarted = []

    def signal_lands(self, conditions):
        prestarted.append(conditions)
        raise Terminated()

    monkeypatch.setattr(LocalExecutor, "prestart", signal_lands)
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(hog_spec()))
    result = run_probe(load_spec(path), str(path), Reporter(lambda line: None))
    assert result.stop_reason.value == "terminated" and result.trials == []
    assert [c.backend for c in prestarted] == ["cpu"]  # it landed at the first start, before the environment check
