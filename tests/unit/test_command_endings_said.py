"""Issue 56, item 6, 'messages that mislead': what a command trial says of how it ended, from canned stderr text and
canned records of its processes (the red team's scripts are tests/commands/mentions_oom.py and ranks_apart.py).

(a) a start-up note that mentions ``torch.OutOfMemoryError`` made every exit 1 an out-of-memory verdict: only the
    error the command's stderr ended with counts;
(b) a hung rank under torchrun was not named, and the hint said the command printed nothing (its output was lost
    with the child killed at the timeout): the supervisor writes what it sees as it goes, and the parent names the
    rank behind, its steps and the command's last lines;
(c) rank 0 stepping alone was blamed on a non-torch optimizer: that cause only where no rank stepped.
"""

from __future__ import annotations

import json
import signal

import pytest

from isoprobe.child.command_trial import seen as command_seen

from isoprobe.child.command_trial import tree as command_tree

from isoprobe.child.command_trial import verdicts as command_verdicts
from isoprobe.executors import ChildRun
from isoprobe.pipeline.explain import Found, explain
from isoprobe.pipeline.trial_record import trial_from_run
from isoprobe.protocol.command import CommandSeen
from isoprobe.protocol.messages import StepDone
from isoprobe.report.device import DeviceInfo
from isoprobe.report.outcomes import Outcome, StopReason, ending_error, words_show_allocation_failure
from isoprobe.report.rank_progress import RANK_BEHIND, TIMED_OUT, RankProgress, behind, timed_out_words
from isoprobe.spec.model import Spec

from test_command_shim import hello, request, step, write_lines

NOTE = "note: catching torch.OutOfMemoryError to retry at a smaller batch\n"

# ------------------------------------------------------------------------------------------------------- (a)

#: NCCL's watchdog aborting a rank whose buffers did not fit, as a rank's stderr under torchrun shows it: the
#: watchdog's log line, C++'s terminate with the exception's what(), its stack, faulthandler's dump after the
#: abort, torchrun's own log line and failure report (torch 2.x's formats).
WATCHDOG = """\
[rank1]:[E1128 12:01:01.000000 5002 ProcessGroupNCCL.cpp:1899] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group \
watchdog thread terminated with exception: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)
ncclUnhandledCudaError: Call to CUDA function failed.
Last error:
Cuda failure 2 'out of memory'
Exception raised from checkForNCCLErrorsInternal at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f in libc10.so)
frame #1: <unknown function> + 0x11f1e1 (0x7f in libtorch_cuda.so)
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: NCCL \
error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)
ncclUnhandledCudaError: Call to CUDA function failed.
Last error:
Cuda failure 2 'out of memory'
Exception raised from checkForNCCLErrorsInternal at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f in libc10.so)
Fatal Python error: Aborted

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.12/threading.py", line 355 in wait
Current thread 0x00007f0000000000 (most recent call first):
  File "/work/train.py", line 40 in main

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
E1128 12:01:02.123000 4242 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: -6) local_rank: 1
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_12:01:02
  host      : n1
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 5002) SIGABRT
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 5002
============================================================
"""


@pytest.mark.parametrize("stderr", [
    NOTE + "error: checkpoint folder /nonexistent/ckpt is not writable\n",  # the red team's script
    NOTE,  # ... with --silent: it says nothing more and exits 1
    NOTE + "step 1\nstep 2\n",
    "UserWarning: torch.OutOfMemoryError is caught by the retry wrapper\n" + "Killed\n",
    # a traceback's frames show source lines, not what was raised
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n    retry_on(torch.OutOfMemoryError, '
    'step)\n  File "train.py", line 4, in retry_on\n    raise ValueError("no data")\nValueError: no data\n',
    # an out-of-memory caught and logged earlier, then another error that ended it
    'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    step()\ntorch.OutOfMemoryError: CUDA '
    'out of memory. Tried to allocate 2.00 GiB\n\nretrying at batch 8\nKeyError: \'labels\'\n',
    "terminate called after throwing an instance of 'std::runtime_error'\n  what():  note: OutOfMemoryError is "
    "retried\n",
])
def test_a_mention_before_the_end_is_not_the_error_it_ended_with(stderr):
    assert not words_show_allocation_failure(stderr)


@pytest.mark.parametrize("stderr", [
    'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    step()\ntorch.OutOfMemoryError: CUDA '
    "out of memory. Tried to allocate 2.00 GiB\nwandb: Synced 5 W&B file(s)\n",
    NOTE + "step 1\nRuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes\n",
    'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    x = [0] * 10**12\nMemoryError\n',
    "[rank1]:Traceback (most recent call last):\n[rank1]:  File \"t.py\", line 3, in <module>\n[rank1]:    step()\n"
    "[rank1]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    "terminate called after throwing an instance of 'c10::OutOfMemoryError'\n  what():  CUDA out of memory. Tried to "
    "allocate 20.00 MiB\nException raised from malloc at CUDACachingAllocator.cpp:1000\n",
    WATCHDOG,
])
def test_an_allocation_failure_the_command_ended_with_is_one(stderr):
    assert words_show_allocation_failure(stderr), ending_error(stderr)


def test_the_watchdogs_ending_is_its_exception_not_the_launchers_report():
    ending = ending_error(WATCHDOG)
    assert ending.startswith("terminate called after throwing an instance of 'c10::DistBackendError'")
    assert ending.endswith("Cuda failure 2 'out of memory'")


def test_a_command_that_said_it_catches_out_of_memory_and_exited_1_is_its_error_with_its_last_lines(tmp_path):
    """The red team's script: a note at start-up, then exit 1 on a missing folder. It was out_of_memory, and the
    probe said 'not even the start batch fits'."""
    (tmp_path / "stderr").write_text(NOTE + "error: checkpoint folder /nonexistent/ckpt is not writable\n")
    outcome, error, _ = command_verdicts.exit_verdict(1, 1, request(), tmp_path / "stderr")
    assert outcome is Outcome.ERROR and error.type == "CommandFailed"
    assert error.message.startswith("the command exited with status 1 after 1 optimizer step(s)")
    assert '"error: checkpoint folder /nonexistent/ckpt is not writable"' in error.message


def test_an_out_of_memory_ending_is_quoted_in_its_message(tmp_path):
    (tmp_path / "stderr").write_text(NOTE + "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried\n")
    outcome, error, _ = command_verdicts.exit_verdict(1, 2, request(), tmp_path / "stderr")
    assert outcome is Outcome.OUT_OF_MEMORY
    assert error.message.endswith("ends with an allocation failure: RuntimeError: DefaultCPUAllocator: can't "
                                  "allocate memory: you tried")


# ------------------------------------------------------------------------------------------------------- (b)

def _rank(rank, pid, steps, ended=False):
    return RankProgress(pid=pid, rank=rank, world_size=2, steps=steps, ended=ended)


HUNG = [RankProgress(pid=10), _rank(0, 11, 2), _rank(1, 12, 1)]  # torchrun's agent said hello too
STDERR = "rank 0 step 1\nrank 1 step 1\nrank 1: waiting for the data server\nrank 0 step 2"
STDOUT = "rank 0 step 1\nrank 1 step 1\nrank 0 step 2"


def test_the_rank_behind_is_named_with_its_pid_and_steps_and_how_far_the_others_got():
    assert behind(HUNG) == "rank 1 (pid 12) stopped after optimizer step 1, while rank 0 (pid 11) made 2"
    message, kind = timed_out_words(HUNG, STDERR, STDOUT)
    assert kind == RANK_BEHIND
    assert message.startswith("rank 1 (pid 12) stopped after optimizer step 1, while rank 0 (pid 11) made 2: the "
                              "rank behind hangs")
    assert ('the command\'s last lines on stderr: "rank 1 step 1" / "rank 1: waiting for the data server" / "rank 0 '
            'step 2"') in message


def test_a_rank_never_seen_and_ranks_at_one_step_are_told_apart():
    assert behind([_rank(0, 11, 3)]) == ("rank 1 never reached torch's optimizers (no process of the command said "
                                         "it was it), while rank 0 (pid 11) made 3")
    assert behind([_rank(0, 11, 2), _rank(1, 12, 2)]) is None
    message, kind = timed_out_words([_rank(0, 11, 2), _rank(1, 12, 2)], "", "")
    assert kind == TIMED_OUT and message.startswith("rank 0 (pid 11), rank 1 (pid 12) made 2 optimizer step(s) each")
    assert message.endswith("the command printed nothing on stdout or stderr")
    assert behind([RankProgress(pid=5, steps=1)]) is None  # a plain script: nobody to be behind


SPEC = Spec.model_validate({"command": "torchrun --nproc-per-node 2 train.py {batch_size}", "command_dir": "/tmp",
                            "search": {"trial_timeout": 20}})
INFO = DeviceInfo(backend="cpu", requested="cpu", name="cpu", total_memory_bytes=8 << 30, memory_budget_bytes=1 << 30,
                  budget_source="spec", capacity_bytes=1 << 30)


def _killed_at_timeout(processes, stderr=STDERR, stdout=STDOUT, judged=1):
    """A command trial's run as the parent collects it when it killed the child at the deadline: the supervisor's
    events (its steps judged, its last CommandSeen), nothing on the child's own stderr."""
    events = [StepDone(step=k, seconds=0.1, peak_bytes=100, budget_peak_bytes=100) for k in range(1, judged + 1)]
    events.append(CommandSeen(processes=processes, stderr_tail=stderr, stdout_tail=stdout))
    run = ChildRun(returncode=-signal.SIGKILL, timed_out=True, seconds=20.0, events=events, stderr_tail="")
    return trial_from_run(run, 1, 4, "search")


def test_a_timed_out_trial_names_the_hung_rank_and_quotes_what_the_command_printed():
    trial = _killed_at_timeout(HUNG)
    assert trial.outcome is Outcome.TIMED_OUT and trial.error.type == RANK_BEHIND
    assert trial.stderr_tail == STDERR and "rank 0 step 2" in trial.error.traceback_tail  # both streams' tails
    assert trial.command_ranks == 2
    message, hints = explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [trial], None)
    assert message.startswith("batch 4 ran past the 20 s trial timeout: rank 1 (pid 12) stopped after optimizer "
                              "step 1, while rank 0 (pid 11) made 2")
    assert "waiting for the data server" in message
    assert not any("printed nothing" in hint for hint in hints)
    assert any("rank behind" in hint for hint in hints) and any("traceback_tail" in hint for hint in hints)


def test_printed_nothing_is_said_only_of_a_command_whose_output_was_read_empty():
    trial = _killed_at_timeout([_rank(0, 11, 1), _rank(1, 12, 1)], stderr="", stdout="")
    message, hints = explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [trial], None)
    assert "made 1 optimizer step(s) each" in message and "printed nothing on stdout or stderr" in message
    assert not any("traceback_tail" in hint for hint in hints)


class _Events:
    def __init__(self):
        self.written = []

    def emit(self, event):
        self.written.append(event)


def test_the_supervisor_writes_what_it_sees_as_it_goes(tmp_path, monkeypatch):
    """At the start, and again once it changed (no sooner than the interval): the parent's only record of a trial
    it kills at the deadline."""
    monkeypatch.setattr(command_tree.Tree, "of_this_trial", lambda self, pid, hello: True)  # made-up PIDs
    monkeypatch.setattr(command_seen, "interval", lambda elapsed: 0.0)
    watch = command_seen.Watch(tmp_path, _Events())
    tree = command_tree.Tree(tmp_path)
    watch.look(tree)
    watch.look(tree)  # nothing changed: nothing written
    assert [(e.processes, e.stderr_tail) for e in watch.events.written] == [([], "")]
    write_lines(tmp_path, 11, hello(0, 2), step(1, 100), step(2, 100))
    write_lines(tmp_path, 12, hello(1, 2), step(1, 100))
    (tmp_path / "stderr").write_text(STDERR + "\n")
    (tmp_path / "stdout").write_text(STDOUT + "\n")
    tree.read()
    watch.look(tree)
    last = watch.events.written[-1]
    assert [(p.rank, p.pid, p.steps) for p in last.processes] == [(0, 11, 2), (1, 12, 1)]
    assert (last.stderr_tail, last.stdout_tail) == (STDERR, STDOUT)
    assert json.loads(last.model_dump_json())["event"] == "command"


def test_the_interval_grows_with_the_trial_and_is_bounded():
    assert command_seen.interval(0) == 1.0 and command_seen.interval(150) == 5.0 and command_seen.interval(1e5) == 10


# ------------------------------------------------------------------------------------------------------- (c)

def test_rank_0_stepping_alone_when_the_command_exited_names_the_rank_that_did_not(tmp_path):
    """rank 1 returned without a step and the launcher exited 0: 'its optimizer may not be a torch.optim.Optimizer'
    was said of a command whose rank 0 made its steps."""
    (tmp_path / "stderr").write_text("rank 0 step 1\nrank 0 step 2\nrank 1: nothing to train on this rank\n")
    processes = [RankProgress(pid=10), _rank(0, 11, 2, ended=True), _rank(1, 12, 0, ended=True)]
    outcome, error, _ = command_verdicts.exit_verdict(0, 0, request(), tmp_path / "stderr", processes)
    assert outcome is Outcome.ERROR and error.type == "CommandEnded"
    assert ("rank 1 (pid 12) made no optimizer step and ended with no error of its own, while rank 0 (pid 11) made 2"
            in error.message)
    assert '"rank 1: nothing to train on this rank"' in error.message
    assert "torch.optim.Optimizer" not in error.message


def test_the_non_torch_optimizer_is_suggested_only_where_no_process_stepped(tmp_path):
    (tmp_path / "stderr").write_text("")
    outcome, error, _ = command_verdicts.exit_verdict(0, 0, request(), tmp_path / "stderr",
                                                      [RankProgress(pid=10), _rank(0, 11, 0), _rank(1, 12, 0)])
    assert "torch.optim.Optimizer" in error.message and "printed nothing" in error.message


def test_a_timeout_with_rank_0_at_the_gate_and_rank_1_hung_before_its_first_step_blames_no_optimizer():
    trial = _killed_at_timeout([_rank(0, 11, 3), _rank(1, 12, 0)], judged=0)
    message, hints = explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [trial], None)
    assert "rank 1 (pid 12) made no optimizer step, while rank 0 (pid 11) made 3" in message
    assert "no optimizer step seen" not in message
    assert not any("torch.optim.Optimizer" in hint for hint in hints)
    nobody = _killed_at_timeout([RankProgress(pid=10), _rank(0, 11, 0), _rank(1, 12, 0)], judged=0)
    message, hints = explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [nobody], None)
    assert "no optimizer step seen" in message and any("torch.optim.Optimizer" in hint for hint in hints)


# ------------------------------------------------------------------------------------ (b) ranks at one step count

def test_ranks_at_one_step_are_told_apart_by_where_they_were_in_the_next():
    """Under DDP the peers of a rank hung before its forward wait in the backward's all-reduce: every rank at one
    step count (the red team's torchrun case). Where each was in its next step tells the hung one."""
    hung = [_rank(0, 11, 1).model_copy(update={"forward": "returned"}), _rank(1, 12, 1)]
    assert behind(hung) == ("rank 1 (pid 12) stopped after optimizer step 1, before the forward pass of step 2, "
                            "while rank 0 (pid 11) made 1 and was past the forward pass of step 2 (in its backward "
                            "or optimizer step)")
    first = [_rank(0, 11, 0).model_copy(update={"forward": "began"}), _rank(1, 12, 0)]
    assert behind(first).startswith("rank 1 (pid 12) made no optimizer step, before the forward pass of step 1, "
                                    "while rank 0 (pid 11) made none, inside the forward pass of step 1")
    trial = _killed_at_timeout(first, judged=0)
    message, hints = explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [trial], None)
    assert message.startswith("batch 4 ran past the 20 s trial timeout: rank 1 (pid 12) made no optimizer step")
    assert not any("torch.optim.Optimizer" in hint for hint in hints)
    # No forward seen of anyone (a model the shim cannot watch): nothing said of forwards.
    assert behind([_rank(0, 11, 2), _rank(1, 12, 1)]) == ("rank 1 (pid 12) stopped after optimizer step 1, while "
                                                          "rank 0 (pid 11) made 2")


MARKS_SCRIPT = r"""
import torch, torch.nn as nn
model = nn.Linear(8, 4); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(3, 8)).sum().backward()          # two micro-batches: one mark of each kind per step
opt.step()
with torch.no_grad():
    model(torch.randn(3, 8))                             # an evaluation: no mark
model(torch.randn(3, 8))                                 # step 2's forward returned; no step follows
"""


def test_the_shim_marks_where_a_process_is_in_its_next_step_and_the_supervisor_reads_it(tmp_path):
    from isoprobe.protocol.command import ShimForward, ShimStep
    from shim_run import shim_lines

    lines = shim_lines(tmp_path, MARKS_SCRIPT, ShimForward, ShimStep)
    assert [(line.kind, line.step, getattr(line, "returned", None)) for line in lines] == [
        ("forward", 1, False), ("forward", 1, True), ("step", 1, None), ("forward", 2, False), ("forward", 2, True)]
    tree = command_tree.Tree(tmp_path)
    tree.of_this_trial = lambda pid, hello: True  # the process has ended
    tree.read()
    [process] = tree.processes.values()
    assert len(process.steps) == 1 and process.forward == "returned"


def test_on_a_busy_node_the_timeout_still_says_what_the_command_had_come_to():
    trial = _killed_at_timeout(HUNG).model_copy(update={"busy_at_timeout": True, "busy_seconds": 160.0})
    message, _ = explain(Found(StopReason.TIMED_OUT, None, None), SPEC, INFO, [trial], None)
    assert "on a busy node" in message and "rank 1 (pid 12) stopped after optimizer step 1" in message
