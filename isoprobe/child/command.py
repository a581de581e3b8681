"""A command trial: the job's own command at one batch size, supervised from this (torch-free) child process.

The trial's child process (under the keeper, the lifeline, the timeout and the CPU cap every trial has) does
not train here: it starts the user's command (``spec.command``, the batch in its arguments and in
``ISOPROBE_BATCH_SIZE``) in a session of its own, with the shim's folder first on PYTHONPATH, and reads what
the shim writes from inside every Python process of the command's tree (``protocol.command``). It then does
what ``child.step_report.StepHook`` does for isoprobe's own loop:

- each process's optimizer steps are its steps; a process that stepped is a *rank*. When a rank says how many
  there are (``WORLD_SIZE``: torchrun, accelerate launch, DeepSpeed), the trial waits for all of them; a step of
  the trial is done when every rank has done it, and its readings are the worst rank's (the budget is per rank);
- after each, the trial stops when it has run the request's steps, or, with a steady rule, when every rank is
  steady or at the rule's cap (``report.steady``), and writes the same ``StepDone`` events, so the parent
  judges them as any trial's;
- the ranks wait at a *gate* after each step until this supervisor has judged it, so no rank runs a step the
  verdict does not know of; when the trial has run enough, the whole tree is killed between two steps;
- the verdict is classified, never guessed (``verdict``): an allocation failure that reached the top of any rank
  is out of memory (that rank named, the others killed at once); another exception is the script's error; a
  command that ends with status 0 before the steps asked ended on its own, which is an error that says so.

The cap (CPU backend) is the budget itself on every process of the command (``RLIMIT_DATA`` set before exec,
inherited by torchrun's ranks and DataLoader workers): a plain process's cap, as the independent runs of
``benchmarks/command_truth.py`` set it. Nothing here imports torch.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from isoprobe.child.memory import data_cap
from isoprobe.protocol.command import (GATE_FILE, SHIM_CUDA_BUDGET_ENV, SHIM_CUDA_OUTSIDE_ENV, SHIM_DIR_ENV,
                                       SHIM_FOLDER, ShimException, ShimFiles, ShimHello, ShimStep, parse_lines)
from isoprobe.protocol.messages import (MESSAGE_CHARS, Imported, MemoryReading, ModelBuilt, StepDone, TrialRequest,
                                        TrialResult)
from isoprobe.protocol.wiring import EVENTS_ENV, LIFELINE_ENV, PRELOAD_ENV
from isoprobe.report import steady
from isoprobe.report.outcomes import Outcome, classify_exception
from isoprobe.report.result import ErrorInfo
from isoprobe.child.rank_loss import killed_rank, lost_message, peer_loss
from isoprobe.child.trained_batch import not_trained_message, trial_trained_at
from isoprobe.spec.command import BATCH_ENV, PLACEHOLDER, argv_for
from isoprobe.system.keeper import (cancel_slurm_steps, sigkill_below, slurm_steps_of, srun_processes,
                                    wait_slurm_steps_gone)

if TYPE_CHECKING:
    from isoprobe.child.events import Events

#: How often the supervisor reads the shim's files and the command's state.
_POLL_SECONDS = 0.01
#: How often it samples each rank's data segment between those reads (``_Sampler``).
_SAMPLE_SECONDS = 0.001
#: The brk heap is read every this many samples (4 ms): /proc/PID/maps costs about 45 us a read against statm's
#: 10, and what it must see (a batch's small blocks, alive through a step of a tenth of a second or more) lasts.
_HEAP_EVERY = 4
#: The head of /proc/PID/maps read for the ``[heap]`` line: the interpreter's own mappings and the heap come
#: first (about 700 bytes in a venv's python with torch imported); the rest (tens of KiB of libraries) is skipped.
_MAPS_HEAD_BYTES = 4096
#: Kept of the command's stderr for a verdict's evidence.
_STDERR_TAIL_CHARS = 6000
_TRACEBACK_LINES = 30
#: What an allocation failure looks like in a process's last words when no exception line came (C++ code,
#: a rank whose excepthook the script replaced): the allocators' own wording, as ``outcomes`` lists it.
_OOM_STDERR_MARKERS = ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory", "torch.OutOfMemoryError",
                       "MemoryError", "OutOfMemoryError")
#: NCCL's own cudaMalloc failing (its buffers, outside the allocator), in lower case: NCCL's CUDACHECK writes
#: "Cuda failure 2 'out of memory'" (cudaErrorMemoryAllocation), under "ncclUnhandledCudaError", which torch raises
#: as a DistBackendError or, from its watchdog, prints before it aborts the rank (SIGABRT, no exception line).
_NCCL_OOM_MARKERS = ("cuda failure 2 'out of memory'", "cuda failure 'out of memory'")
#: Variables of isoprobe's own children that the user's command must not inherit.
_OWN_VARIABLES = (EVENTS_ENV, LIFELINE_ENV, PRELOAD_ENV)


@dataclass
class _Process:
    """What one process of the command's tree has reported."""

    pid: int
    hello: ShimHello | None = None
    steps: list[ShimStep] = field(default_factory=list)
    own_peaks: list[int | None] = field(default_factory=list)  # per step, as report.steady.swing_bytes takes them
    heap_churns: list[int | None] = field(default_factory=list)  # per step: the heap's range within it (_Sampler)
    exception: ShimException | None = None
    offset: int = 0
    ended: bool = False  # gone (or a zombie) without an exception line, while the command ran on
    forged: bool = False  # lines the shim cannot have written (a second hello, a step out of sequence)

    @property
    def launched_rank(self) -> bool:
        """One of several ranks a launcher declared (WORLD_SIZE > 1): its loss ends the gang, never shrinks it."""
        return self.hello is not None and (self.hello.world_size or 1) > 1

    @property
    def budget_peaks(self) -> list[int]:
        return [s.budget_peak_bytes if s.budget_peak_bytes is not None else (s.peak_bytes or 0) for s in self.steps]

    @property
    def name(self) -> str:
        rank = self.hello.rank if self.hello is not None else None
        return f"rank {rank} (pid {self.pid})" if rank is not None else f"pid {self.pid}"


@dataclass
class _Tree:
    """Everything the shim wrote so far, by process."""

    folder: Path
    processes: dict[int, _Process] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)
    reads: set[str] = field(default_factory=set)

    def read(self, sampler: "_Sampler | None" = None) -> None:
        """Take the new complete lines of every process's file; with ``sampler`` (CPU), a step's budget peak is the
        most its process's data segment was sampled at until now (the step's line is written at its end)."""
        for path in self.folder.glob("p*.jsonl"):
            try:
                pid = int(path.stem[1:])
            except ValueError:
                continue
            process = self.processes.setdefault(pid, _Process(pid))
            try:
                with open(path, "rb") as handle:
                    handle.seek(process.offset)
                    data = handle.read()
            except OSError:
                continue
            complete = data.rfind(b"\n") + 1
            process.offset += complete
            lines = parse_lines(data[:complete])
            # A step's own peak is known only when its line came alone: the samples since the line before it span
            # just that step (two lines read at once share their samples, and neither step's own peak is known).
            alone = sum(isinstance(line, ShimStep) for line in lines) == 1
            for line in lines:
                if isinstance(line, ShimHello):
                    if process.hello is None and self.of_this_trial(pid, line):
                        process.hello = line
                    elif process.hello is not None:
                        process.forged = True  # the shim says hello once: someone else wrote one of them
                elif isinstance(line, ShimStep) and (process.hello is None or line.step != len(process.steps) + 1):
                    # Not the shim's: a step before its process said hello, or out of sequence (issue 47, forged)
                    process.forged = process.forged or process.hello is not None
                    continue
                elif isinstance(line, ShimStep):
                    own = churn = None
                    if sampler is not None:
                        sampler.sample([pid])  # the last reading before the step is taken as done
                        line = line.model_copy(update={"budget_peak_bytes": sampler.peak(pid, line.budget_peak_bytes)})
                        own = sampler.since_last_step(pid)
                        churn = sampler.heap_churn_since_last_step(pid)
                    process.steps.append(line)
                    process.own_peaks.append(own if alone else None)
                    process.heap_churns.append(churn if alone else None)
                elif isinstance(line, ShimException) and process.exception is None:
                    process.exception = line
                elif isinstance(line, ShimFiles):
                    self.modules.update(line.modules)
                    self.reads.update(line.reads)

    def of_this_trial(self, pid: int, hello: ShimHello) -> bool:
        """Whether the process that says hello is one of this trial's: a process of this node whose environment
        names this trial's folder (every process the command starts inherits it), or one of another node (a Slurm
        step's task, whose /proc is not here). A line written for a process that does not exist, or for one of
        someone else's, is not a step of this trial (issue 47: forged step lines credited batch 400 where 162 is
        the edge); docs/command.md says what a command can still forge."""
        if hello.host is not None and hello.host != os.uname().nodename:
            return True
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environment = handle.read()
        except OSError:
            return False
        return f"{SHIM_DIR_ENV}={self.folder}".encode() in environment.split(b"\0")

    def forged(self) -> _Process | None:
        """A process with lines the shim cannot have written (``_Process.forged``), if any."""
        return next((p for p in self.processes.values() if p.forged), None)

    def note_endings(self) -> None:
        """Mark the stepping processes that have ended without an exception line (``_alive``)."""
        for process in self.processes.values():
            if process.steps and not process.ended and process.exception is None and not _alive(process.pid):
                process.ended = True

    def ranks(self) -> list[_Process]:
        """The processes that stepped, rank order (a rank number first, then by PID), less those that ended while
        the command ran on and were no launcher's rank: a helper the script ran (a sanity check of two steps in a
        subprocess) stepped and exited, and waiting for its further steps hung every trial (issue 47)."""
        stepping = [p for p in self.processes.values() if p.steps and not (p.ended and not p.launched_rank)]
        return sorted(stepping, key=lambda p: (p.hello.rank if p.hello and p.hello.rank is not None else 1 << 30,
                                               p.pid))

    def expected_ranks(self) -> int:
        """How many ranks a step must hear from: the largest WORLD_SIZE a stepping process reported, else how many
        stepped (one, for a plain script)."""
        sizes = [p.hello.world_size for p in self.ranks() if p.hello is not None and p.hello.world_size]
        return max([len(self.ranks()), *sizes])

    def failure(self) -> _Process | None:
        """The first process whose exception reached its top (by time)."""
        failed = [p for p in self.processes.values() if p.exception is not None]
        return min(failed, key=lambda p: p.exception.t) if failed else None


class _Sampler:
    """The most each rank's data segment held, sampled from outside the rank (CPU backend).

    Why sampled: Linux keeps no high-water mark of the data segment (what RLIMIT_DATA caps), and the one
    isoprobe's own trials estimate it from (VmPeak) counts the address space a new malloc arena reserves and
    the cap never does; a script's threads map such arenas, which put that estimate at the cap at every batch.
    Read from /proc/PID/statm (one short line; its data field is the data segment and the stack) every
    millisecond by this process, so the rank itself runs nothing for it. A spike shorter than the interval can
    be missed; the peak a step holds while its activations live is not. Every ``_HEAP_EVERY`` samples it also
    reads the brk heap's size (``heap_bytes``): how far that moves within a step bounds what glibc can hold of
    it into the next step in another run's layout (a command's floor, ``search.margin``).
    """

    def __init__(self) -> None:
        self.most: dict[int, int] = {}
        self.since_step: dict[int, int] = {}  # the most since the step before, for report.steady.swing_bytes
        self.heap_since_step: dict[int, tuple[int, int]] = {}  # the heap's least and most since the step before
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.gone: set[int] = set()
        self.rounds = 0

    def sample(self, pids) -> None:
        self.rounds += 1
        heap_round = self.rounds % _HEAP_EVERY == 0
        for pid in pids:
            if pid in self.gone:
                continue
            try:
                with open(f"/proc/{pid}/statm", "rb") as handle:
                    data = int(handle.read().split()[5]) * self.page
            except (OSError, ValueError, IndexError):
                self.gone.add(pid)
                continue
            if data > self.most.get(pid, 0):
                self.most[pid] = data
            if data > self.since_step.get(pid, 0):
                self.since_step[pid] = data
            if heap_round:
                self.sample_heap(pid)

    def read_heap(self, pid: int) -> int | None:
        """The heap's size now (the seam a test scripts)."""
        return heap_bytes(pid)

    def sample_heap(self, pid: int) -> None:
        heap = self.read_heap(pid)
        if heap is not None:
            low, high = self.heap_since_step.get(pid, (heap, heap))
            self.heap_since_step[pid] = (min(low, heap), max(high, heap))

    def since_last_step(self, pid: int) -> int | None:
        """The most sampled since the last call for ``pid`` (a step's own peak), and start again; None: no sample."""
        return self.since_step.pop(pid, None)

    def heap_churn_since_last_step(self, pid: int) -> int | None:
        """How far the heap grew and shrank since the last call for ``pid`` (most minus least: a step's own churn);
        the next step's range starts from this reading. None: the heap could not be read."""
        heap = self.read_heap(pid)
        span = self.heap_since_step.pop(pid, None)
        if heap is None:
            return None
        low, high = span or (heap, heap)
        self.heap_since_step[pid] = (heap, heap)
        return max(high, heap) - min(low, heap)

    def peak(self, pid: int, reported: int | None) -> int | None:
        """A step's budget peak: the most sampled so far, or what the shim read at the step's end if more."""
        sampled = self.most.get(pid)
        if sampled is None:
            return reported
        return max(sampled, reported or 0)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (its state in /proc/PID/stat, after the command's name)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def heap_bytes(pid: int) -> int | None:
    """The size of a process's brk heap (glibc's main arena, where blocks under the mmap threshold live), from
    ``[heap]`` in the head of /proc/PID/maps; None: no heap there, or the process is gone."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            head = handle.read(_MAPS_HEAD_BYTES)
    except OSError:
        return None
    at = head.find(b" [heap]\n")
    if at < 0:
        return None
    line = head[head.rfind(b"\n", 0, at) + 1:at]
    try:
        low, high = line.split(b" ", 1)[0].split(b"-")
        return int(high, 16) - int(low, 16)
    except ValueError:
        return None


def run_command_trial(request: TrialRequest, events: "Events") -> None:
    """Run the command at the request's batch, judge its steps, end its tree, and write one ``TrialResult``."""
    spec = request.spec
    folder = Path(tempfile.mkdtemp(prefix="command-", dir=_scratch_folder()))
    tree = _Tree(folder)
    _open_gate(folder, _first_allowance(request))  # before the start: no rank may read a missing gate as 0 late
    stderr_path = folder / "stderr"
    process = _start(request, folder, stderr_path)
    judged = 0  # the trial's steps judged so far (every rank had done them)
    allowed = _first_allowance(request)
    peaks_by_rank: dict[int, list[int]] = {}
    step_seconds: list[float] = []
    verdict: tuple[Outcome, ErrorInfo | None, str] | None = None
    imported = False
    sampler = _Sampler() if not request.device.startswith("cuda") else None
    try:
        while verdict is None:
            ended = process.poll()
            tree.read(sampler)
            forged = tree.forged()
            if forged is not None:
                verdict = (Outcome.ERROR, _forged_error(forged, folder), f"step {judged + 1}")
                break
            failed = tree.failure()
            if failed is not None:
                verdict = (_rank_lost_verdict(process, tree, failed, judged, stderr_path)
                           or _exception_verdict(failed, judged, _exit_status_of(process, failed)))
                break
            if not imported and any(p.hello is not None for p in tree.processes.values()):
                imported = True  # torch's optimizers exist in the command: what a trial's 'imported' phase says
                events.emit(Imported(memory=MemoryReading()))
            tree.note_endings()
            ranks = tree.ranks()
            expected = tree.expected_ranks()
            peaks_by_rank = {pid: peaks for pid, peaks in peaks_by_rank.items() if pid in tree.processes
                             and tree.processes[pid] in ranks}
            while ranks and len(ranks) >= expected and min(len(p.steps) for p in ranks) > judged:
                judged += 1
                readings = [p.steps[judged - 1] for p in ranks]
                if judged == 1:  # the model exists once an optimizer has stepped: what a trial's phases say
                    first = readings[0]
                    events.emit(ModelBuilt(memory=MemoryReading(peak_rss=first.peak_bytes, rss=first.held_bytes)))
                step_seconds.append(max(r.seconds for r in readings))
                worst = max(readings, key=lambda r: r.budget_peak_bytes or r.peak_bytes or 0)
                events.emit(StepDone(step=judged, seconds=step_seconds[-1], peak_bytes=worst.peak_bytes,
                                     held_bytes=max((r.held_bytes or 0) for r in readings) or None,
                                     budget_peak_bytes=worst.budget_peak_bytes))
                for p in ranks:
                    peaks_by_rank[p.pid] = p.budget_peaks[:judged]
                over = _over_budget(request, ranks, judged)
                if over is not None:
                    verdict = (Outcome.OUT_OF_MEMORY, over, f"step {judged}")
                    break
                if _enough(request, judged, list(peaks_by_rank.values())):
                    verdict = (Outcome.FITS, None, "done")
                    break
                if judged + 1 > allowed:
                    allowed = judged + 1
                    _open_gate(folder, allowed)
            if verdict is not None or ended is None:
                if verdict is None:
                    _sample_for(_POLL_SECONDS, sampler, tree)
                continue
            tree.read(sampler)  # the last lines of a command that has ended
            failed = tree.failure()
            verdict = ((_rank_lost_verdict(process, tree, failed, judged, stderr_path)
                        or _exception_verdict(failed, judged, _exit_status_of(process, failed))) if failed is not None
                       else _exit_verdict(ended, judged, request, stderr_path))
    finally:
        _end_tree(process)
    if verdict[0] in (Outcome.FITS, Outcome.OUT_OF_MEMORY) and judged:
        refusal = _not_trained_at_batch(request, tree.ranks(), judged, tree.expected_ranks())
        if refusal is not None:  # a verdict about another batch than the one asked is no verdict on it
            verdict = (Outcome.ERROR, refusal, verdict[2])
    outcome, error, phase = verdict
    _copy_stderr_tail(stderr_path)
    ranks = tree.ranks()
    report = _readings(ranks, judged) if outcome is Outcome.FITS else _failure_readings(ranks)
    if error is not None and outcome is Outcome.ERROR:
        sys.stderr.write(error.traceback_tail)
    events.emit(TrialResult(outcome=outcome, phase=phase, step_seconds=step_seconds, error=error,
                            sources=_sources(tree.modules), reads=_reads(tree.reads, tree.modules),
                            command_ranks=len(ranks) or None, **report))


def _sample_for(seconds: float, sampler: _Sampler | None, tree: _Tree) -> None:
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
        time.sleep(min(_SAMPLE_SECONDS, left))


def _scratch_folder() -> str:
    """The trial's files go beside the child's own: its working directory is the executor's scratch folder,
    removed with the probe."""
    return os.getcwd()


def _first_allowance(request: TrialRequest) -> int:
    """Steps every rank may run before its first wait: the request's, since none of them can end the trial early
    (a steady rule judges from the request's steps on)."""
    return request.steps or request.spec.search.steps


def _over_budget(request: TrialRequest, ranks: list[_Process], judged: int) -> ErrorInfo | None:
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
        if step.budget_peak_bytes is None or step.budget_peak_bytes <= budget:
            continue
        parts = ""
        if step.outside_bytes is not None:
            need = step.budget_peak_bytes - step.outside_bytes
            parts = (f" (the allocator's need {_mib(need)} + {_mib(step.outside_bytes)} outside it: context, "
                     "libraries, kernels, NCCL)")
        message = (f"{process.name} of the command held {_mib(step.budget_peak_bytes)} of {step.device} after "
                   f"optimizer step {judged}{parts}, above the {_mib(budget)} budget: it would not fit on a card "
                   "of the budget's size")
        return ErrorInfo(type="CommandOverBudget", message=message[:MESSAGE_CHARS], traceback_tail="")
    return None


def _not_trained_at_batch(request: TrialRequest, ranks: list[_Process], judged: int, world: int
                          ) -> ErrorInfo | None:
    """An error when none of the trial's judged steps, on any rank, trained at the batch asked
    (``child.trained_batch``): the trial would credit a batch the script never ran. None: it did, or no forward
    was seen to judge by."""
    steps = [p.steps[k].forwards for p in ranks for k in range(min(judged, len(p.steps)))]
    if trial_trained_at(request.batch_size, steps, world) is not False:
        return None
    placeholder = PLACEHOLDER if request.spec.batch_from == "argument" else f"${BATCH_ENV}"
    shown = [step.forwards for step in ranks[0].steps[:judged]]
    message = not_trained_message(request.batch_size, shown, f"{placeholder} = {request.batch_size}")
    return ErrorInfo(type="CommandBatchNotTrained", message=message[:MESSAGE_CHARS], traceback_tail="")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _enough(request: TrialRequest, judged: int, peaks_by_rank: list[list[int]]) -> bool:
    """As ``StepHook.after_step``: the request's steps, or with a steady rule every rank steady (or at the cap)."""
    rule = request.steady
    if rule is None:
        return judged >= (request.steps or request.spec.search.steps)
    return all(steady.should_stop(peaks, rule) for peaks in peaks_by_rank)


def _open_gate(folder: Path, allowed: int) -> None:
    """Let every rank finish ``allowed`` steps (written whole: a rank never reads half a number)."""
    temporary = folder / f".{GATE_FILE}.{allowed}"
    temporary.write_text(str(allowed))
    os.replace(temporary, folder / GATE_FILE)


def _command_environment(request: TrialRequest, folder: Path) -> dict[str, str]:
    """This child's environment (the backend's variables: the malloc threshold, no GPU on the CPU backend, the
    allocator setting) for the command, less isoprobe's own wiring, plus the batch and the shim."""
    env = {k: v for k, v in os.environ.items() if k not in _OWN_VARIABLES}
    package_root = str(Path(__file__).resolve().parents[2])
    user_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != package_root]
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM_FOLDER), *user_path])
    env[SHIM_DIR_ENV] = str(folder)
    env[BATCH_ENV] = str(request.batch_size)
    if request.device.startswith("cuda") and request.memory_budget_bytes is not None:
        env[SHIM_CUDA_BUDGET_ENV] = str(request.memory_budget_bytes)
        outside = request.cuda_outside_bytes  # the environment check's figure, where the parent had one
        if outside:
            env[SHIM_CUDA_OUTSIDE_ENV] = str(int(outside))
    return env


def _start(request: TrialRequest, folder: Path, stderr_path: Path) -> subprocess.Popen:
    spec = request.spec
    budget = data_cap() if not request.device.startswith("cuda") else None

    def prepare() -> None:
        # The cap of the command is the budget itself: the credit for isoprobe's own modules was this process's.
        if budget is not None:
            resource.setrlimit(resource.RLIMIT_DATA, (budget, budget))

    with open(folder / "stdout", "wb") as out, open(stderr_path, "wb") as err:
        return subprocess.Popen(argv_for(spec.command, spec.shell, request.batch_size), cwd=spec.command_dir,
                                env=_command_environment(request, folder), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, preexec_fn=prepare)


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
    wait_slurm_steps_gone(steps, _STEP_GONE_SECONDS, recancel_after=_STEP_RECANCEL_SECONDS,
                          recancel_every=_STEP_RECANCEL_SECONDS)


#: How long the command's own process gets to exit after an exception that is the script's error (not out of
#: memory) was seen, for its exit status. Generous: a process that imported torch takes 1.2 to 2 s to finalize
#: after its exception on an idle machine here, and 10.4 s once (measured: the excepthook to the process's end,
#: torch 2.14.1); 2 s and then 10 s were too short on CI's two busy cores. The wait only ever delays a verdict that
#: ends the search anyway. An out-of-memory verdict does not wait: the search goes on, and the status adds nothing.
_EXIT_WAIT_SECONDS = 30.0


def _exit_status_of(process: subprocess.Popen, failed: _Process) -> int | None:
    """The command's exit status when the process that failed is the command itself and its exception is the
    script's error (a rank's failure is judged at once: the launcher's own exit comes later, after its other ranks;
    an allocation failure is judged at once too: the search goes on, and the status adds nothing to it)."""
    if failed.pid != process.pid:
        return None
    exception = failed.exception
    if exception is not None and classify_exception(exception.types, exception.message) is Outcome.OUT_OF_MEMORY:
        return process.poll()
    try:
        return process.wait(timeout=_EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        return None


def _rank_lost_verdict(process: subprocess.Popen, tree: _Tree, failed: _Process, judged: int, stderr_path: Path
                       ) -> tuple[Outcome, ErrorInfo, str] | None:
    """A crash, naming the lost rank, when ``failed``'s error is a transport's whose peer is gone and a rank of the
    gang was lost without an error of its own (``child.rank_loss``); None: the failure is what it says."""
    exception = failed.exception
    if exception is None or not peer_loss(exception.message):
        return None
    lost = [p for p in tree.processes.values()
            if p is not failed and p.hello is not None and p.exception is None and not _alive(p.pid)]
    try:  # the launcher's report of its ranks comes when it ends (torchrun: after it has stopped the others)
        process.wait(timeout=_EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    report = killed_rank(_tail(stderr_path, lines=200), pid=lost[0].pid if lost else None)
    if report is None and lost:
        report = killed_rank(_tail(stderr_path, lines=200), rank=lost[0].hello.rank)
    if not lost and report is None:
        return None
    name = lost[0].name if lost else f"rank {report.rank} (pid {report.pid})"
    steps = len(lost[0].steps) if lost else exception.steps
    how = f"was killed by {report.signal_name}" if report is not None else "ended"
    message = lost_message(name, steps, how, failed.name, exception.message)
    tail = "\n".join(exception.traceback.splitlines()[-_TRACEBACK_LINES:]) + "\n"
    return Outcome.CRASHED, ErrorInfo(type="RankLost", message=message[:MESSAGE_CHARS], traceback_tail=tail), \
        f"step {judged + 1}"


def _forged_error(process: _Process, folder: Path) -> ErrorInfo:
    message = (f"the trial's folder holds lines for {process.name} that isoprobe's shim cannot have written (a "
               "second hello, or a step out of sequence): something in the command writes into the folder "
               f"${SHIM_DIR_ENV} names ({folder}), so no step it reports can be trusted. Leave that folder to "
               "isoprobe (docs/command.md: what a command can and cannot forge)")
    return ErrorInfo(type="CommandForgedLines", message=message[:MESSAGE_CHARS], traceback_tail="")


def _exception_verdict(failed: _Process, judged: int, status: int | None = None) -> tuple[Outcome, ErrorInfo, str]:
    exception = failed.exception
    outcome = classify_exception(exception.types, exception.message)
    tail = "\n".join(exception.traceback.splitlines()[-_TRACEBACK_LINES:]) + "\n"
    where = f"in {failed.name} of the command" + (f" (thread {exception.thread})" if exception.thread else "")
    if status is not None:
        where += f", exit status {status}"
    message = f"{exception.message} [{where}, after {exception.steps} optimizer step(s)]"
    error = ErrorInfo(type=exception.type.removeprefix("builtins."), message=message[:MESSAGE_CHARS],
                      traceback_tail=tail)
    return outcome, error, f"step {judged + 1}" if judged or exception.steps else "started"


def _exit_verdict(status: int, judged: int, request: TrialRequest, stderr_path: Path
                  ) -> tuple[Outcome, ErrorInfo, str]:
    """The command ended before the trial had run enough, and no exception line says why."""
    asked = request.steps or request.spec.search.steps
    tail = _tail(stderr_path)
    phase = f"step {judged + 1}" if judged else "started"
    if status == 0 and _shows_allocation_failure(tail):
        # issue 47: a script that catches its own out-of-memory (a try/except around the step, a finder of its own)
        # and exits 0 said "its optimizer may not be a torch.optim.Optimizer". It ran out at this batch.
        message = (f"the command exited with status 0 after {judged} optimizer step(s), before the trial had run "
                   "enough, and its stderr shows an allocation failure: it caught its own out-of-memory error at this "
                   "batch (a try/except around the step, or a batch-size finder of its own) and ended")
        return Outcome.OUT_OF_MEMORY, ErrorInfo(type="CommandOutOfMemory", message=message, traceback_tail=tail), phase
    if status == 0:
        if judged == 0:
            message = ("the command exited with status 0 without an optimizer step that isoprobe could see: its "
                       "optimizer may not be a torch.optim.Optimizer, or it ran no training (check the command)")
        else:
            message = (f"the command ended on its own (status 0) after {judged} optimizer step(s), before the "
                       f"{asked} a trial needs: a max-steps setting of its own, or too little data for that many "
                       "batches at this size; let it run longer (the trial ends it)")
        return Outcome.ERROR, ErrorInfo(type="CommandEnded", message=message, traceback_tail=tail), phase
    how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
    report = killed_rank(_tail(stderr_path, lines=200)) if status != 0 else None
    if report is not None and not _shows_allocation_failure(tail):  # a launcher's rank lost to a signal
        message = lost_message(f"rank {report.rank} (pid {report.pid})", judged, f"was killed by "
                               f"{report.signal_name}", None, None) + f" (the launcher {how})"
        return Outcome.CRASHED, ErrorInfo(type="RankLost", message=message, traceback_tail=tail), phase
    if _shows_allocation_failure(tail):
        message = f"the command {how} after {judged} optimizer step(s), and its stderr shows an allocation failure"
        return Outcome.OUT_OF_MEMORY, ErrorInfo(type="CommandOutOfMemory", message=message,
                                                traceback_tail=tail), phase
    message = f"the command {how} after {judged} optimizer step(s) (its stderr's last lines follow)"
    return Outcome.ERROR, ErrorInfo(type="CommandFailed", message=message, traceback_tail=tail), phase


#: Lines of a command's stderr that count as its last words when no traceback is there.
_LAST_WORDS_LINES = 6


def last_words(text: str) -> str:
    """What a command said as it ended: its last traceback (from the last 'Traceback' line on), else its last
    few lines. Not the whole tail: a script that mentions ``torch.OutOfMemoryError`` as it starts (a log line, its
    own handler's banner) and then fails on a missing file ran out of nothing (issue 47: every batch was "out of
    memory", and the probe said every trial's peak kept rising)."""
    at = text.rfind("Traceback (most recent call last)")
    if at >= 0:
        return text[at:]
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-_LAST_WORDS_LINES:])


def _shows_allocation_failure(text: str) -> bool:
    """The command's last words show an allocation failure: an allocator's wording, or NCCL's failed cudaMalloc."""
    text = last_words(text)
    lowered = text.lower()
    return (any(marker in text for marker in _OOM_STDERR_MARKERS)
            or any(marker in lowered for marker in _NCCL_OOM_MARKERS)
            or ("ncclunhandledcudaerror" in lowered and "out of memory" in lowered))


def _tail(path: Path, lines: int = _TRACEBACK_LINES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _STDERR_TAIL_CHARS))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:]) + "\n"


def _copy_stderr_tail(path: Path) -> None:
    """The command's last words into this child's stderr, where the parent reads a trial's evidence."""
    tail = _tail(path)
    if tail.strip():
        sys.stderr.write(tail)
        sys.stderr.flush()


def _readings(ranks: list[_Process], judged: int) -> dict:
    """The trial's peaks: the worst rank's at the last judged step (each rank's budget is its own)."""
    last = [p.steps[judged - 1] for p in ranks if len(p.steps) >= judged]
    if not last:
        return {}
    worst = max(last, key=lambda r: r.budget_peak_bytes or r.peak_bytes or 0)
    readings = {"peak_bytes": worst.peak_bytes, "budget_peak_bytes": worst.budget_peak_bytes,
                "file_resident_bytes": worst.file_resident_bytes, "budget_swing_bytes": _swing(ranks, judged),
                "heap_churn_bytes": _heap_churn(ranks, judged)}
    return readings | _cuda_readings(worst)


def _cuda_readings(step: ShimStep) -> dict:
    """CUDA: the worst rank's allocated peak and retries, in ``TrialResult``'s fields (none on the CPU backend)."""
    if not step.device.startswith("cuda"):
        return {}
    return {"peak_allocated_bytes": step.peak_allocated_bytes, "alloc_retries": step.alloc_retries}


def _failure_readings(ranks: list[_Process]) -> dict:
    steps = [p.steps[-1] for p in ranks if p.steps]
    if not steps:
        return {}
    readings = {"peak_bytes": max((s.peak_bytes or 0) for s in steps) or None, "budget_swing_bytes": _swing(ranks)}
    cuda = [s for s in steps if s.device.startswith("cuda") and s.budget_peak_bytes is not None]
    if cuda:  # the reading that ended an over-budget trial, in the budget's units
        readings["budget_peak_bytes"] = max(s.budget_peak_bytes for s in cuda)
    return readings


def _swing(ranks: list[_Process], judged: int | None = None) -> int | None:
    """The largest swing of any rank's own step peaks (report.steady.swing_bytes), over its judged steps."""
    swings = [swing for p in ranks if (swing := steady.swing_bytes(p.own_peaks[:judged])) is not None]
    return max(swings) if swings else None


def _heap_churn(ranks: list[_Process], judged: int) -> int | None:
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
