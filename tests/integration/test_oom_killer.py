"""A trial SIGKILLed by the kernel's OOM killer is out of memory, told apart by the cgroup's counter.

Runs isoprobe inside a fresh memory cgroup (v1, as root) whose limit is below
what the trial needs, while the per-trial rlimit is far above it: the kernel
kills the trial with SIGKILL, silently, as it would on a real host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, hog_spec


MEMORY_V1 = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def memory_cgroup():
    if os.geteuid() != 0 or not (MEMORY_V1 / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup v1 memory controller")
    group = MEMORY_V1 / f"isoprobe-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group.mkdir()
    except OSError as error:
        pytest.skip(f"cannot create a memory cgroup here: {error}")
    (group / "memory.limit_in_bytes").write_text(str(int(1.5 * 1024**3)))
    yield group
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def test_oom_killer_sigkill_is_classified_as_out_of_memory_with_evidence(write_spec, memory_cgroup):
    spec = hog_spec(start_batch_size=64, max_batch_size=64)  # ~2 GiB of activations
    spec["memory_budget"] = "8GiB"  # the rlimit would allow it: only the cgroup stops it
    path = write_spec(spec)
    script = f'echo $$ > {memory_cgroup}/cgroup.procs && exec "{sys.executable}" -m isoprobe run "{path}"'
    done = subprocess.run(["sh", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout)
    [trial] = result["trials"]
    assert trial["signal"] == "SIGKILL"
    assert trial["outcome"] == "out_of_memory"
    assert "oom_kill" in trial["reclassified"]
    assert result["stop_reason"] == "start_does_not_fit"
    assert int((memory_cgroup / "memory.oom_control").read_text().split("oom_kill ")[1].split()[0]) >= 1
