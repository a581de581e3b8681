"""The shim inside the user's processes, and the supervisor's reading of it (issue 36).

Why: the shim runs in every Python process a command trial starts, so it must be invisible where it has nothing
to do (no trial variable, no torch), run the ``sitecustomize`` it hides, and write lines the supervisor takes; the
supervisor must judge a gang by every rank and classify an ending it did not ask for, never guess. The processes
here are plain Python without torch (fast); tests/integration/test_command.py runs real training scripts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from isoprobe.child.command_trial import supervisor
from isoprobe.child.command_trial import tree as command_tree  # noqa: E402
from isoprobe.child.command_trial import verdicts as command_verdicts
from isoprobe.protocol.command import SHIM_FOLDER, ShimException, ShimHello, ShimStep, parse_lines
from isoprobe.protocol.wiring import SHIM_DIR_ENV
from isoprobe.pipeline.plausibility import Asked, over_budget
from isoprobe.protocol.messages import TrialRequest, TrialResult
from isoprobe.report.outcomes import Outcome
from isoprobe.spec.model import Spec
from isoprobe.system import primitives


@pytest.fixture(autouse=True)
def any_pid_is_of_the_trial(monkeypatch):
    """The lines here are written for made-up PIDs: each is taken as a process of the trial (the check itself is
    tests/unit/test_forged_steps.py's)."""
    monkeypatch.setattr(command_tree.Tree, "of_this_trial", lambda self, pid, hello: True)


def run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def shim_env(tmp_path: Path, trial: Path | None, *more_path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", SHIM_DIR_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM_FOLDER), *more_path])
    if trial is not None:
        env[SHIM_DIR_ENV] = str(trial)
    return env


def test_the_sitecustomize_it_hides_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    done = run_python("import os, sys; print(os.environ.get('THEIRS_RAN'), sys.modules['sitecustomize'].__file__)",
                      shim_env(tmp_path, tmp_path, str(theirs)), tmp_path)
    ran, file = done.stdout.split()
    assert done.returncode == 0 and ran == "yes" and file == str(theirs / "sitecustomize.py"), done.stderr


def test_without_the_trial_variable_the_shim_does_nothing(tmp_path):
    check = ("import sys; print(any(type(f).__name__ == '_IsoprobeOptimizerFinder' for f in sys.meta_path), "
             "'_isoprobe_shim' in sys.modules)")
    done = run_python(check, shim_env(tmp_path, None), tmp_path)
    assert done.stdout.split() == ["False", "False"] and not list(tmp_path.glob("p*.jsonl"))
    # In a trial: the finder waits in front of the import system, and the shim's module is not loaded until torch
    # imports its optimizers (what it loads at start-up changes the heap the trial measures).
    trial = run_python(check, shim_env(tmp_path, tmp_path), tmp_path)
    assert trial.stdout.split() == ["True", "False"], trial.stderr


def test_an_exception_at_the_top_is_written_as_the_supervisor_reads_it(tmp_path):
    done = run_python("raise MemoryError('no room for the batch')", shim_env(tmp_path, tmp_path), tmp_path)
    assert done.returncode == 1 and "MemoryError" in done.stderr  # the user's own traceback still shows
    [file] = tmp_path.glob("p*.jsonl")
    [line] = parse_lines(file.read_bytes())
    assert isinstance(line, ShimException) and "MemoryError" in line.types and line.steps == 0
    assert "no room for the batch" in line.traceback


def test_a_line_that_does_not_match_is_dropped_not_guessed():
    good = {"kind": "step", "pid": 1, "step": 1, "seconds": 0.1, "device": "cpu", "t": 1.0}
    data = b"\n".join(json.dumps(x).encode() for x in (good, {**good, "extra": 1}, {**good, "step": 0})) + b"\n{"
    assert [type(x) for x in parse_lines(data)] == [ShimStep]


def write_lines(folder: Path, pid: int, *lines: dict) -> None:
    with open(folder / f"p{pid}.jsonl", "a") as handle:
        for line in lines:
            handle.write(json.dumps({"pid": pid, **line}) + "\n")


def hello(rank=None, world=None):
    return {"kind": "hello", "ppid": 1, "rank": rank, "local_rank": rank, "world_size": world, "argv": [], "t": 1.0}


def step(number, peak):
    return {"kind": "step", "step": number, "seconds": 0.5, "peak_bytes": peak, "held_bytes": peak // 2,
            "budget_peak_bytes": peak, "device": "cpu", "t": 1.0 + number}


def test_a_gang_step_waits_for_every_rank_the_launcher_started(tmp_path):
    tree = command_tree.Tree(tmp_path)
    write_lines(tmp_path, 10, hello())  # torchrun's agent: imports torch, never steps
    write_lines(tmp_path, 11, hello(0, 2), step(1, 100), step(2, 110))
    tree.read()
    assert [p.pid for p in tree.ranks()] == [11] and tree.expected_ranks() == 2  # rank 1 has not stepped yet
    write_lines(tmp_path, 12, hello(1, 2), step(1, 120))
    tree.read()
    ranks = tree.ranks()
    assert [p.pid for p in ranks] == [11, 12] and tree.expected_ranks() == 2
    assert min(len(p.steps) for p in ranks) == 1


def test_the_first_rank_to_fail_is_named_and_its_exception_decides(tmp_path):
    tree = command_tree.Tree(tmp_path)
    write_lines(tmp_path, 11, hello(0, 2), step(1, 100),
                {"kind": "exception", "types": ["RuntimeError", "Exception"], "type": "builtins.RuntimeError",
                 "message": "Connection closed by peer", "traceback": "...", "thread": None, "steps": 1, "t": 9.0})
    write_lines(tmp_path, 12, hello(1, 2), step(1, 100),
                {"kind": "exception", "types": ["OutOfMemoryError", "RuntimeError", "Exception"],
                 "type": "torch.OutOfMemoryError", "message": "DefaultCPUAllocator: can't allocate memory",
                 "traceback": "Traceback...\n", "thread": None, "steps": 1, "t": 5.0})
    tree.read()
    failed = tree.failure()
    outcome, error, phase = command_verdicts.exception_verdict(failed, judged=1)
    assert outcome is Outcome.OUT_OF_MEMORY and "rank 1 (pid 12)" in error.message and phase == "step 2"


class _ScriptedSampler(command_tree.Sampler):
    """The supervisor's sampler with the readings it would take from /proc given beforehand: ``since[pid]``, the
    most each process's data segment held since its step line before."""

    def __init__(self, since: list[int], heaps: list[int | None] = ()) -> None:
        super().__init__()
        self.next = list(since)
        self.heaps = list(heaps)

    def read_heap(self, pid: int) -> int | None:
        return self.heaps.pop(0) if self.heaps else None

    def sample(self, pids) -> None:
        for pid in pids:
            if self.next:
                data = self.next.pop(0)
                self.most[pid] = max(self.most.get(pid, 0), data)
                self.since_step[pid] = max(self.since_step.get(pid, 0), data)


def test_a_steps_own_peak_is_what_was_sampled_since_the_step_before_and_a_swing_comes_back_down(tmp_path):
    """The Lightning script's shape: one step needed 4 MiB more than the steps after it. Each step's line read on
    its own takes the samples since the line before (its own peak); the running peak keeps rising as before, and
    the trial's swing is the 4 MiB. Two lines read at once share their samples, so neither's own peak is known."""
    mib = 1 << 20
    tree = command_tree.Tree(tmp_path)
    sampler = _ScriptedSampler([1078 * mib, 1082 * mib, 1086 * mib, 1082 * mib, 1082 * mib, 1082 * mib])
    write_lines(tmp_path, 11, hello())
    for number in range(1, 6):
        write_lines(tmp_path, 11, step(number, 900 * mib))
        tree.read(sampler)
    [rank] = tree.ranks()
    assert rank.own_peaks == [1078 * mib, 1082 * mib, 1086 * mib, 1082 * mib, 1082 * mib]
    assert rank.budget_peaks == [1078 * mib, 1082 * mib, 1086 * mib, 1086 * mib, 1086 * mib]  # running, as before
    assert supervisor._readings([rank], 5)["budget_swing_bytes"] == 4 * mib
    assert supervisor._readings([rank], 3)["budget_swing_bytes"] == 0  # judged steps only: no later step was lower
    write_lines(tmp_path, 11, step(6, 900 * mib), step(7, 900 * mib))
    tree.read(sampler)
    assert rank.own_peaks[5:] == [None, None]


def test_a_steps_heap_churn_is_the_range_its_heap_was_read_in_and_the_first_step_is_left_out(tmp_path):
    """The Lightning script's shape: each step builds its input batch (4 MiB of small blocks) on the brk heap and
    frees it. The heap is read at each step's line and between (here one reading between lines, as _HEAP_EVERY
    samples would take several); a step's churn is the range since the step before, starting from that step's
    last reading. The first step's growth (what later steps reuse) is not churn; two lines read at once, unknown."""
    mib = 1 << 20
    tree = command_tree.Tree(tmp_path)
    sampler = _ScriptedSampler([])
    write_lines(tmp_path, 11, hello())
    heaps = [(None, 50 * mib), (54 * mib, 50 * mib), (54 * mib, 51 * mib), (51 * mib, 51 * mib)]
    for number, (between, at_line) in enumerate(heaps, start=1):
        if between is not None:
            sampler.heaps.append(between)
            sampler.sample_heap(11)
        write_lines(tmp_path, 11, step(number, 900 * mib))
        sampler.heaps.append(at_line)
        tree.read(sampler)
    [rank] = tree.ranks()
    assert rank.heap_churns == [0, 4 * mib, 4 * mib, 0]
    assert supervisor._readings([rank], 4)["heap_churn_bytes"] == 4 * mib
    assert supervisor._readings([rank], 1)["heap_churn_bytes"] is None  # the first step only
    write_lines(tmp_path, 11, step(5, 900 * mib), step(6, 900 * mib))
    tree.read(sampler)
    assert rank.heap_churns[4:] == [None, None]


def test_the_heap_is_read_from_the_head_of_the_maps_of_a_live_process_and_is_none_for_no_process():
    import subprocess
    import sys

    # A fresh interpreter (this one's heap has room to spare): it says when it is up, and when it holds 50 MB of
    # small blocks, which come from the brk heap.
    grow = ("import sys; print(flush=True); sys.stdin.readline(); held = [bytearray(1000) for _ in range(50000)]; "
            "print(flush=True); sys.stdin.readline()")
    with subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as child:
        child.stdout.readline()
        before = command_tree.heap_bytes(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        child.stdout.readline()
        after = command_tree.heap_bytes(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
    assert before is not None and after >= before + 40 * 10**6, (before, after)
    assert command_tree.heap_bytes(2**22 + 1) is None  # above the kernel's largest pid_max: never a process


def test_the_worst_ranks_mapped_file_pages_go_with_its_readings_and_the_resident_check_leaves_them_out(tmp_path):
    """On CI (a fresh install: every library page in the page cache, and the kernel maps a faulting page's cached
    neighbours too) a torchrun rank's resident peak was 937 MiB under an 894 MiB budget at batch 8, far below the
    edge: without its mapped files' pages, as isoprobe's own trials are judged, it is well inside."""
    mib = 1 << 20
    tree = command_tree.Tree(tmp_path)
    write_lines(tmp_path, 11, hello(0, 2), {**step(1, 700 * mib), "peak_bytes": 930 * mib,
                                            "file_resident_bytes": 200 * mib, "held_budget_bytes": 640 * mib})
    write_lines(tmp_path, 12, hello(1, 2), {**step(1, 710 * mib), "peak_bytes": 937 * mib,
                                            "file_resident_bytes": 210 * mib, "held_budget_bytes": 650 * mib})
    tree.read()
    readings = supervisor._readings(tree.ranks(), 1)
    # The base reading (issue 49) is the worst rank's own: what it held right after the step, with its peak.
    assert readings == {"peak_bytes": 937 * mib, "budget_peak_bytes": 710 * mib, "file_resident_bytes": 210 * mib,
                        "budget_swing_bytes": None, "heap_churn_bytes": None, "base_bytes": 650 * mib}
    asked = Asked(steps=1, backend="cpu", budget_bytes=894 * mib)
    assert over_budget(TrialResult(outcome=Outcome.FITS, phase="done", **readings), asked) is None
    unknown_files = TrialResult(outcome=Outcome.FITS, phase="done", **{**readings, "file_resident_bytes": None})
    assert "resident peak" in over_budget(unknown_files, asked)


def request(steps=3):
    spec = Spec.model_validate({"command": "python t.py {batch_size}", "command_dir": "/tmp"})
    return TrialRequest(spec=spec, batch_size=4, device="cpu", steps=steps)


@pytest.mark.parametrize("status, judged, stderr, outcome, words", [
    (0, 1, "", Outcome.ERROR, "ended on its own (status 0) after 1 optimizer step(s), before the 3"),
    (0, 0, "", Outcome.ERROR, "without an optimizer step that isoprobe could see"),
    # issue 47: a script that catches its MemoryError and exits 0 ran out of memory at this batch, not "no optimizer"
    (0, 0, "caught: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes", Outcome.OUT_OF_MEMORY,
     "caught its own out-of-memory error"),
    (0, 2, "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate", Outcome.OUT_OF_MEMORY,
     "after 2 optimizer step(s)"),
    (1, 2, "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried", Outcome.OUT_OF_MEMORY,
     "allocation failure"),
    (-9, 0, "", Outcome.ERROR, "killed by SIGKILL"),
    # issue 47: a mention of the allocator's words long before the end is not how the command ended
    (1, 2, "handler ready for torch.OutOfMemoryError\n" + "step ok\n" * 10 + "error: data/train.bin: no such file",
     Outcome.ERROR, "exited with status 1"),
    (0, 0, "will catch MemoryError and halve\n" + "loading\n" * 10 + "no optimizer in this config, done",
     Outcome.ERROR, "without an optimizer step"),
    (2, 0, "usage: t.py [-h]\nt.py: error: unrecognized arguments: --bad", Outcome.ERROR, "exited with status 2"),
])
def test_an_ending_nobody_asked_for_is_classified_from_what_it_left(tmp_path, status, judged, stderr, outcome, words):
    (tmp_path / "stderr").write_text(stderr)
    got, error, _ = command_verdicts.exit_verdict(status, judged, request(), tmp_path / "stderr")
    assert got is outcome and words in error.message
    assert stderr.splitlines()[-1:] == error.traceback_tail.splitlines()[-1:] if stderr else True


def test_the_steps_a_commands_srun_started_are_found_by_srun_host_and_pid():
    """``isoprobe run -- srun python train.py``: the step's tasks run under each node's slurmstepd and outlive a
    killed srun, so the trial ends the step through Slurm; it is found by the srun that started it, on this host
    (``scontrol show step -o``'s SrunHost:Pid, as Slurm 22.05 prints it), never a step of anyone else's."""
    listing = (
        "StepId=2.0 UserId=0 StartTime=2026-11-27T04:34:05 State=RUNNING NodeList=n[1-2] Tasks=2 Name=python "
        "SrunHost:Pid=n1:28763\n"
        "StepId=2.1 UserId=0 State=RUNNING NodeList=n1 Tasks=1 Name=sleep SrunHost:Pid=n1:999\n"
        "StepId=3.0 UserId=0 State=RUNNING NodeList=n2 Tasks=1 Name=python SrunHost:Pid=n2.cluster:28763\n"
        "StepId=2.batch UserId=0 State=RUNNING NodeList=n1 Tasks=1 Name=batch\n")
    assert primitives.steps_of_sruns(listing, {28763, 4}, "n1") == ["2.0"]
    assert primitives.steps_of_sruns(listing, {28763}, "n2.cluster") == ["3.0"]
    assert primitives.steps_of_sruns(listing, set(), "n1") == []


@pytest.mark.parametrize("types, waits", [(["ValueError", "Exception"], True),
                                          (["OutOfMemoryError", "RuntimeError"], False)])
def test_the_commands_exit_status_is_waited_for_after_its_error_but_not_after_out_of_memory(types, waits):
    """A script's error ends the search, so its verdict waits (up to command_verdicts.EXIT_WAIT_SECONDS) for the exit status a
    process that imported torch takes seconds to reach; an allocation failure is judged at once, as the search
    goes on and the status adds nothing."""
    import time

    process = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"])
    failed = command_tree.Process(pid=process.pid, exception=ShimException(
        kind="exception", pid=process.pid, types=types, type=types[0], message="m", traceback="", thread=None,
        steps=0, t=0.0))
    began = time.monotonic()
    status = command_verdicts.exit_status_of(process, failed)
    seconds = time.monotonic() - began
    process.wait()
    assert (status, seconds >= 0.4) == ((3, True) if waits else (None, False)), (status, seconds)
