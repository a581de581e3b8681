"""A distributed trial as one Slurm job step across the allocation's nodes, judged as a local gang is.

With ``distributed.launcher`` resolved to srun (``srun_plan.choose_launcher``),
each gang trial is one ``srun --ntasks=WORLD`` step (``srun_plan.srun_command``);
every rank runs ``child.srun_rank``, which caps it, gives it its files and GPU and
runs the child entry a local rank runs. What stays the same as the local gang
(``executors.gang``): the requests (one per rank, a ``FileStore`` rendezvous in
the trial's folder), the events files, the rule that the first rank to fail
ends the gang (``gang.first_failure``), the timeout from the moment every rank
finished its imports, the laggard rule at a timeout, and so the classification
(``pipeline.trials``). What Slurm adds: the ranks run on every node, and the
step is ended through Slurm (``scancel --ctld --signal=KILL JOB.STEP``, never a
terminate request that arms the node's ``UnkillableStepTimeout``: ``primitives.KILL_THROUGH_SLURMCTLD``;
srun's own ``--kill-on-bad-exit`` for a rank that ends badly).

Supervision. srun itself runs under a keeper (``system.keeper``) with a
lifeline, as every local child does (``srun_launch.start_step``). If isoprobe dies (SIGKILL included) the
keeper first runs ``scancel`` of the step (its ``--on-stop`` file, written as
soon as the step's id is known), then SIGKILLs srun: killing srun alone is not
enough (measured on Slurm 22.05: with the ranks' output going to files, the
step and its tasks stayed after srun was SIGKILLed).
A step that Slurm refuses (more tasks than the allocation has, a node down) runs
no rank: that is no outcome of the batch's. It is run once more, and refused
again it stops the probe with Slurm's own words (``ProbeError``, exit 4).

Ahead (``distributed.steps_ahead``, off by default: docs/slurm.md says why).
A step's ranks import Python and torch cold, seconds a trial (measured on the
two-node test cluster: 2.4 to 2.6 s of a 3 to 15 s trial), where a local rank
is forked warm. So while a
trial runs, the next trial's step is already started beside it (``srun
--overlap``): its ranks import at idle priority, touch no device, and wait
for one line that srun forwards to each of them once their requests are
written (``child.srun_rank --ahead``). The first trial's step is started so
while the environment check runs (``prestart``). The next trial then starts
with its ranks warm; its timeout runs from when they have their requests, as any
trial's. A step started ahead is only ever used under the conditions it was
started with (the ranks, the cap, the preload, the device); one that ended
or was lost while it waited is ended and replaced by a step started on
demand, and one that was never needed is ended when the probe ends (its
ranks read end of file and exit; then ``_end``, as any step's end).

Requirement: the trial folder (under ``TMPDIR``) must be on a filesystem every
node of the allocation sees: the ranks read their requests and write their
events, their ends and the store there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace

from isoprobe.errors import ProbeError, Terminated
from isoprobe.executors import ChildRun, Conditions, run_through_reporting
from isoprobe.executors.child_process import STOP_SECONDS
from isoprobe.executors.gang import first_failure, is_gang, laggard
from isoprobe.executors.local import LocalExecutor
from isoprobe.executors.processes import (
    VERDICT_EXIT_GRACE_SECONDS,
    import_timeout,
    signals_deferred,
    write_atomically,
)
from isoprobe.executors.rounds import earned_timeout, steps_done
from isoprobe.executors.srun_launch import ON_STOP_FILE, start_step
from isoprobe.executors.srun_nodes import daemon_lost_error, name_lost_nodes, task_prolog_words
from isoprobe.executors.srun_plan import advice, node_failed, refusal
from isoprobe.executors.srun_step import _ahead_key, _close_turn, _Step, rank_run, step_states
from isoprobe.protocol.messages import (
    RankAssignment,
    TrialRequest,
    TrialResult,
    Warm,
    last_of,
    read_events,
)
from isoprobe.system.primitives import (
    CLIENT_SECONDS,
    KILL_THROUGH_SLURMCTLD,
    ask_slurm,
    scancel_now,
    wait_slurm_steps_gone,
)

#: How often the step's ranks are looked at (as the local gang's ``POLL_SECONDS``).
POLL_SECONDS = 0.02
#: Times a step Slurm refused is asked for again before the probe stops: once more, as a lost fork server's trial.
REFUSALS_TOLERATED = 1
#: How long srun gets to end on its own once its ranks have ended, or after ``scancel``, before it is killed.
SRUN_END_SECONDS = 10.0
#: How long srun may take to start the step's first rank (a wrapper that writes its task file first thing). Slurm
#: starts a step's tasks in well under a second; srun that still waits is waiting for what the allocation no longer
#: has (measured on Slurm 22.05: in a job that had lost a node, a step of the job's first size waited silently).
STEP_START_SECONDS = 120.0
#: How long a step Slurm lost right at its launch may take to show its id (a rank on a healthy node writes it), so
#: that it can be cancelled through Slurm rather than left to srun, which waits on.
LOST_STEP_ID_SECONDS = 3.0
#: How long ``squeue -s`` may keep listing a step that was ended before isoprobe says so. Generous: its tasks were
#: killed, and what is left is Slurm's own bookkeeping, which a loaded machine can hold up (seen on CI's two busy
#: cores: a two-node step still listed 15 s after its end, gone a few seconds later). The wait only delays the next
#: trial, whose srun would wait for the step's CPUs anyway; the probe still never starts a step beside it.
STEP_GONE_SECONDS = 60.0
#: How often the wait for a listed step asks Slurm again to kill its tasks and cancel it.
STEP_RECANCEL_SECONDS = 5.0
#: What a step's folder says of the trial it ran (its name and batch): a step started ahead is named before its
#: trial is known (``aheadNNN.step``), so a reader (benchmarks/studies/step_trial_time.py) finds the trial here.
TRIAL_FILE = "trial.json"
#: Steps started ahead that may end or be lost while they wait before the probe stops starting them: each such step
#: is replaced by one started on demand, and a Slurm that refuses ``--overlap`` would otherwise cost a step a trial.
AHEAD_FAILURES_TOLERATED = 1


class SrunGangExecutor:
    """Gang trials as Slurm job steps; the environment check and other requests run locally (``local``)."""

    def __init__(
        self,
        local: LocalExecutor,
        *,
        nodes: int | None,
        srun: str = "srun",
        scancel: str = "scancel",
        squeue: str = "squeue",
        scontrol: str = "scontrol",
        ahead: bool = False,
        world: int | None = None,
        sinfo: str = "sinfo",
    ):
        self.local = local
        self.nodes = nodes
        self.world = world  # the gang's ranks, where known before the first trial (``prestart``)
        self.srun, self.scancel, self.squeue, self.scontrol = srun, scancel, squeue, scontrol
        self.sinfo = sinfo
        self.ahead = ahead  # start each next trial's step while the current one runs (distributed.steps_ahead)
        self._ahead: _Step | None = None
        self._ahead_count = 0
        self._ahead_failures = 0

    def __enter__(self) -> SrunGangExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, conditions: Conditions) -> None:
        """The next trials run under ``conditions``: start their first step ahead (its ranks import while the
        environment check runs, in isoprobe's own process tree on this node), or replace one started for others."""
        if not self.ahead or not self.world:
            return
        key = _ahead_key(self.world, conditions, conditions.backend == "cuda")
        if self._ahead is not None and self._ahead.key != key:
            self._drop_ahead()
        self._start_ahead(key, conditions)

    def close(self) -> None:
        """End the step started ahead, if any (nothing outlives the probe), then the local executor's processes."""
        try:
            self._drop_ahead()
        finally:
            self.local.close()

    def run(self, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
        return run_through_reporting(self, request, conditions, timeout=timeout, name=name)

    def run_reporting(
        self, request, conditions: Conditions, *, timeout: float, name: str, finished: Callable[[ChildRun], None]
    ) -> None:
        """Run one request: a gang trial as a step (asked again once if Slurm refuses it), anything else locally."""
        if not is_gang(request):
            from isoprobe.executors.rounds import run_round

            return run_round(self.local, [(request, conditions, timeout, name)], lambda slot, run: finished(run))
        refused: list[str] = []
        while True:
            attempt = name if not refused else f"{name}-again{len(refused)}"
            try:
                run = self._run_step(request, conditions, timeout, attempt)
            except (KeyboardInterrupt, Terminated):
                name_lost_nodes(self.sinfo)
                raise
            if isinstance(run, ChildRun):
                with signals_deferred():
                    finished(replace(run, lost_before=tuple(refused)))
                return
            refused.append(run)
            world = request.spec.distributed.world_size
            if node_failed(run):  # Slurm took the node out of the job: no step of this size can run again in it
                raise ProbeError(
                    f"Slurm lost the job step of a trial (batch {request.batch_size}, {world} ranks): {run}. That is "
                    f"the allocation, not the batch, so the probe stops without an answer. "
                    f"{advice(run, str(self.local.workdir))}",
                    evidence=run,
                )
            if len(refused) > REFUSALS_TOLERATED:
                before = f" (before that: {refused[0]})" if refused[0] != refused[-1] else ""
                raise ProbeError(
                    f"Slurm refused the job step of a trial (batch {request.batch_size}, {world} ranks) "
                    f"{len(refused)} times: {refused[-1]}{before}. That is the allocation, not the "
                    "batch, so the probe stops without an answer. "
                    f"{advice(' '.join(refused), str(self.local.workdir))}",
                    evidence="\n".join(refused),
                )

    # --- one step ----------------------------------------------------------------------------------------

    def _run_step(self, request: TrialRequest, conditions: Conditions, timeout: float, name: str) -> ChildRun | str:
        """One step to its end: the gang's run, or (a str) why Slurm did not run it."""
        world = request.spec.distributed.world_size or 1
        cuda = request.device.startswith("cuda")
        key = _ahead_key(world, conditions, cuda)
        step = self._take_ahead(key)
        folder = step.folder if step is not None else self.local.workdir / f"{name}.step"
        if step is None:
            folder.mkdir()
        store = folder / "store"
        for rank in range(world):
            rank_request = request.model_copy(
                update={
                    "device": "cuda:0" if cuda else request.device,  # srun_rank leaves the rank one GPU: its cuda:0
                    "rank": RankAssignment(
                        rank=rank, world_size=world, store_path=str(store), backend="nccl" if cuda else "gloo"
                    ),
                }
            )
            write_atomically(folder / f"rank{rank}.request.json", rank_request.model_dump_json())
        write_atomically(folder / TRIAL_FILE, json.dumps({"trial": name, "batch_size": request.batch_size}))
        try:
            if step is None:
                step = start_step(folder, world, conditions, cuda, nodes=self.nodes, srun=self.srun)
            else:
                self._give_turn(step)
            if self.ahead:
                self._start_ahead(key, conditions)
            return self._supervise(step, timeout, request)
        finally:
            if step is not None:
                self._end(step)  # on an interrupt too: no step outlives the trial

    # --- the next trial's step, started ahead ---------------------------------------------------------------

    def _start_ahead(self, key: tuple, conditions: Conditions) -> None:
        """Start the next trial's step beside the running one: its ranks import, then wait for their turn."""
        if self._ahead is not None or self._ahead_failures > AHEAD_FAILURES_TOLERATED:
            return
        self._ahead_count += 1
        folder = self.local.workdir / f"ahead{self._ahead_count:03d}.step"
        folder.mkdir()
        world, _, cuda = key
        with signals_deferred():  # an interrupt lands once the step is recorded, where close() finds it
            self._ahead = start_step(folder, world, conditions, cuda, nodes=self.nodes, srun=self.srun, ahead=True)
            self._ahead.key = key

    def _take_ahead(self, key: tuple) -> _Step | None:
        """The step started ahead, if it was started for ``key`` and still waits; else None (and it is ended)."""
        step, self._ahead = self._ahead, None
        if step is None:
            return None
        if step.key == key and step.process.poll() is None and step.lost() is None:
            step.began, step.delivered = time.monotonic(), None  # the trial's time starts now, as a fresh step's
            return step
        if step.key == key:  # ended or lost while it waited (not the batch's: no request had reached it)
            self._ahead_failures += 1
        with signals_deferred():
            self._end(step, lost=step.lost() is not None)
        return None

    def _give_turn(self, step: _Step) -> None:
        """Tell a step started ahead that its requests are written: one line, forwarded by srun to every rank."""
        turn = step.turn
        assert turn is not None, "a step started ahead holds srun's stdin until its turn"
        try:
            turn.write(b"go\n")
            turn.flush()
        except OSError:  # srun ended meanwhile: the supervision finds the step over, or refused
            pass
        finally:
            _close_turn(step)

    def _drop_ahead(self) -> None:
        """End the step started ahead that no trial needs (the probe ends, or it ends in error)."""
        step, self._ahead = self._ahead, None
        if step is not None:
            with signals_deferred():
                self._end(step, lost=step.lost() is not None)

    def _supervise(self, step: _Step, timeout: float, request: TrialRequest | None = None) -> ChildRun | str:
        """Watch the step until it ends, its ranks' imports time out, or its time is up: a stretched ``timeout``
        (a trial of more steps than the search's) is earned as the slowest rank completes steps, as a local
        gang's is (``rounds.earned_timeout``)."""
        import_deadline = step.began + import_timeout(timeout)
        while True:
            for watched in (step, self._ahead):  # the step started ahead too, as soon as Slurm names it
                if watched is not None and not watched.armed and (step_id := watched.step_id()) is not None:
                    self._arm_cancel(watched, step_id)
            if (gone := step.lost_daemon()) is not None:
                batch = request.batch_size if request is not None else None
                raise daemon_lost_error(gone, step.step_id(), step.world, batch, self.sinfo)
            srun_ended = step.process.poll() is not None
            if (lost := step.lost()) is not None:
                return self._refused(step, lost)
            events = [read_events(step.files(rank)["events.jsonl"]) for rank in range(step.world)]
            if step.delivered is None and all(last_of(e, Warm) is not None for e in events):
                step.delivered = time.monotonic()  # every rank imported: the trial's time starts, as a local gang's
            exits = [step.exit_code(rank) for rank in range(step.world)]
            if srun_ended and not any(step.task(rank) for rank in range(step.world)):
                return self._refused(step)
            states = step_states(events, exits, srun_ended)
            ended, failed = first_failure(states)
            now = time.monotonic()
            if ended:
                with signals_deferred():
                    return self._conclude(step, failed, timed_out=())
            if step.step_id() is None and now >= step.began + STEP_START_SECONDS:
                return self._refused(
                    step,
                    f"Slurm started no rank of the step within {STEP_START_SECONDS:g} s"
                    + task_prolog_words(os.getpid()),
                )
            if step.delivered is None and now >= import_deadline:
                if step.step_id() is None:
                    return self._refused(
                        step, f"no rank started within {import_timeout(timeout):g} s" + task_prolog_words(os.getpid())
                    )
                with signals_deferred():
                    slow = [rank for rank, e in enumerate(events) if last_of(e, Warm) is None]
                    return self._conclude(step, slow[0], timed_out=tuple(slow))
            earned = (
                timeout if request is None else earned_timeout(request, timeout, min(steps_done(e) for e in events))
            )
            if step.delivered is not None and now >= step.delivered + earned:
                with signals_deferred():
                    timed_out = tuple(rank for rank, (verdict, _, _) in enumerate(states) if verdict is None)
                    hung = laggard([len(e) for e in events], list(timed_out)) if timed_out else None
                    return self._conclude(step, hung, timed_out=timed_out)
            time.sleep(POLL_SECONDS)

    def _arm_cancel(self, step: _Step, step_id: str) -> None:
        """Tell srun's keeper how to end the step if isoprobe dies: killing srun alone leaves its tasks running
        (measured on Slurm 22.05 with the ranks' output in files: the step stayed, its tasks alive, after
        srun was SIGKILLed), so the keeper cancels the step first, through Slurm, on every node."""
        scancel = shutil.which(self.scancel) or self.scancel
        write_atomically(
            step.folder / ON_STOP_FILE, json.dumps([[scancel, *KILL_THROUGH_SLURMCTLD, step_id], [scancel, step_id]])
        )
        step.armed = True

    def _refused(self, step: _Step, why: str | None = None) -> str:
        """Why Slurm ran no rank of the step, or lost it (``why``): srun's own line when it said one."""
        if why is not None:  # the step's id comes from a rank that started: give a healthy node's rank a moment
            deadline = time.monotonic() + LOST_STEP_ID_SECONDS
            while step.step_id() is None and step.process.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
        self._end(step, lost=why is not None)
        said = refusal(step.srun_stderr())
        tail = step.srun_stderr().strip().splitlines()[-1:] or ["srun said nothing"]
        return said or why or f"srun ended (exit {step.process.returncode}) before any rank started: {tail[0]}"

    def _conclude(self, step: _Step, failed: int | None, *, timed_out: tuple[int, ...]) -> ChildRun | str:
        """End the step, collect every rank, and make the gang's run as the local gang makes it; or (a str) Slurm's
        words where the step was lost to Slurm (``srun_plan.loss``), whatever its ranks show.

        A failed rank that wrote its verdict is on its way out: it gets ``VERDICT_EXIT_GRACE_SECONDS`` to end on
        its own (its exit then recorded, as a local rank's), before the step is killed under it.
        """
        if (
            failed is not None
            and failed not in timed_out
            and last_of(read_events(step.files(failed)["events.jsonl"]), TrialResult) is not None
        ):
            grace = time.monotonic() + VERDICT_EXIT_GRACE_SECONDS
            while step.exit_code(failed) is None and step.process.poll() is None and time.monotonic() < grace:
                time.sleep(POLL_SECONDS / 4)
        stop_seconds = self._end(step)
        if (lost := step.lost()) is not None:  # a rank killed with a step Slurm lost: not the batch's outcome
            return lost
        seconds = time.monotonic() - (step.delivered if step.delivered is not None else step.began)
        runs = tuple(rank_run(step, rank, seconds, rank in timed_out) for rank in range(step.world))
        deciding = runs[failed] if failed is not None else runs[0]
        return replace(
            deciding,
            ranks=runs,
            failed_rank=failed,
            gang_stop_seconds=stop_seconds if failed is not None else None,
            seconds=max(run.seconds for run in runs),
        )

    def _end(self, step: _Step, lost: bool = False) -> float:
        """Make sure the step is over on every node: srun's own end, else ``scancel``, else srun killed. Seconds taken.

        Safe to call twice. Waits for srun to end (it ends when every task has),
        then, where the step is still listed by ``squeue -s``, until it is not.
        """
        began = time.monotonic()
        _close_turn(step)  # a step started ahead and never given its turn: its ranks read end of file
        step_id = step.step_id()
        if step.process.poll() is None and step_id is not None:
            self._scancel(*KILL_THROUGH_SLURMCTLD, step_id)
            if lost or step.daemon_lost:  # srun waits on after Slurm lost the step: cancel the step itself
                self._scancel(step_id)
        try:
            step.process.wait(timeout=SRUN_END_SECONDS)
        except subprocess.TimeoutExpired:
            if step_id is not None:
                # The KILL signal can miss a task that was still being launched (measured: a step Slurm lost at
                # launch, cancelled at once, kept its other rank and srun 25 s): cancel the step itself, which
                # slurmctld ends on every node.
                self._scancel(step_id)
                try:
                    step.process.wait(timeout=SRUN_END_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
        if step.lifeline_write >= 0:  # srun's keeper kills srun (and slurmstepd then the tasks) if still there
            os.close(step.lifeline_write)
            step.lifeline_write = -1
        try:
            step.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            step.process.kill()
            step.process.wait()
        if step_id is not None and step.daemon_lost is None:  # a step whose node lost its daemon is listed for good
            self._wait_step_gone(step_id)
        return round(time.monotonic() - began, 4)

    def _scancel(self, *args: str) -> None:
        scancel_now(self.scancel, *args)

    def _wait_step_gone(self, step_id: str) -> None:
        if wait_slurm_steps_gone(
            [step_id],
            STEP_GONE_SECONDS,
            recancel_after=min(2.0, STEP_RECANCEL_SECONDS),
            recancel_every=STEP_RECANCEL_SECONDS,
            squeue=self.squeue,
            scancel=self.scancel,
            job=step_id.split(".")[0],
        ):
            raise ProbeError(
                f"the trial's Slurm job step {step_id} was ended (scancel --ctld --signal=KILL, then scancel of "
                f"the step, srun gone) but squeue -s still lists it {STEP_GONE_SECONDS:g} s later; the "
                f"probe stops rather than start another step beside it. What Slurm says of it: "
                f"{self._step_record(step_id)}"
            )

    def _step_record(self, step_id: str) -> str:
        """``scontrol show step`` of a step that will not go away (its state and nodes), for the error."""
        shown = ask_slurm([self.scontrol, "show", "step", "-o", step_id], CLIENT_SECONDS)
        if shown is None:
            return f"scontrol did not answer within {CLIENT_SECONDS:g} s"
        return (shown.stdout or shown.stderr).strip() or "scontrol said nothing"
