"""How a command trial ended, classified from what its processes and its launcher left
(``child.command_trial.supervisor``'s
verdicts): an exception at the top of a rank, a rank lost to a signal, a command that ended on its own, lines
the shim cannot have written, a batch the script did not train at, a CUDA reading past the budget. Never
guessed: each names the process and quotes its last words. Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from isoprobe.child.command_trial.rank_loss import killed_rank, lost_message, peer_loss
from isoprobe.child.command_trial.trained_batch import StepInputs, judge
from isoprobe.child.command_trial.tree import Process, Tree
from isoprobe.protocol.messages import MESSAGE_CHARS, RANK_LOST, TrialRequest
from isoprobe.protocol.wiring import SHIM_DIR_ENV
from isoprobe.report.batch_check import NOT_TRAINED, BatchCheck
from isoprobe.report.outcomes import Outcome, classify_exception, ending_error, words_show_allocation_failure
from isoprobe.report.rank_progress import RankProgress, behind, printed
from isoprobe.report.trial import ErrorInfo
from isoprobe.spec.command import command_placeholder
from isoprobe.system.primitives import alive

#: Kept of the command's stderr for a verdict's evidence.
_STDERR_TAIL_CHARS = 6000
_TRACEBACK_LINES = 30
#: Read of the command's stderr to find the error it ended with (``shows_allocation_failure``).
_JUDGED_LINES = 400
_JUDGED_CHARS = 40000


def over_budget(request: TrialRequest, ranks: list[Process], judged: int) -> ErrorInfo | None:
    """CUDA: a rank whose reading after step ``judged`` passed the budget (the allocator's need plus the memory
    outside it, as isoprobe's own trials read it) is out of memory: on a card of the budget's size it would have
    run out. The shim's fraction is set from an estimate of the outside memory; this catches what came later (NCCL's
    buffers, lazily loaded kernels) and an estimate that was low. None: within the budget (or the CPU backend,
    whose cap the kernel enforces)."""
    budget = request.memory_budget_bytes
    if budget is None or not request.device.startswith("cuda"):
        return None
    for process in ranks:
        step = process.steps[judged - 1]
        if step.budget_peak_bytes is None or step.budget_peak_bytes <= budget or step.cap_lowered:
            continue
        parts = ""
        if step.outside_bytes is not None:
            need = step.budget_peak_bytes - step.outside_bytes
            parts = (
                f" (the allocator's need {mib(need)} + {mib(step.outside_bytes)} outside it: context, "
                "libraries, kernels, NCCL)"
            )
        message = (
            f"{process.name} of the command held {mib(step.budget_peak_bytes)} of {step.device} after "
            f"optimizer step {judged}{parts}, above the {mib(budget)} budget: it would not fit on a card "
            "of the budget's size"
        )
        return ErrorInfo(type="CommandOverBudget", message=message[:MESSAGE_CHARS], traceback_tail="")
    return None


def batch_judgement(
    request: TrialRequest, ranks: list[Process], judged: int, world: int
) -> tuple[BatchCheck | None, ErrorInfo | None]:
    """What the trial's judged steps, on every rank, showed of the batch asked
    (``child.command_trial.trained_batch``), and an
    error when they show it trained at the batch in its first steps only (the trial would credit a batch the
    script stopped training at). ``batch_check: off``: not judged."""
    if request.spec.batch_check == "off":
        return BatchCheck(verdict="off"), None
    steps = [[step_inputs(p.steps[k]) for k in range(min(judged, len(p.steps)))] for p in ranks]
    judgement = judge(request.batch_size, steps, world, f"{command_placeholder(request.spec)} = {request.batch_size}")
    if judgement.trained_once is None:
        return judgement.check, None
    error = ErrorInfo(type=NOT_TRAINED, message=judgement.trained_once[:MESSAGE_CHARS], traceback_tail="")
    return judgement.check, error


def step_inputs(step) -> StepInputs:
    """A shim step line's record of its training forwards, as ``child.command_trial.trained_batch`` judges it."""
    return StepInputs(
        forwards=step.forwards,
        forward_count=step.forward_count,
        input_elements=step.input_elements,
        leading_sum=step.leading_sum,
        batch_counts=step.batch_counts,
        tried_counts=step.tried_counts,
    )


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


#: How long the command's own process gets to exit after an exception that is the script's error (not out of
#: memory) was seen, for its exit status. Generous: a process that imported torch takes 1.2 to 2 s to finalize
#: after its exception on an idle machine here, and 10.4 s once (measured: the excepthook to the process's end,
#: torch 2.14.1); 2 s and then 10 s were too short on CI's two busy cores. The wait only ever delays a verdict that
#: ends the search anyway. An out-of-memory verdict does not wait: the search goes on, and the status adds nothing.
EXIT_WAIT_SECONDS = 30.0


def exit_status_of(process: subprocess.Popen, failed: Process) -> int | None:
    """The command's exit status when the process that failed is the command itself and its exception is the
    script's error (a rank's failure is judged at once: the launcher's own exit comes later, after its other ranks;
    an allocation failure is judged at once too: the search goes on, and the status adds nothing to it)."""
    if failed.pid != process.pid:
        return None
    exception = failed.exception
    if exception is not None and classify_exception(exception.types, exception.message) is Outcome.OUT_OF_MEMORY:
        return process.poll()
    try:
        return process.wait(timeout=EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        return None


def rank_lost_verdict(
    process: subprocess.Popen, tree: Tree, failed: Process, judged: int, stderr_path: Path
) -> tuple[Outcome, ErrorInfo, str] | None:
    """A crash, naming the lost rank, when ``failed``'s error is a transport's whose peer is gone and a rank of the
    gang was lost without an error of its own (``child.command_trial.rank_loss``); None: the failure is what it says."""
    exception = failed.exception
    # torchrun's own ChildFailedError: under load it can stop the peers before any of them saw the loss, and its
    # report is then the only words; its root cause names the rank a signal killed (issue 56: "the script's error")
    launcher = exception is not None and any(t.endswith("ChildFailedError") for t in exception.types)
    if exception is None or not (peer_loss(exception.message) or launcher):
        return None
    lost = [
        p
        for p in tree.processes.values()
        if p is not failed and p.hello is not None and p.exception is None and not alive(p.pid)
    ]
    try:  # the launcher's report of its ranks comes when it ends (torchrun: after it has stopped the others)
        process.wait(timeout=EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    launcher_words = stderr_tail(stderr_path, lines=200)
    if launcher:
        report = killed_rank(launcher_words)  # the report's root cause, if a signal ended it
        if report is None:
            return None
        lost = [p for p in lost if p.pid == report.pid]
        name = lost[0].name if lost else f"rank {report.rank} (pid {report.pid})"
        message = lost_message(
            name, len(lost[0].steps) if lost else exception.steps, f"was killed by {report.signal_name}", None, None
        )
        return (
            Outcome.CRASHED,
            ErrorInfo(type=RANK_LOST, message=message[:MESSAGE_CHARS], traceback_tail=launcher_words[-3000:]),
            f"step {judged + 1}",
        )
    report = killed_rank(launcher_words, pid=lost[0].pid if lost else None)
    first_hello = lost[0].hello if lost else None  # every lost process said hello
    if report is None and first_hello is not None:
        report = killed_rank(launcher_words, rank=first_hello.rank)
    if lost:
        name, steps = lost[0].name, len(lost[0].steps)
    elif report is not None:
        name, steps = f"rank {report.rank} (pid {report.pid})", exception.steps
    else:
        return None
    how = f"was killed by {report.signal_name}" if report is not None else "ended"
    message = lost_message(name, steps, how, failed.name, exception.message)
    tail = "\n".join(exception.traceback.splitlines()[-_TRACEBACK_LINES:]) + "\n"
    return (
        Outcome.CRASHED,
        ErrorInfo(type=RANK_LOST, message=message[:MESSAGE_CHARS], traceback_tail=tail),
        f"step {judged + 1}",
    )


def forged_error(process: Process, folder: Path) -> ErrorInfo:
    message = (
        f"the trial's folder holds lines for {process.name} that isoprobe's shim cannot have written (a "
        "second hello, or a step out of sequence): something in the command writes into the folder "
        f"${SHIM_DIR_ENV} names ({folder}), so no step it reports can be trusted. Leave that folder to "
        "isoprobe (docs/command.md: what a command can and cannot forge)"
    )
    return ErrorInfo(type="CommandForgedLines", message=message[:MESSAGE_CHARS], traceback_tail="")


def exception_verdict(failed: Process, judged: int, status: int | None = None) -> tuple[Outcome, ErrorInfo, str]:
    """The verdict of ``failed``'s exception (``Tree.failure``: a process whose exception reached its top)."""
    exception = failed.exception
    if exception is None:
        raise ValueError(f"{failed.name} has no exception to judge")
    outcome = classify_exception(exception.types, exception.message)
    tail = "\n".join(exception.traceback.splitlines()[-_TRACEBACK_LINES:]) + "\n"
    where = f"in {failed.name} of the command" + (f" (thread {exception.thread})" if exception.thread else "")
    if status is not None:
        where += f", exit status {status}"
    message = f"{exception.message} [{where}, after {exception.steps} optimizer step(s)]"
    error = ErrorInfo(
        type=exception.type.removeprefix("builtins."), message=message[:MESSAGE_CHARS], traceback_tail=tail
    )
    return outcome, error, f"step {judged + 1}" if judged or exception.steps else "started"


def exit_verdict(
    status: int, judged: int, request: TrialRequest, stderr_path: Path, processes: list[RankProgress] | tuple = ()
) -> tuple[Outcome, ErrorInfo, str]:
    """The command ended before the trial had run enough, and no exception line says why. ``processes``: how far
    each of its processes got (``child.command_trial.seen.progress``), so that ranks apart are named, not blamed on the
    optimizer (issue 56)."""
    asked = request.steps or request.spec.search.steps
    tail = stderr_tail(stderr_path)
    last = printed(tail, stderr_tail(stderr_path.with_name("stdout")))
    phase = f"step {judged + 1}" if judged else "started"
    apart = behind(list(processes))
    made = f"{judged} optimizer step(s)" + (f" that every rank made ({apart})" if apart else "")
    if status == 0 and shows_allocation_failure(stderr_path):
        # issue 47: a script that catches its own out-of-memory (a try/except around the step, a finder of its own)
        # and exits 0 said "its optimizer may not be a torch.optim.Optimizer". It ran out at this batch.
        message = (
            f"the command exited with status 0 after {made}, before the trial had run enough, and its stderr "
            f"ends with an allocation failure ({_ending(stderr_path)}): it caught its own out-of-memory error "
            "at this batch (a try/except around the step, or a batch-size finder of its own) and ended"
        )
        return (
            Outcome.OUT_OF_MEMORY,
            ErrorInfo(type="CommandOutOfMemory", message=message[:MESSAGE_CHARS], traceback_tail=tail),
            phase,
        )
    if status == 0:
        if apart:
            message = (
                f"the command exited with status 0 after {judged} optimizer step(s) that every rank made: "
                f"{apart}. A trial's step is one every rank has made: a rank that trains nothing or stops "
                "before the others (it returned early, or never reached its optimizer) ends the trial "
                "without one"
            )
        elif judged == 0:
            message = (
                "the command exited with status 0 without an optimizer step that isoprobe could see (no "
                "process of it stepped): its optimizer may not be a torch.optim.Optimizer, or it ran no "
                "training (check the command)"
            )
        else:
            message = (
                f"the command ended on its own (status 0) after {judged} optimizer step(s), before the "
                f"{asked} a trial needs: a max-steps setting of its own, or too little data for that many "
                "batches at this size; let it run longer (the trial ends it)"
            )
        return (
            Outcome.ERROR,
            ErrorInfo(type="CommandEnded", message=f"{message}; {last}"[:MESSAGE_CHARS], traceback_tail=tail),
            phase,
        )
    how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
    report = killed_rank(stderr_tail(stderr_path, lines=200)) if status != 0 else None
    if report is not None and not shows_allocation_failure(stderr_path):  # a launcher's rank lost to a signal
        message = (
            lost_message(
                f"rank {report.rank} (pid {report.pid})", judged, f"was killed by {report.signal_name}", None, None
            )
            + f" (the launcher {how})"
        )
        return Outcome.CRASHED, ErrorInfo(type=RANK_LOST, message=message[:MESSAGE_CHARS], traceback_tail=tail), phase
    if shows_allocation_failure(stderr_path):
        message = (
            f"the command {how} after {made}, and its stderr ends with an allocation failure: {_ending(stderr_path)}"
        )
        return (
            Outcome.OUT_OF_MEMORY,
            ErrorInfo(type="CommandOutOfMemory", message=message[:MESSAGE_CHARS], traceback_tail=tail),
            phase,
        )
    message = f"the command {how} after {made}; {last}"
    return Outcome.ERROR, ErrorInfo(type="CommandFailed", message=message[:MESSAGE_CHARS], traceback_tail=tail), phase


def _ending(stderr_path: Path) -> str:
    """The error the command's stderr ended with, its first lines (``report.outcomes.ending_error``)."""
    text = ending_error(stderr_tail(stderr_path, lines=_JUDGED_LINES, chars=_JUDGED_CHARS))
    return " / ".join(line.strip() for line in text.splitlines()[:4])[:600]


def shows_allocation_failure(stderr_path: Path) -> bool:
    """The command's stderr ended with an allocation failure (``report.outcomes.words_show_allocation_failure``:
    the error it ended with, not a mention anywhere in it), read far enough back to pass torchrun's report, a C++
    stack and faulthandler's dump after an abort."""
    return words_show_allocation_failure(stderr_tail(stderr_path, lines=_JUDGED_LINES, chars=_JUDGED_CHARS))


def stderr_tail(path: Path, lines: int = _TRACEBACK_LINES, chars: int = _STDERR_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - chars))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:]) + "\n"


def copy_stderr_tail(path: Path) -> None:
    """The command's last words into this child's stderr, where the parent reads a trial's evidence."""
    tail = stderr_tail(path)
    if tail.strip():
        sys.stderr.write(tail)
        sys.stderr.flush()
