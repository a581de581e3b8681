"""A rank lost to a signal under a launcher is named, and its peers' transport errors are not blamed (issue 47,
'misleading': rank 1 SIGKILLed under torchrun was blamed on rank 0's "Connection reset by peer ... the script's
error", and rank 1 was never named)."""

from __future__ import annotations

import subprocess
import sys

from isoprobe.child.command_trial import supervisor
from isoprobe.child.command_trial import tree as command_tree  # noqa: E402
from isoprobe.child.command_trial import verdicts as command_verdicts
from isoprobe.child.command_trial.rank_loss import killed_rank, launcher_exits, peer_loss
from isoprobe.report.outcomes import Outcome

#: torchrun's failure report, as torch.distributed.elastic.multiprocessing.errors formats it (torch 2.14).
REPORT = """
E1128 12:01:02.123000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -9)
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_12:01:02
  host      : n1
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5001) SIGTERM
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 5001
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_12:01:01
  host      : n1
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 5002) SIGKILL
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 5002
============================================================
"""


def test_the_launchers_report_names_each_rank_its_exit_and_the_root_cause():
    assert [(e.rank, e.exitcode, e.pid) for e in launcher_exits(REPORT)] == [(0, -15, 5001), (1, -9, 5002)]
    root = killed_rank(REPORT)
    assert (root.rank, root.signal_name) == (1, "SIGKILL")
    assert killed_rank(REPORT, pid=5001).signal_name == "SIGTERM"
    assert killed_rank(REPORT.replace("-9 (pid: 5002) SIGKILL", "1 (pid: 5002)")) is None  # root cause: an exit


def test_a_transports_words_for_a_lost_peer_are_told_from_a_scripts_error():
    assert peer_loss("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:29500: "
                     "Connection reset by peer")
    assert peer_loss("NCCL error: remote process exited or there was a network error")
    assert not peer_loss("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")


def test_a_peers_transport_error_after_a_rank_vanished_names_the_vanished_rank_as_a_crash(tmp_path, monkeypatch):
    from test_command_shim import hello, step, write_lines

    monkeypatch.setattr(command_tree.Tree, "of_this_trial", lambda self, pid, hello: True)  # made-up PIDs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the rank SIGKILLed without a word
    write_lines(tmp_path, 11, hello(0, 2), step(1, 100),
                {"kind": "exception", "types": ["DistBackendError", "RuntimeError", "Exception"],
                 "type": "torch.distributed.DistBackendError", "message": "Connection reset by peer",
                 "traceback": "Traceback ...\n", "thread": None, "steps": 1, "t": 9.0})
    write_lines(tmp_path, gone.pid, hello(1, 2), step(1, 100))
    (tmp_path / "stderr").write_text(REPORT.replace("5002", str(gone.pid)))
    tree = command_tree.Tree(tmp_path)
    tree.read()
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    outcome, error, _ = command_verdicts.rank_lost_verdict(launcher, tree, tree.failure(), 1, tmp_path / "stderr")
    assert outcome is Outcome.CRASHED and error.type == "RankLost"
    assert error.message.startswith(f"rank 1 (pid {gone.pid}) of the command was killed by SIGKILL after 1")
    assert "rank 0 (pid 11)'s error followed from the loss of its peer: Connection reset by peer" in error.message


def test_the_launchers_own_error_after_a_rank_was_killed_names_that_rank_not_the_script(tmp_path, monkeypatch):
    """Under load torchrun can stop rank 1 before it saw rank 0's loss: the only exception is torchrun's own
    ChildFailedError, and it was "the script's error" (issue 56, CI: the SEGV case); its report's root cause names
    the rank a signal killed."""
    from test_command_shim import hello, step, write_lines

    monkeypatch.setattr(command_tree.Tree, "of_this_trial", lambda self, pid, hello: True)  # made-up PIDs
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    launcher = subprocess.Popen([sys.executable, "-c", "pass"])
    write_lines(tmp_path, launcher.pid, {"kind": "exception", "types": [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError", "Exception"],
        "type": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError", "message": "",
        "traceback": "Traceback ...\n", "thread": None, "steps": 0, "t": 9.0})
    write_lines(tmp_path, gone.pid, hello(1, 2), step(1, 100))
    (tmp_path / "stderr").write_text(REPORT.replace("5002", str(gone.pid)))
    tree = command_tree.Tree(tmp_path)
    tree.read()
    outcome, error, _ = command_verdicts.rank_lost_verdict(launcher, tree, tree.failure(), 1, tmp_path / "stderr")
    assert outcome is Outcome.CRASHED and error.type == "RankLost"
    assert error.message.startswith(f"rank 1 (pid {gone.pid}) of the command was killed by SIGKILL after 1")
    # Its report naming no signal as the root cause: the launcher's error is what it says.
    (tmp_path / "stderr").write_text(REPORT.replace("-9 (pid: 5002) SIGKILL", "1 (pid: 5002)"))
    assert command_verdicts.rank_lost_verdict(launcher, tree, tree.failure(), 1, tmp_path / "stderr") is None


def test_a_launcher_that_ended_on_a_ranks_signal_is_a_crash_naming_that_rank(tmp_path):
    (tmp_path / "stderr").write_text(REPORT)
    outcome, error, _ = command_verdicts.exit_verdict(1, 2, _request(), tmp_path / "stderr")
    assert outcome is Outcome.CRASHED and "rank 1 (pid 5002) of the command was killed by SIGKILL" in error.message


def _request():
    from test_command_shim import request

    return request()
