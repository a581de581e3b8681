"""search.parallel: 2 on the CPU backend with real children: a signal mid-round that keeps the round's ended
trial (issue 25). The same answer as one slot (issue 17): tests/integration/test_probe_cpu.py, on its edge probe.

Wall time is measured by benchmarks, not asserted here (two trials share the machine's two cores)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from conftest import REPO, _descendants, fault_spec, wait_for


@pytest.mark.parametrize(("signum", "code", "reason"), [(signal.SIGINT, 130, "interrupted"),
                                                         (signal.SIGTERM, 143, "terminated")])
def test_a_signal_mid_round_keeps_the_trial_that_had_ended_and_its_line_came_first(write_spec, signum, code, reason):
    # Round 1 is [7, 8] (start 7, cap 8): 7 fits in seconds, 8 hangs until killed (its timeout: 300 s). So the
    # signal lands while the round still runs, after 7 ended.
    path = write_spec(fault_spec("hang", timeout=300, parallel=2))
    process = subprocess.Popen([sys.executable, "-m", "isoprobe", "run", str(path), "--no-cache"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)  # stderr, line by line
    reader.start()
    try:
        trial_line = wait_for(lambda: next((l for l in lines if re.match(r"isoprobe: trial +1 +batch +7 +fits", l)),
                                           None), 120)
        assert trial_line, "the ended trial's line did not come while its round ran:\n" + "".join(lines)
        assert any("2 slots: up to 2 trials at once" in line for line in lines)
        assert _descendants(process.pid), "the round's other trial was not running"
        assert process.poll() is None
        process.send_signal(signum)
        stdout = process.stdout.read()
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=5)
    assert process.returncode == code, "".join(lines)
    result = json.loads(stdout)
    assert (result["stop_reason"], result["answered"]) == (reason, False)
    assert [(t["index"], t["batch_size"], t["purpose"], t["outcome"]) for t in result["trials"]] == [
        (1, 7, "search", "fits")]
    # What was proven so far, and no more: 7 fit (once, unconfirmed: not answered); nothing has failed.
    assert (result["max_batch_size"], result["first_failing_batch_size"]) == (7, None)
