"""Every exit path of a real ``isoprobe run`` on the CPU prints one document in the format asked (issue 56, item 2).

The bug: with ``--format json``, a stop outside the probe's own results (a bad spec, a ``ProbeError``, a signal
before the first trial) exited with nothing on stdout, and a hook or a pipeline that parses stdout had nothing to
parse. Here each path runs as a user runs it (``python -m isoprobe run``), and stdout is checked against the
published schema (docs/result.schema.json) or, with ``--format env``, evaluated by a shell: ``ISOPROBE_ANSWERED=0``,
``ISOPROBE_STOP_REASON`` and no ``ISOPROBE_BATCH_SIZE``. A SIGTERM's document must come within a few seconds (Slurm
kills a job KillWait seconds after its SIGTERM: 30 by default). In-process checks of the same paths (a lost step
daemon's ProbeError with its trials, a bug in isoprobe) are tests/cli/test_every_stop_prints.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jsonschema
import pytest

from conftest import FAULTS, REPO, faulty_spec, run_cli, wait_for
from signalled import children_of

SCHEMA = json.loads((REPO / "docs" / "result.schema.json").read_text(encoding="utf-8"))
#: How long a SIGTERM's document may take here (2 busy cores shared with other work; measured 0.3 to 1 s).
PROMPT_SECONDS = 10.0


def document(stdout: str, reason: str) -> dict:
    result = json.loads(stdout)
    jsonschema.validate(result, SCHEMA)
    assert result["stop_reason"] == reason and result["answered"] is False, result["message"]
    return result


def evaluated(stdout: str) -> dict[str, str]:
    """The variables ``eval "$(isoprobe run ... --format env)"`` leaves in a POSIX shell (dash where there is one)."""
    shell = shutil.which("dash") or shutil.which("sh")
    names = ("ISOPROBE_ANSWERED", "ISOPROBE_STOP_REASON", "ISOPROBE_BATCH_SIZE")
    script = 'eval "$L"; ' + "; ".join(f'printf "%s\\n" "${name}"' for name in names)
    done = subprocess.run([shell, "-c", script], env={"L": stdout}, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    return dict(zip(names, done.stdout.splitlines()))


def assert_stop_variables(stdout: str, reason: str) -> None:
    assert evaluated(stdout) == {"ISOPROBE_ANSWERED": "0", "ISOPROBE_STOP_REASON": reason, "ISOPROBE_BATCH_SIZE": ""}


def nothing_fits() -> dict:
    """Batch 2, the start, is above the faulty model's edge 1: out of memory at once (exit 3)."""
    return {"model": {"factory": f"{FAULTS}:faulty", "kwargs": {"fault": "raise", "at": 1000, "edge": 1}},
            "input": {"shape": [16]}, "target": {"classes": 4}, "optimizer": {"name": "sgd"},
            "search": {"start_batch_size": 2, "steps": 2, "trial_timeout": 120, "estimate": False},
            "device": "cpu", "memory_budget": "2GiB"}


def check_stopped() -> dict:
    """The environment check builds the model for 2 s under a 0.05 s timeout: a ProbeError (exit 4)."""
    spec = faulty_spec("raise", at=10**6, trial_timeout=0.05, build_seconds=2.0)
    spec["search"]["max_batch_size"] = 8
    return spec


@pytest.mark.parametrize("fmt", ["json", "env"])
def test_a_bad_spec_exit_2(write_spec, fmt):
    run = run_cli("run", str(write_spec({**nothing_fits(), "bogus": 1})), "--format", fmt)
    assert run.returncode == 2, run.stderr
    if fmt == "json":
        assert "unknown field 'bogus'" in document(run.stdout, "bad_spec")["message"]
    else:
        assert_stop_variables(run.stdout, "bad_spec")


def test_nothing_fits_exit_3(write_spec):
    run = run_cli("run", str(write_spec(nothing_fits())), "--format", "json", timeout=300)
    assert run.returncode == 3, run.stderr
    assert document(run.stdout, "start_does_not_fit")["trials"]


@pytest.mark.parametrize("fmt", ["json", "env"])
def test_a_probe_error_exit_4(write_spec, fmt):
    """Before: exit 4, the message on stderr only, nothing on stdout."""
    run = run_cli("run", str(write_spec(check_stopped())), "--format", fmt, timeout=300)
    assert run.returncode == 4, run.stderr
    said = "the environment check (a child process) was stopped after search.trial_timeout (0.05 s)"
    assert said in run.stderr.splitlines()[-1]  # said on stderr as before
    if fmt == "json":
        assert document(run.stdout, "error")["message"].startswith(said)
    else:
        assert_stop_variables(run.stdout, "error")


def start(path, *options: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "isoprobe", "run", str(path), *options], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def wait_for_line(process: subprocess.Popen, text: str, timeout: float = 180) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(process.stderr.readline())
        if not seen[-1] or text in seen[-1]:
            break
    assert text in seen[-1], "".join(seen)
    return seen


@pytest.mark.parametrize(("signum", "code", "reason", "fmt"), [(signal.SIGTERM, 143, "terminated", "json"),
                                                                (signal.SIGINT, 130, "interrupted", "env")])
def test_a_signal_mid_trial_prints_the_trials_so_far_within_seconds(write_spec, signum, code, reason, fmt):
    """Batch 2 fits; every larger batch hangs: the signal lands mid-trial 2. The time from the signal to the
    document is what a job has of Slurm's KillWait."""
    process = start(write_spec(faulty_spec("hang", at=3, trial_timeout=300)), "--format", fmt)
    try:
        wait_for_line(process, "isoprobe: trial ")
        assert wait_for(lambda: children_of(process.pid), 30), "the next trial's child did not start"
        sent = time.monotonic()
        process.send_signal(signum)
        stdout = process.stdout.read()  # until isoprobe closes it: the document is out
        took = time.monotonic() - sent
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert process.returncode == code
    assert took < PROMPT_SECONDS, f"the document came {took:.1f} s after the signal"
    if fmt == "json":
        assert [t["outcome"] for t in document(stdout, reason)["trials"]] == ["fits"]
    else:
        assert_stop_variables(stdout, reason)


def test_a_sigterm_while_waiting_for_another_probes_answer_prints_its_document(write_spec, tmp_path):
    """Two jobs of one setup: the second waits on the cache's lock for the first one's answer. A SIGTERM there (the
    second job's time limit) came before any trial of its own: before, exit 143, one line and no document."""
    path = write_spec(faulty_spec("hang", at=3, trial_timeout=300))
    shared = {"ISOPROBE_CACHE_DIR": str(tmp_path / "cache")}
    first = start(path, "--format", "json", env=shared)
    second = None
    try:
        wait_for_line(first, "isoprobe: trial ")  # the first holds the key's lock and probes
        second = start(path, "--format", "json", env=shared)
        wait_for_line(second, "another isoprobe is probing this setup")
        sent = time.monotonic()
        second.send_signal(signal.SIGTERM)
        stdout = second.stdout.read()
        took = time.monotonic() - sent
        second.wait(timeout=30)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (first, second):
            if process is not None:
                process.communicate(timeout=60)
    assert second.returncode == 143
    assert took < PROMPT_SECONDS, f"the document came {took:.1f} s after the signal"
    result = document(stdout, "terminated")
    assert result["message"] == "stopped by SIGTERM before the first trial" and result["trials"] == []
    assert first.returncode == 143  # the first, stopped after the test, printed its own
