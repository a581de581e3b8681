"""Signals sent to a real isoprobe command at a known moment: after its first trial, while the next one runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import REPO, wait_for


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if int(ppid) == pid and state != "Z":
            found.append(int(entry))
    return found


def signalled_after_first_trial(args: list[str], signums: list[int], spacing: float) -> tuple[int, str, str]:
    """Run ``isoprobe ARGS``; once a trial has finished and the next one's child runs, send ``signums``
    ``spacing`` seconds apart; then read stdout. Its exit code, stdout and stderr."""
    process = subprocess.Popen([sys.executable, "-m", "isoprobe", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline, seen = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            seen.append(process.stderr.readline())
            if not seen[-1] or "isoprobe: trial " in seen[-1]:  # a sweep prefixes its rows' lines
                break
        assert "isoprobe: trial " in seen[-1], "no trial finished: " + "".join(seen)
        assert wait_for(lambda: children_of(process.pid), 30), "the next trial's child did not start"
        for number, signum in enumerate(signums):
            if number:
                time.sleep(spacing)
            process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # a failed check above: nothing of it may outlive the test
            process.kill()
            process.communicate()
    return process.returncode, stdout, "".join(seen) + stderr
