"""Ctrl-C and SIGTERM in the middle of a trial: partial result, right exit code, no child left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, hog_spec

pytestmark = pytest.mark.integration


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


@pytest.mark.parametrize(("signum", "code", "reason"), [(signal.SIGINT, 130, "interrupted"),
                                                         (signal.SIGTERM, 143, "terminated")])
def test_signal_mid_trial_kills_the_child_and_prints_the_trials_so_far(write_spec, signum, code, reason):
    path = write_spec(hog_spec(start_batch_size=2))
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
    stdout, _ = process.communicate(timeout=30)
    assert process.returncode == code
    while any(_alive(pid) for pid in children) and time.monotonic() - sent < 5:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children), "a trial's process outlived the interrupt"
    assert time.monotonic() - sent < 5

    result = json.loads(stdout)
    assert result["stop_reason"] == reason
    assert result["answered"] is False
    assert len(result["trials"]) >= 1
