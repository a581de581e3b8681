"""What a command trial says of how it ended (issue 56, item 6, 'messages that mislead'): the red team's scripts
under ``isoprobe run -- COMMAND``, CPU backend, 1 GiB. The unit tests of the same cases, with canned text, are
tests/unit/test_command_endings_said.py.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, run_cli

COMMANDS = REPO / "tests" / "commands"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            str(COMMANDS / "ranks_apart.py"), "--batch-size", "{batch_size}"]


@pytest.fixture
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="ip-end-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _probe(scratch: Path, command: list[str], timeout: int = 30):
    return run_cli("run", "--no-cache", "--format", "json", "--memory-budget", "1GiB", "--set",
                   f"search.trial_timeout={timeout}", "--set", "search.retries=0", "--set", "search.start_batch_size=4",
                   "--set", "search.max_batch_size=4", "--", *command, timeout=600, cwd=REPO,
                   env={"TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("silent", [False, True])
def test_a_note_that_it_catches_out_of_memory_does_not_make_its_exit_1_out_of_memory(scratch, silent):
    """(a) The script says at start-up that it catches torch.OutOfMemoryError, then exits 1 on a missing folder
    (or without a word): it was out_of_memory, and the probe said "not even the start batch 2 fits"."""
    done = _probe(scratch, [sys.executable, str(COMMANDS / "mentions_oom.py"), "--batch-size", "{batch_size}",
                            *(["--silent"] if silent else [])])
    result = done.json
    assert done.returncode == 4 and result["stop_reason"] == "error", done.stderr[-3000:]
    [trial] = result["trials"]
    assert trial["outcome"] == "error" and trial["error"]["type"] == "CommandFailed"
    assert "the command exited with status 1 after 1 optimizer step(s)" in result["message"]
    assert ("not writable" in result["message"]) is not silent


def test_a_hung_rank_under_torchrun_is_named_with_its_steps_and_the_commands_last_lines(scratch):
    """(b) Rank 1 waits for good before its second step; rank 0 waits for it in a collective of DDP's. The trial
    timed out saying "after 1 optimizer step(s) were seen" and "the command printed nothing on stderr"."""
    done = _probe(scratch, [*TORCHRUN, "--mode", "hang", "--at-step", "2"], timeout=10)
    result = done.json
    assert done.returncode == 4 and result["stop_reason"] == "timed_out", done.stderr[-3000:]
    [trial] = result["trials"]
    assert trial["error"]["type"] == "CommandRankBehind"
    # Both at one step count (rank 0 waits in DDP's collective of step 2): where each was in step 2 tells them apart.
    assert "rank 1 (pid " in result["message"] and "stopped after optimizer step 1, before the forward pass of step " \
        "2, while rank 0 (pid " in result["message"]
    assert "rank 1: waiting for the data server" in result["message"]
    assert "rank 0 step 1" in trial["error"]["traceback_tail"]  # its stdout too
    assert not any("printed nothing" in hint for hint in result["suggestions"])


def test_rank_0_stepping_alone_is_not_blamed_on_the_optimizer(scratch):
    """(c) Rank 1 returns before its first step, rank 0 makes its 2 steps, torchrun exits 0: the message said "its
    optimizer may not be a torch.optim.Optimizer"."""
    done = _probe(scratch, [*TORCHRUN, "--mode", "no-step", "--at-step", "1", "--max-steps", "2"])
    result = done.json
    assert done.returncode == 4 and result["stop_reason"] == "error", done.stderr[-3000:]
    [trial] = result["trials"]
    assert trial["error"]["type"] == "CommandEnded"
    assert "made no optimizer step and ended with no error of its own, while rank 0 (pid " in result["message"]
    assert "rank 1: nothing to train on this rank" in result["message"]
    assert "torch.optim.Optimizer" not in result["message"]
