"""A command trial: the job's own command at one batch size, supervised from this (torch-free) child process.

The trial's child process (under the keeper, the lifeline, the timeout and the CPU cap every trial has) does
not train here: it starts the user's command (``spec.command``, the batch in its arguments and in
``ISOPROBE_BATCH_SIZE``) in a session of its own, with the shim's folder first on PYTHONPATH, and reads what
the shim writes from inside every Python process of the command's tree (``protocol.command``). It then does
what ``child.core.step_report.StepHook`` does for isoprobe's own loop:

- each process's optimizer steps are its steps; a process that stepped is a *rank*. When a rank says how many
  there are (``WORLD_SIZE``: torchrun, accelerate launch, DeepSpeed), the trial waits for all of them; a step of
  the trial is done when every rank has done it, and its readings are the worst rank's (the budget is per rank);
- after each, the trial stops when it has run the request's steps, or, with a steady rule, when every rank is
  steady or at the rule's cap (``report.steady``), and writes the same ``StepDone`` events, so the parent
  judges them as any trial's;
- the ranks wait at a *gate* after each step until this supervisor has judged it, so no rank runs a step the
  verdict does not know of; when the trial has run enough, the whole tree is killed between two steps;
- the verdict is classified, never guessed (``child.command_trial.verdicts``): an allocation failure that reached the
  top of any rank is out of memory (that rank named, the others killed at once); another exception is the script's
  error; a command that ends with status 0 before the steps asked ended on its own, which is an error that says so.

The cap (CPU backend) is the budget itself on every process of the command (``RLIMIT_DATA`` set before exec,
inherited by torchrun's ranks and DataLoader workers): a plain process's cap, as the independent runs of
``benchmarks/harness/command_truth.py`` set it. Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from isoprobe.child.command_trial.seen import Watch, progress
from isoprobe.child.command_trial.start import command_cap, request_argv, request_environment, start_command
from isoprobe.child.command_trial.tree import POLL_SECONDS, SAMPLE_SECONDS, Process, Sampler, Tree
from isoprobe.child.command_trial.verdicts import (
    batch_judgement,
    copy_stderr_tail,
    exception_verdict,
    exit_status_of,
    exit_verdict,
    forged_error,
    over_budget,
    rank_lost_verdict,
    shows_allocation_failure,
)
from isoprobe.child.command_trial.warm import go, take
from isoprobe.protocol.command import ShimStep
from isoprobe.protocol.messages import Imported, MemoryReading, ModelBuilt, StepDone, TrialRequest, TrialResult
from isoprobe.protocol.wiring import GATE_FILE
from isoprobe.report import cycle, steady
from isoprobe.report.outcomes import Outcome
from isoprobe.report.trial import ErrorInfo
from isoprobe.system.primitives import (
    cancel_slurm_steps,
    sigkill_below,
    slurm_steps_of,
    srun_processes,
    wait_slurm_steps_gone,
)

if TYPE_CHECKING:
    from isoprobe.child.events import Events


#: A trial's verdict: its outcome, the error (None for a fit) and the phase it ended in.
Verdict = tuple[Outcome, ErrorInfo | None, str]


@dataclass
class _Judging:
    """What the supervisor has judged of the command's steps so far: the state its loop's helpers share, and what
    the trial's result reports at the end."""

    request: TrialRequest
    events: Events
    folder: Path
    started: float  # time.time() at the trial's start: the shim stamps each step with time.time()
    allowed: int  # steps every rank may run before its next wait at the gate
    judged: int = 0  # the trial's steps judged so far (every rank had done them)
    first_step_seconds: float | None = None
    peaks_by_rank: dict[int, list[int]] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    judged_peaks: list[int] = field(default_factory=list)  # each judged step's worst reading, as its StepDone has it
    evaluations: list[int] = field(default_factory=list)  # each judged step's evaluation forwards (the rank with most)
    saves: list[int] = field(default_factory=list)  # each judged step's torch.save calls (the rank with most)
    first_judged_at: float | None = None  # when the first step was judged: the cycle's bound in seconds counts from it
    bound: str | None = None  # why the trial stopped waiting for the cycle without a pass (report.cycle.CycleSeen)
    judged_ranks: list[Process] = field(default_factory=list)  # the ranks as last judged
    imported: bool = False  # whether the Imported phase was said

    @property
    def stderr_path(self) -> Path:
        return self.folder / "stderr"


def run_command_trial(request: TrialRequest, events: Events) -> None:
    """Run the command at the request's batch, judge its steps, end its tree, and write one ``TrialResult``."""
    started = time.time()  # the shim stamps each step with time.time(): the start-up is read against it
    folder, process, ahead = _start(request)
    tree = Tree(folder)
    state = _Judging(request, events, folder, started, _first_allowance(request))
    sampler = Sampler() if not request.device.startswith("cuda") else None
    try:
        verdict = _supervise(process, tree, state, sampler)
    finally:
        _end_tree(process)
    _emit_result(tree, state, verdict, ahead)


def _supervise(process: subprocess.Popen, tree: Tree, state: _Judging, sampler: Sampler | None) -> Verdict:
    """Read the shim's lines until a verdict: a forged line or a failure at once, else each step as every rank has
    done it (``_judge_new_steps``), else what the command's end says (``_ended_verdict``)."""
    watch = Watch(state.folder, state.events)  # what a trial killed at its timeout says (issue 56)
    while True:
        ended = process.poll()
        tree.read(sampler)
        forged = tree.forged()
        if forged is not None:
            return Outcome.ERROR, forged_error(forged, state.folder), f"step {state.judged + 1}"
        failed = tree.failure()
        if failed is not None:
            return _failure_verdict(process, tree, failed, state)
        if not state.imported and any(p.hello is not None for p in tree.processes.values()):
            state.imported = True  # torch's optimizers exist in the command: what a trial's 'imported' phase says
            state.events.emit(Imported(memory=MemoryReading()))
        tree.note_endings()
        watch.look(tree)
        verdict = _judge_new_steps(tree, state)
        if verdict is not None:
            return verdict
        if ended is None:
            _sample_for(POLL_SECONDS, sampler, tree)
            continue
        tree.read(sampler)  # the last lines of a command that has ended
        return _ended_verdict(process, tree, state, ended)


def _failure_verdict(process: subprocess.Popen, tree: Tree, failed: Process, state: _Judging) -> Verdict:
    """An exception reached the top of ``failed``: a lost rank's crash where that is what it shows, else the
    exception's own verdict."""
    return rank_lost_verdict(process, tree, failed, state.judged, state.stderr_path) or exception_verdict(
        failed, state.judged, exit_status_of(process, failed)
    )


def _ended_verdict(process: subprocess.Popen, tree: Tree, state: _Judging, ended: int) -> Verdict:
    """The verdict of a command that ended before the trial had one: a failure its lines show; a fit where, waiting
    for its cycle, it ran its whole course (every phase it has was seen); else what its exit status says."""
    failed = tree.failure()
    if failed is not None:
        return _failure_verdict(process, tree, failed, state)
    if (
        ended == 0
        and state.judged
        and state.request.cycle is not None
        and _enough(state.request, state.judged, list(state.peaks_by_rank.values()), state.judged_peaks)
        and not shows_allocation_failure(state.stderr_path)
    ):
        state.bound = "ended"
        return Outcome.FITS, None, "done"
    return exit_verdict(ended, state.judged, state.request, state.stderr_path, progress(tree))


def _judge_new_steps(tree: Tree, state: _Judging) -> Verdict | None:
    """Judge every step all the expected ranks have done since the last look, opening the gate one step further
    after each; a verdict as soon as one step is over the budget or the trial has run enough."""
    ranks = tree.ranks()
    if ranks:
        state.judged_ranks = ranks  # a command that ended on its own has none left
    expected = tree.expected_ranks()
    state.peaks_by_rank = {
        pid: peaks
        for pid, peaks in state.peaks_by_rank.items()
        if pid in tree.processes and tree.processes[pid] in ranks
    }
    while ranks and len(ranks) >= expected and min(len(p.steps) for p in ranks) > state.judged:
        _record_step(ranks, state)
        verdict = _step_verdict(ranks, state)
        if verdict is not None:
            return verdict
        if state.judged + 1 > state.allowed:
            state.allowed = state.judged + 1
            _open_gate(state.folder, state.allowed)
    return None


def _record_step(ranks: list[Process], state: _Judging) -> None:
    """Take the next step every rank has done as judged: its readings (the worst rank's), the phase it completes
    (the model exists once an optimizer has stepped), and its ``StepDone`` for the parent."""
    state.judged += 1
    judged = state.judged
    readings = [p.steps[judged - 1] for p in ranks]
    state.evaluations.append(max(r.eval_forwards for r in readings))
    state.saves.append(max(r.saves for r in readings))
    if judged == 1:
        state.first_judged_at = time.monotonic()
        first = readings[0]
        state.first_step_seconds = max(0.0, max(r.t for r in readings) - state.started)
        state.events.emit(ModelBuilt(memory=MemoryReading(peak_rss=first.peak_bytes, rss=first.held_bytes)))
    state.step_seconds.append(max(r.seconds for r in readings))
    worst = max(readings, key=lambda r: r.budget_peak_bytes or r.peak_bytes or 0)
    state.judged_peaks.append(worst.budget_peak_bytes or worst.peak_bytes or 0)
    state.events.emit(
        StepDone(
            step=judged,
            seconds=state.step_seconds[-1],
            peak_bytes=worst.peak_bytes,
            held_bytes=max((r.held_bytes or 0) for r in readings) or None,
            budget_peak_bytes=worst.budget_peak_bytes,
            cap_lowered=any(r.cap_lowered for r in readings),
        )
    )
    for p in ranks:
        state.peaks_by_rank[p.pid] = p.budget_peaks[:judged]


def _step_verdict(ranks: list[Process], state: _Judging) -> Verdict | None:
    """The verdict after the step just judged, if it brings one: out of memory over the budget; a fit once the
    trial has run enough and, unless the batch is past the steady margin (never the maximum), waited for the cycle."""
    request, judged = state.request, state.judged
    over = over_budget(request, ranks, judged)
    if over is not None:
        return Outcome.OUT_OF_MEMORY, over, f"step {judged}"
    if any(p.steps[judged - 1].cap_lowered for p in ranks):
        return None  # read under a cap too loose: the next step, under the lowered one, decides
    if not _enough(request, judged, list(state.peaks_by_rank.values()), state.judged_peaks):
        return None
    if request.steady is not None and steady.past_the_margin(state.judged_peaks, request.steady):
        waited: str | None = "off"  # marginal: never the maximum, no need to wait for the cycle
    else:
        since = time.monotonic() - state.first_judged_at if state.first_judged_at is not None else 0.0
        after = request.steady.window if request.steady else 0
        waited = cycle.waiting_done(state.evaluations, request.cycle, since, after=after)
    if waited is None:
        return None
    state.bound = waited if waited in ("steps", "seconds") else None
    return Outcome.FITS, None, "done"


def _emit_result(tree: Tree, state: _Judging, verdict: Verdict, ahead: bool) -> None:
    """Write the trial's ``TrialResult``: the verdict (an error where the steps were of another batch than the one
    asked: ``batch_judgement``), the readings of the ranks it reads, the files they ran and read, the cycle seen."""
    request, judged, bound = state.request, state.judged, state.bound
    batch_check = None
    if verdict[0] in (Outcome.FITS, Outcome.OUT_OF_MEMORY) and judged:
        batch_check, refusal = batch_judgement(
            request,
            _final_ranks(tree, state.judged_ranks, bound),
            judged,
            tree.expected_ranks() if bound != "ended" else len(state.judged_ranks),
        )
        if refusal is not None:  # a verdict about another batch than the one asked is no verdict on it
            verdict = (Outcome.ERROR, refusal, verdict[2])
    outcome, error, phase = verdict
    copy_stderr_tail(state.stderr_path)
    ranks = _final_ranks(tree, state.judged_ranks, bound)
    report = _readings(ranks, judged) if outcome is Outcome.FITS else _failure_readings(ranks)
    record = (
        cycle.seen(state.evaluations, state.saves, state.judged_peaks).model_copy(
            update={"waited": request.cycle is not None, "bound": bound}
        )
        if judged
        else None
    )
    if error is not None and outcome is Outcome.ERROR:
        sys.stderr.write(error.traceback_tail)
    state.events.emit(
        TrialResult(
            outcome=outcome,
            phase=phase,
            step_seconds=state.step_seconds,
            error=error,
            sources=_sources(tree.modules),
            reads=_reads(tree.reads, tree.modules),
            command_ranks=len(ranks) or None,
            first_step_seconds=state.first_step_seconds,
            started_ahead=ahead,
            cycle=record,
            batch_check=batch_check,
            **report,
        )
    )


def _final_ranks(tree: Tree, judged_ranks: list[Process], bound: str | None) -> list[Process]:
    """The ranks the verdict reads: the tree's now, or, for a command that ended on its own while the trial waited
    for its cycle (``bound`` 'ended'), the ranks as they were last judged (an ended process is no rank any more)."""
    return judged_ranks if bound == "ended" else tree.ranks()


def _sample_for(seconds: float, sampler: Sampler | None, tree: Tree) -> None:
    """Wait ``seconds``, sampling the data segment of every process that imported torch's optimizers meanwhile."""
    if sampler is None:
        time.sleep(seconds)
        return
    pids = [pid for pid, p in tree.processes.items() if p.hello is not None]
    deadline = time.monotonic() + seconds
    while True:
        sampler.sample(pids)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(SAMPLE_SECONDS, left))


def _scratch_folder() -> str:
    """The trial's files go beside the child's own: its working directory is the executor's scratch folder,
    removed with the probe."""
    return os.getcwd()


def _first_allowance(request: TrialRequest) -> int:
    """Steps every rank may run before its first wait: the request's, since none of them can end the trial early
    (a steady rule judges from the request's steps on)."""
    return request.steps or request.spec.search.steps


def _enough(request: TrialRequest, judged: int, peaks_by_rank: list[list[int]], judged_peaks: list[int]) -> bool:
    """As ``StepHook.after_step``: the request's steps, or with a steady rule every rank steady (or at the cap),
    and so is the sequence the parent judges (``judged_peaks``, the StepDone readings: ``classify.still_rising``).

    Both, because they can differ: a helper the script ran first (a sanity check of two steps at batch 2 in a
    subprocess) was the only rank while it lived, so the trial's first steps carry its readings; once it ended the
    script's own steps follow, higher. The script's own steps were steady after 6, the parent saw a rise from the
    helper's steps to the script's and called the trial still rising: with a start whose script read 0.7 MiB above
    its helper, ``tests/commands/sanity_check_first.py`` was answered 1 where 16 trains. The trial now steps on
    until the readings the parent sees hold still too."""
    rule = request.steady
    if rule is None:
        return judged >= (request.steps or request.spec.search.steps)
    return all(steady.should_stop(peaks, rule) for peaks in peaks_by_rank) and steady.should_stop(judged_peaks, rule)


def _open_gate(folder: Path, allowed: int) -> None:
    """Let every rank finish ``allowed`` steps (written whole: a rank never reads half a number)."""
    temporary = folder / f".{GATE_FILE}.{allowed}"
    temporary.write_text(str(allowed))
    os.replace(temporary, folder / GATE_FILE)


def _start(request: TrialRequest) -> tuple[Path, subprocess.Popen, bool]:
    """The trial's folder and command, and whether it was started ahead: the command this process started while it
    waited (``child.command_trial.warm``), if it is this trial's but for the batch; else started now. The gate is
    open to
    the first allowance before any of the command runs at the batch (no rank may read a missing gate as 0)."""
    ahead = take(request)
    if ahead is not None:
        _open_gate(ahead.folder, _first_allowance(request))
        return ahead.folder, go(ahead, request), True
    folder = Path(tempfile.mkdtemp(prefix="command-", dir=_scratch_folder()))
    _open_gate(folder, _first_allowance(request))
    process = start_command(
        request_argv(request, request.batch_size),
        request.spec.command_dir,
        request_environment(request, folder),
        folder,
        command_cap(request.device),
    )
    return folder, process, False


def _end_tree(process: subprocess.Popen) -> None:
    """Kill the command's session and every process below this one, a few sweeps for late forks; reap the command.
    Whatever left this tree (a daemon that double-forked) is below the keeper, which kills it when this child ends.
    A Slurm job step that the command's ``srun`` started is ended through Slurm: its tasks run under each node's
    slurmstepd, not below this process, and outlive a killed srun (measured on the two-node test cluster: the
    step of ``isoprobe run -- srun python train.py`` kept running after its trial, and the next trial's srun
    waited for its CPUs until it gave up)."""
    steps = slurm_steps_of(srun_processes(os.getpid()))
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    sigkill_below(os.getpid(), sweeps=5, pause=0.02)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    if steps:
        _cancel_steps(steps)


#: How long a cancelled step of the command's may stay in ``squeue -s`` before the trial goes on without waiting
#: (as ``executors.srun_gang.STEP_GONE_SECONDS``: a loaded machine can hold up Slurm's end of a killed step).
_STEP_GONE_SECONDS = 60.0
#: How often that wait asks Slurm again to kill and cancel the steps still listed.
_STEP_RECANCEL_SECONDS = 5.0


def _cancel_steps(steps: list[str]) -> None:
    """End ``steps`` through slurmctld and wait, a while, until ``squeue -s`` no longer lists them: the next
    trial's srun needs their CPUs (a step still listed then is left to Slurm: the trial goes on)."""
    cancel_slurm_steps(steps)
    wait_slurm_steps_gone(
        steps, _STEP_GONE_SECONDS, recancel_after=_STEP_RECANCEL_SECONDS, recancel_every=_STEP_RECANCEL_SECONDS
    )


def _readings(ranks: list[Process], judged: int) -> dict:
    """The trial's peaks: the worst rank's at the last judged step (each rank's budget is its own). Its base reading
    is what that rank held right after the step (``ShimStep.held_budget_bytes``): with the peak, the slope of a
    single batch, so that a command's second trial can go far from its first (issue 49: the line through two small
    batches, the heap's readings, not the batch's, predicted 43 where 30 was the edge)."""
    last = [p.steps[judged - 1] for p in ranks if len(p.steps) >= judged]
    if not last:
        return {}
    worst = max(last, key=lambda r: r.budget_peak_bytes or r.peak_bytes or 0)
    readings = {
        "peak_bytes": worst.peak_bytes,
        "budget_peak_bytes": worst.budget_peak_bytes,
        "file_resident_bytes": worst.file_resident_bytes,
        "budget_swing_bytes": _swing(ranks, judged),
        "heap_churn_bytes": _heap_churn(ranks, judged),
        "base_bytes": worst.held_budget_bytes,
    }
    return readings | _cuda_readings(worst)


def _cuda_readings(step: ShimStep) -> dict:
    """CUDA: the worst rank's allocated peak and retries, in ``TrialResult``'s fields (none on the CPU backend)."""
    if not step.device.startswith("cuda"):
        return {}
    return {"peak_allocated_bytes": step.peak_allocated_bytes, "alloc_retries": step.alloc_retries}


def _failure_readings(ranks: list[Process]) -> dict:
    steps = [p.steps[-1] for p in ranks if p.steps]
    if not steps:
        return {}
    readings = {"peak_bytes": max((s.peak_bytes or 0) for s in steps) or None, "budget_swing_bytes": _swing(ranks)}
    cuda = [s.budget_peak_bytes for s in steps if s.device.startswith("cuda") and s.budget_peak_bytes is not None]
    if cuda:  # the reading that ended an over-budget trial, in the budget's units
        readings["budget_peak_bytes"] = max(cuda)
    return readings


def _swing(ranks: list[Process], judged: int | None = None) -> int | None:
    """The largest swing of any rank's own step peaks (report.steady.swing_bytes), over its judged steps."""
    swings = [swing for p in ranks if (swing := steady.swing_bytes(p.own_peaks[:judged])) is not None]
    return max(swings) if swings else None


def _heap_churn(ranks: list[Process], judged: int) -> int | None:
    """The most any rank's heap grew and shrank within one judged step after the first (the first builds what
    every later step reuses: its growth is not churn); None: no such step was read alone."""
    churns = [c for p in ranks for c in p.heap_churns[1:judged] if c is not None]
    return max(churns) if churns else None


def _sources(modules: set[str]) -> dict[str, str]:
    """The user's module files the command's processes ran, hashed (as ``child.sources`` does for a trial)."""
    from isoprobe.child.sources import environment_roots, file_digests

    roots = environment_roots()
    return file_digests(path for path in sorted(modules) if not path.startswith(roots))


def _reads(reads: set[str], modules: set[str]) -> list[str]:
    """The files the command's processes read (its DataLoader workers' too), outside the installed environment; a
    folder they read more than 16 files of is named instead (``path/``), the four read the most first: the parent
    keys it by its listing (``cache.sources``), so a dataset costs a cache hit a bounded listing, not a hash of each
    of its files. Files of a folder past those four are left out, and so are more than 256 files."""
    from collections import Counter

    from isoprobe.child.sources import environment_roots

    roots = environment_roots()
    found = []
    for path in sorted(reads - modules):
        if path.startswith(roots) or path.endswith((".pyc", ".so")):
            continue
        if os.path.isfile(path):
            found.append(path)
    per_folder = Counter(os.path.dirname(path) for path in found)
    many = [folder for folder, count in per_folder.most_common() if count > 16]
    files = [path for path in found if per_folder[os.path.dirname(path)] <= 16]
    return [os.path.join(folder, "") for folder in many[:4]] + files[:256]
