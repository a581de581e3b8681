"""Hook mode and the real probe under hostile conditions: a full log device, no space for a trial's files.

The probe keeps each trial's request, events and output files in a scratch
folder under TMPDIR; when TMPDIR is full, writing them raises ENOSPC out of the
probe. Without --fallback-batch-size that is one line, the stop's document and exit 4; with it, the
fallback and exit 0, even when the log is a full device too. A tiny tmpfs is
TMPDIR (mounting needs root, as the suite has in CI; skipped otherwise). Kept
to a few runs of the tiniest spec (tests/support/faults.py:faulty, capped).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from conftest import faulty_spec, run_cli


def _tiny_spec(tmp_path: Path) -> str:
    spec = faulty_spec("raise", at=10**6, trial_timeout=120)  # never reaches the fault: every trial fits
    spec["search"]["max_batch_size"] = 8
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_no_space_for_a_trials_files_is_one_line_and_exit_4_or_the_fallback(tmp_path, tiny_tmpdir):
    spec = _tiny_spec(tmp_path)
    plain = run_cli("run", spec, "--format", "json", env={"TMPDIR": str(tiny_tmpdir)}, timeout=300)
    assert plain.returncode == 4, plain.stderr
    assert "Traceback" not in plain.stderr
    assert "No space left on device" in plain.stderr.splitlines()[-1]
    assert plain.json["stop_reason"] == "error" and "No space left on device" in plain.json["message"]  # issue 56

    hook = run_cli("run", spec, "--format", "env", "--fallback-batch-size", "8", "--log", "/dev/full",
                   env={"TMPDIR": str(tiny_tmpdir)}, timeout=300)
    assert hook.returncode == 0, hook.stderr
    assert "Traceback" not in hook.stderr
    assert "export ISOPROBE_BATCH_SIZE=8" in hook.stdout.splitlines()
    assert "export ISOPROBE_FALLBACK=1" in hook.stdout.splitlines()
    assert "--log /dev/full: cannot write (No space left on device); the log stops here" in hook.stderr


def test_hook_mode_answers_when_its_log_is_a_full_device(tmp_path):
    run = run_cli("run", _tiny_spec(tmp_path), "--format", "env", "--fallback-batch-size", "2", "--log", "/dev/full",
                  timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    lines = run.stdout.splitlines()
    assert "export ISOPROBE_ANSWERED=1" in lines and "export ISOPROBE_MAX_BATCH_SIZE=8" in lines  # probed, capped
    assert not any("FALLBACK" in line for line in lines)
    assert run.stderr.count("--log /dev/full: cannot write") == 1  # said once, then the log is left alone
    assert "isoprobe: trial " in run.stderr  # the progress still reaches stderr
