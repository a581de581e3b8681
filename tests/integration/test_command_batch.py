"""A command that does not train at the batch it is given is refused, not credited (issue 47, 'credited a batch
the script did not train at'): real scripts under ``isoprobe run -- COMMAND``, CPU backend, 1 GiB.

Why: a script that ignores ``{batch_size}`` answered "batch 16777216 fits", and scripts with their own finders
(Accelerate's ``find_executable_batch_size``, a halving loop) answered batches they never trained at. Each case
here is tests/commands/not_its_batch.py in one of its modes; the probe must stop at the first trial that shows it
(issue 56: a trial whose model took no more input than one at half its batch, or less), exit 4 (an error, not
an answer, and no earlier trial credited either) and say what the script trained at instead.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, run_cli


SCRIPT = REPO / "tests" / "commands" / "not_its_batch.py"


@pytest.fixture
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="ip-batch-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("mode, start, trained", [
    ("fixed", None, "[24, 3, 64, 64]"),       # ignores the argument: the second trial shows it
    ("halving", "4096", ", 3, 64, 64]"),        # catches its out-of-memory error and halves
    ("accelerate", "4096", ", 3, 64, 64]"),   # Accelerate's finder: 90 % steps, wherever they end
])
def test_a_command_that_trains_another_batch_is_refused_and_says_what_it_trained(scratch, mode, start, trained):
    options = ["--set", f"search.start_batch_size={start}"] if start else []
    done = run_cli("run", "--no-cache", "--format", "json", "--memory-budget", "1GiB", *options, "--",
                   sys.executable, str(SCRIPT), "--mode", mode, "--batch-size", "{batch_size}", timeout=600,
                   cwd=REPO, env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 4, done.stderr[-3000:]
    result = done.json
    assert result["max_batch_size"] is None and result["recommended_batch_size"] is None
    [trial] = [t for t in result["trials"] if t["outcome"] == "error"]
    assert trial["error"]["type"] == "CommandBatchNotTrained"
    # Found within three trials: the second trial at twice the first, or the check at a quarter of the first.
    assert len(result["trials"]) <= 3, [(t["batch_size"], t["purpose"], t["outcome"]) for t in result["trials"]]
    assert trained in trial["error"]["message"]
    assert "does not train at the batch it is given" in result["message"]
    assert "the script's error" not in result["message"]  # isoprobe's refusal, not the script's crash
    assert any("batch-size finder off" in hint for hint in result["suggestions"])


def test_a_helper_that_stepped_and_exited_before_training_is_not_waited_for(scratch):
    """A script whose sanity check (two steps at batch 2, in a subprocess) ran before its training: the helper
    stepped and exited, was counted as a rank forever, and every trial timed out ("no optimizer step seen", 20
    minutes at the default timeout). Now the helper is no rank once it has ended, and the trials measure the
    script's own steps (at their batch: the helper's batch 2 is no credit for another)."""
    # Every trial showed the bug (each timed out): short trials, no wait for an evaluation pass, no soak.
    done = run_cli("run", "--no-cache", "--format", "json", "--memory-budget", "1GiB", "--set",
                   "search.trial_timeout=60", "--set", "search.max_batch_size=16", "--set", "search.steady_steps=0",
                   "--set", "search.cycle_steps=0", "--set", "recommendation.soak_steps=0", "--",
                   sys.executable, str(REPO / "tests" / "commands" / "sanity_check_first.py"), "--batch-size",
                   "{batch_size}", timeout=600, cwd=REPO, env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = done.json
    assert result["max_batch_size"] == 16
    assert all(t["outcome"] == "fits" for t in result["trials"])


@pytest.mark.parametrize("signal_name, at_step", [("KILL", 1), ("SEGV", 0)])
def test_a_rank_killed_by_a_signal_under_torchrun_is_named_and_its_peers_error_is_not_blamed(scratch, signal_name,
                                                                                              at_step):
    """Rank 1 SIGKILLed under torchrun was blamed on rank 0's "Connection reset by peer ... the script's error",
    and rank 1 was never named. Now the lost rank is named with its signal (torchrun's report), its peer's error
    is said to follow from it, and the trial is a crash (retried, never the script's error)."""
    done = run_cli("run", "--no-cache", "--format", "json", "--memory-budget", "1GiB", "--set",
                   "search.start_batch_size=4", "--set", "search.max_batch_size=4", "--",
                   sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   str(REPO / "tests" / "commands" / "killed_rank.py"), "--batch-size", "{batch_size}", "--kill-with",
                   signal_name, "--at-step", str(at_step), timeout=600, cwd=REPO,
                   env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"})
    result = done.json
    assert done.returncode == 4 and result["stop_reason"] == "crashed", done.stderr[-3000:]
    assert [t["outcome"] for t in result["trials"]] == ["crashed", "crashed"]  # retried: reproduced
    assert all(t["error"]["type"] == "RankLost" for t in result["trials"])
    assert f"rank 1 (pid " in result["message"] and f"was killed by SIG{signal_name}" in result["message"]
    assert "the script's error" not in result["message"]


@pytest.mark.parametrize("forge, outcome", [("other-pid", "out_of_memory"), ("own-early", "out_of_memory"),
                                            ("own-hello", "error")])
def test_step_lines_the_shim_did_not_write_are_never_a_trials_steps(scratch, forge, outcome):
    """A script that writes three step lines into the trial's folder before it trains (for a PID that does not
    exist, for its own with no hello, or with a hello of its own) was credited with batch 400 where 162 is the
    edge. Now only lines of the trial's own processes, in the shim's order, count: the batch runs out at its first
    real step, and a second hello for one process is an error that says something writes into the folder."""
    done = run_cli("run", "--no-cache", "--format", "json", "--memory-budget", "1GiB", "--set",
                   "search.start_batch_size=4096", "--set", "search.max_batch_size=4096", "--",
                   sys.executable, str(REPO / "tests" / "commands" / "forges_steps.py"), "--batch-size",
                   "{batch_size}", "--forge", forge, timeout=600, cwd=REPO,
                   env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"})
    result = done.json
    assert result["max_batch_size"] is None, done.stderr[-3000:]
    assert [t["outcome"] for t in result["trials"]] == [outcome]
    if outcome == "error":
        assert result["trials"][0]["error"]["type"] == "CommandForgedLines"


def test_a_script_whose_inputs_mislead_the_check_can_turn_it_off(scratch):
    """``batch_check: off`` (issue 56: scripts that refuse the check's reading can say so in the spec): the fixed
    batch that the check refuses is probed as asked, every trial's check 'off'."""
    done = run_cli("run", "--no-cache", "--format", "json", "--memory-budget", "1GiB", "--set", "batch_check=off",
                   "--set", "search.max_batch_size=64", "--", sys.executable, str(SCRIPT), "--mode", "fixed",
                   "--batch-size", "{batch_size}", timeout=600, cwd=REPO,
                   env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = done.json
    assert result["max_batch_size"] == 64 and result["stop_reason"] == "capped"
    assert {t["batch_check"]["verdict"] for t in result["trials"]} == {"off"}
