"""A distributed trial as a gang of rank processes: all of them fit, or the first that fails ends them all.

With ``spec.distributed`` a trial is ``world_size`` ranks training together
(DDP, ZeRO-1, FSDP), each a child of the local executor exactly as a single
trial's is: its own keeper, lifeline, session, rlimits on the CPU backend. The
gang meets through a ``FileStore`` in the trial's own folder
(``protocol.RankAssignment``), so two probes on one node never collide.

Why a supervisor of its own: when one rank runs out of memory, the others
block in the next collective and never return. So the gang is watched as a
whole, every ``POLL_SECONDS``: the first rank that writes a verdict other than
'fits', or ends without one, *fails the gang*, and every rank's tree is killed
at once, well before the trial's timeout. The run that comes back is that
rank's, with every rank's run beside it (``ChildRun.ranks``); the probe
classifies the trial by it (``pipeline.trials``). A rank that hangs before a
collective holds the others up until the trial's timeout: the gang timed out,
and the rank that did not get as far as the others is the one named (``laggard``).
From the moment the gang's end is seen until its run is handed to the probe
(``run_reporting``), SIGINT and SIGTERM are held, so an interrupt never drops a
gang that had ended (issue 25).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from isoprobe.errors import Terminated
from isoprobe.executors import ChildRun, Conditions, run_through_reporting
from isoprobe.executors.child_process import StartedChild, wait_for_end
from isoprobe.executors.fork_server_choice import SERVER_LOSSES
from isoprobe.executors.local import Launch, LocalExecutor
from isoprobe.executors.processes import signals_deferred
from isoprobe.executors.rounds import earned_timeout, ended_on_its_own, steps_done
from isoprobe.protocol.messages import RankAssignment, TrialRequest, TrialResult, last_of, read_events
from isoprobe.report.outcomes import Outcome

#: How often the gang's ranks are looked at: the kill latency after a rank fails is about this.
POLL_SECONDS = 0.02


def rank_requests(request: TrialRequest, store_path: str) -> list[TrialRequest]:
    """The gang's requests, one per rank: on CUDA rank r takes visible GPU r (``cuda:r``), on the CPU 'cpu'."""
    world = request.spec.distributed.world_size or 1
    cuda = request.device.startswith("cuda")
    return [
        request.model_copy(
            update={
                "device": f"cuda:{rank}" if cuda else request.device,
                "rank": RankAssignment(
                    rank=rank, world_size=world, store_path=store_path, backend="nccl" if cuda else "gloo"
                ),
            }
        )
        for rank in range(world)
    ]


def is_gang(request) -> bool:
    """Whether ``request`` runs as a gang: a trial of a spec with a strategy (a gang of one is a world of one)."""
    return isinstance(request, TrialRequest) and request.rank is None and request.spec.distributed.gang


class GangExecutor:
    """The local executor, with distributed trials run as gangs; the environment check and others pass through."""

    def __init__(self, local: LocalExecutor):
        self.local = local

    def __enter__(self) -> GangExecutor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, conditions: Conditions) -> None:
        self.local.prestart(conditions)

    def close(self) -> None:
        self.local.close()

    def run(self, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
        return run_through_reporting(self, request, conditions, timeout=timeout, name=name)

    def run_reporting(
        self, request, conditions: Conditions, *, timeout: float, name: str, finished: Callable[[ChildRun], None]
    ) -> None:
        """``run``, handing the run to ``finished`` with SIGINT/SIGTERM held from the moment the gang's end is seen.

        So an interrupt cannot drop a gang that had ended (``executors.rounds``
        does the same for single requests): one that comes while the ranks are
        stopped, collected and recorded lands after; one that comes between the
        last look at the ranks and that block finds them ended on their own and
        reports the gang before it propagates. A gang the fork server lost is
        run again, as a single request is; a lost run is never reported on an interrupt.
        """
        if not is_gang(request):
            from isoprobe.executors.rounds import run_round

            return run_round(self.local, [(request, conditions, timeout, name)], lambda slot, run: finished(run))
        lost: list[str] = []
        while True:
            attempt = name if not lost else f"{name}-again{len(lost)}"  # a store of its own: the lost one's is stale
            again = self._run_gang(request, conditions, timeout, attempt, tuple(lost), finished)
            if again is None:
                return
            lost.append(again)
            self.local.servers.drop_lost()

    def _run_gang(
        self,
        request,
        conditions: Conditions,
        timeout: float,
        name: str,
        lost_before: tuple[str, ...],
        finished: Callable[[ChildRun], None],
    ) -> str | None:
        """One attempt at the gang: None once its run was handed to ``finished``, else why it was lost (run it
        again)."""
        store = self.local.workdir / f"{name}.store"
        launches: list[Launch] = []
        concluded = False

        def conclude(failed: int | None, interrupted: bool = False) -> str | None:
            """With signals held: stop every rank, collect them, hand over the gang's run (or say why it was lost)."""
            nonlocal concluded
            concluded = True
            stop_seconds = _stop_all(launches)
            runs = tuple(self.local.collect(launch) for launch in launches)
            deciding = runs[failed] if failed is not None else runs[0]
            # One rank's end lost by the fork server loses the gang's: its failure (or its peers') is not the trial's.
            lost = next((run.lost for run in runs if run.lost is not None), None)
            run = replace(
                deciding,
                ranks=runs,
                failed_rank=failed,
                gang_stop_seconds=stop_seconds if failed is not None else None,
                seconds=max(run.seconds for run in runs),
                lost=lost,
                lost_before=lost_before,
            )
            if lost is not None and (interrupted or len(lost_before) < SERVER_LOSSES):
                return None if interrupted else lost  # the last attempt was spawned: never lost
            finished(run)
            return None

        try:
            for rank, rank_request in enumerate(rank_requests(request, str(store))):  # in rank order
                launches.append(self.local.launch(rank_request, conditions, timeout=timeout, name=f"{name}-rank{rank}"))
            return _supervise(launches, timeout, conclude, request)
        except (KeyboardInterrupt, Terminated):
            if (
                not concluded
                and len(launches) == (request.spec.distributed.world_size or 1)
                and all(launch.delivered is not None for launch in launches)
            ):
                ended, failed = _look(launches, interrupted=True)
                if ended:  # the gang had ended on its own before the signal: a finished trial all the same
                    with signals_deferred():
                        conclude(failed, interrupted=True)
            raise
        finally:
            for launch in launches:  # on an interrupt too: no rank outlives the trial
                self.local.stop(launch)


def _supervise(
    launches: list[Launch],
    timeout: float,
    conclude: Callable[[int | None], str | None],
    request: TrialRequest | None = None,
) -> str | None:
    """Wait for the gang's end, then ``conclude(the rank that failed first, or None)`` with signals held.

    ``request``: the gang's; a stretched ``timeout`` is earned as the slowest rank completes steps
    (``rounds.earned_timeout``), so a gang hung at its first step is stopped at search.trial_timeout.

    Every rank must have been delivered its request; one that was not (it died
    importing, or its import timed out) fails the gang at once.
    """
    undelivered = [rank for rank, launch in enumerate(launches) if launch.delivered is None]
    if undelivered:
        with signals_deferred():
            return conclude(undelivered[0])
    delivered = max(launch.delivered for launch in launches if launch.delivered is not None)  # each, by now

    def earned() -> float:
        if request is None:
            return delivered + timeout
        done = min(steps_done(_events(launch)) for launch in launches)
        return delivered + earned_timeout(request, timeout, done)

    deadline = earned()
    while True:
        ended, failed = _look(launches)
        if ended:
            with signals_deferred():
                return conclude(failed)
        if time.monotonic() >= deadline and (deadline := earned()) <= time.monotonic():
            with signals_deferred():  # the gang's time is up: what follows is its end, recorded whole
                for launch in launches:  # the usual timeout rule, rank by rank: a verdict before the deadline stands
                    if launch.poll() is None:  # still running: a launch has a child (poll() is -1 without one)
                        child = cast(StartedChild, launch.child)
                        launch.timed_out, launch.verdict_at_timeout = wait_for_end(child, 0)
                timed_out = [
                    rank for rank, launch in enumerate(launches) if launch.timed_out and not launch.verdict_at_timeout
                ]
                # Level ranks leave no evidence which one held the others, and none is blamed.
                hung = laggard([len(_events(launch)) for launch in launches], timed_out) if timed_out else None
                return conclude(hung)
        time.sleep(POLL_SECONDS)


def _events(launch: Launch) -> list:
    """What a rank's child has written so far (a launch that started no child: nothing)."""
    return read_events(launch.events_path) if launch.events_path is not None else []


def _look(launches: list[Launch], interrupted: bool = False) -> tuple[bool, int | None]:
    """One look at the gang: (whether it has ended, the rank that failed first or None).

    ``interrupted``: a rank ended by SIGINT/SIGTERM (a scheduler signals the
    whole job) was stopped, not finished: it counts as still running.
    """
    states = []
    for launch in launches:
        status = launch.poll()
        ended = ended_on_its_own(status) if interrupted else status is not None
        states.append(
            (
                last_of(_events(launch), TrialResult),
                ended,
                status if ended else None,
            )
        )
    return first_failure(states)


def first_failure(states: list[tuple[TrialResult | None, bool, int | None]]) -> tuple[bool, int | None]:
    """The gang's rule over each rank's (verdict, ended, exit code): (whether it has ended, the rank that failed first).

    The first rank that wrote a verdict other than 'fits', or ended without one
    (or ended badly), ends the gang. Pure, so that a gang of local children and
    one run as a Slurm job step (``executors.srun_gang``) are judged alike.
    """
    failures = []
    running = 0
    for rank, (verdict, ended, returncode) in enumerate(states):
        if verdict is not None and verdict.outcome is not Outcome.FITS:  # written before any signal: its own
            failures.append((0, verdict.t, rank))
        elif ended and (verdict is None or returncode != 0):
            failures.append((-1, 0.0, rank))  # no verdict (a crash, a kill): no peer's failure caused it
        elif not ended:
            running += 1
    if failures:
        # A rank that ended without a verdict first; then the earliest verdict. A peer's collective
        # error ("connection closed") comes after the failure that caused it.
        return True, min(failures)[2]
    return running == 0, None


def laggard(progress: list[int], timed_out: list[int]) -> int | None:
    """Of the ranks that timed out, the one that did not reach the point the others reached; None when none is behind.

    ``progress``: each rank's events so far (started, imports done, request
    received, model built, one per step...). At a gang's timeout every rank is
    still running: the one that hung, and the others blocked in a collective
    waiting for it. Those got further (they built the model, finished a step),
    so the rank with strictly the fewest events is the one that held the gang;
    blaming the first rank instead named rank 0 when rank 1 hung. A rank writes
    ``forwarded`` between its forward pass and backward, so a hang in the forward
    pass is told from a peer's wait in backward's all-reduce. Level ranks (a hang
    in backward itself, or in a user's own step) leave no evidence: None, never a guess.
    """
    least = min(progress[rank] for rank in timed_out)
    behind = [rank for rank in timed_out if progress[rank] == least]
    return behind[0] if len(behind) == 1 and least < max(progress) else None


def _stop_all(launches: list[Launch]) -> float:
    """Kill every rank's tree at once (lifelines first, then reap): the seconds it took."""
    started = time.monotonic()
    for launch in launches:
        if launch.child is not None and launch.child.lifeline_write >= 0:
            os.close(launch.child.lifeline_write)
            launch.child.lifeline_write = -1
    for launch in launches:
        LocalExecutor.stop(launch)
    return round(time.monotonic() - started, 4)
