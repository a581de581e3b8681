"""A script edited while the probe runs it (issue 55): the probe starts again from the start, with fresh processes,
and answers for one version; before, it answered from trials of two versions (exit 0, an answer of neither)."""

from __future__ import annotations

import hashlib
import shutil
import sys

from test_command import COMMANDS, LONG_RUN, left_behind, probe, scratch  # noqa: F401


def test_a_module_edited_between_two_trials_starts_the_probe_again_and_the_answer_is_of_one_version(tmp_path,
                                                                                                  scratch):
    for name in ("edits_its_module.py", "edited_module.py"):
        shutil.copy(COMMANDS / name, tmp_path / name)
    command = [sys.executable, str(tmp_path / "edits_its_module.py"), "--batch-size", "{batch_size}", "--max-steps",
               LONG_RUN]
    done = probe(scratch, command, "--memory-budget", "1GiB", "--set", "search.max_batch_size=8",
                 "--set", "search.steady_steps=0", "--set", "recommendation.soak_steps=0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{tmp_path / 'edited_module.py'} changed while the probe ran" in done.stderr
    assert "probing again from the start" in done.stderr
    result = done.json
    assert result["max_batch_size"] == 8
    assert int((tmp_path / "runs").read_text()) > len(result["trials"])  # the first probe's trials ran too
    edited = (tmp_path / "edited_module.py").read_bytes()
    assert result["sources"][str(tmp_path / "edited_module.py")] == hashlib.sha256(edited).hexdigest()
    assert left_behind(str(scratch)) == []
