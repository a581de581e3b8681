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
classifies the trial by it (``probe.trials``). A rank that hangs before a
collective holds the others up until the trial's timeout: the gang timed out,
and the rank that did not get as far as the others is the one named (``laggard``).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from isoprobe.executors import ChildRun, Conditions
from isoprobe.executors.child_process import wait_for_end
from isoprobe.executors.fork_servers import SERVER_LOSSES
from isoprobe.executors.local import Launch, LocalExecutor
from isoprobe.outcomes import Outcome
from isoprobe.protocol import RankAssignment, TrialRequest, TrialResult, last_of, read_events

#: How often the gang's ranks are looked at: the kill latency after a rank fails is about this.
POLL_SECONDS = 0.02


def rank_requests(request: TrialRequest, store_path: str) -> list[TrialRequest]:
    """The gang's requests, one per rank: on CUDA rank r takes visible GPU r (``cuda:r``), on the CPU 'cpu'."""
    world = request.spec.distributed.world_size or 1
    cuda = request.device.startswith("cuda")
    return [
        request.model_copy(update={
            "device": f"cuda:{rank}" if cuda else request.device,
            "rank": RankAssignment(rank=rank, world_size=world, store_path=store_path,
                                   backend="nccl" if cuda else "gloo"),
        })
        for rank in range(world)
    ]


def is_gang(request) -> bool:
    """Whether ``request`` runs as a gang: a trial of a spec with a strategy (a gang of one is a world of one)."""
    return isinstance(request, TrialRequest) and request.rank is None and request.spec.distributed.gang


class GangExecutor:
    """The local executor, with distributed trials run as gangs; the environment check and others pass through."""

    def __init__(self, local: LocalExecutor):
        self.local = local

    def __enter__(self) -> "GangExecutor":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def prestart(self, conditions: Conditions) -> None:
        self.local.prestart(conditions)

    def close(self) -> None:
        self.local.close()

    def run(self, request, conditions: Conditions, *, timeout: float, name: str) -> ChildRun:
        if not is_gang(request):
            return self.local.run(request, conditions, timeout=timeout, name=name)
        lost: list[str] = []
        while True:  # a gang the fork server lost is run again, as ``LocalExecutor.run`` runs a single request
            attempt = name if not lost else f"{name}-again{len(lost)}"  # a store of its own: the lost one's is stale
            run = replace(self._run_gang(request, conditions, timeout, attempt), lost_before=tuple(lost))
            if run.lost is None or len(lost) >= SERVER_LOSSES:
                return run
            lost.append(run.lost)
            self.local.servers.drop_lost()

    def _run_gang(self, request, conditions: Conditions, timeout: float, name: str) -> ChildRun:
        store = self.local.workdir / f"{name}.store"
        launches: list[Launch] = []
        try:
            for rank_request in rank_requests(request, str(store)):
                launches.append(self.local.launch(rank_request, conditions, timeout=timeout,
                                                  name=f"{name}-rank{rank_request.rank.rank}"))
            failed, stop_seconds = _supervise(launches, timeout)
        finally:
            for launch in launches:  # on an interrupt too: no rank outlives the trial
                self.local.stop(launch)
        runs = tuple(LocalExecutor.collect(launch) for launch in launches)
        deciding = runs[failed] if failed is not None else runs[0]
        # One rank's end lost by the fork server loses the gang's: its failure (or its peers') is not the trial's.
        lost = next((run.lost for run in runs if run.lost is not None), None)
        return replace(deciding, ranks=runs, failed_rank=failed, gang_stop_seconds=stop_seconds,
                       seconds=max(run.seconds for run in runs), lost=lost)


def _supervise(launches: list[Launch], timeout: float) -> tuple[int | None, float | None]:
    """Wait for the gang: (the rank that failed first or None, seconds to stop the others after it failed).

    Every rank must have been delivered its request; one that was not (it died
    importing, or its import timed out) fails the gang at once.
    """
    undelivered = [rank for rank, launch in enumerate(launches) if launch.delivered is None]
    if undelivered:
        return _stop_all(launches, undelivered[0])
    deadline = max(launch.delivered for launch in launches) + timeout
    while True:
        failures = []
        running = 0
        for rank, launch in enumerate(launches):
            verdict = last_of(read_events(launch.events_path), TrialResult)
            ended = launch.poll() is not None
            if verdict is not None and verdict.outcome is not Outcome.FITS:
                failures.append((0, verdict.t, rank))
            elif ended and (verdict is None or launch.child.process.returncode != 0):
                failures.append((-1, 0.0, rank))  # no verdict (a crash, a kill): no peer's failure caused it
            elif not ended:
                running += 1
        if failures:
            # A rank that ended without a verdict first; then the earliest verdict. A peer's collective
            # error ("connection closed") comes after the failure that caused it.
            return _stop_all(launches, min((kind, t, rank) for kind, t, rank in failures)[2])
        if running == 0:
            return None, None
        if time.monotonic() >= deadline:
            for launch in launches:  # the usual timeout rule, rank by rank: a verdict before the deadline stands
                if launch.poll() is None:
                    launch.timed_out, launch.verdict_at_timeout = wait_for_end(launch.child, 0)
            timed_out = [rank for rank, launch in enumerate(launches) if launch.timed_out
                         and not launch.verdict_at_timeout]
            if timed_out:
                hung = laggard([len(read_events(launch.events_path)) for launch in launches], timed_out)
                if hung is None:  # level: no evidence which rank held the others, and none is blamed
                    _stop_all(launches, 0)
                    return None, None
                return _stop_all(launches, hung)
            return None, None
        time.sleep(POLL_SECONDS)


def laggard(progress: list[int], timed_out: list[int]) -> int | None:
    """Of the ranks that timed out, the one that did not reach the point the others reached; None when none is behind.

    ``progress``: each rank's events so far (started, imports done, request
    received, model built, one per step...). At a gang's timeout every rank is
    still running: the one that hung, and the others blocked in a collective
    waiting for it. Those got further (they built the model, finished a step),
    so the rank with strictly the fewest events is the one that held the gang;
    blaming the first rank instead named rank 0 when rank 1 hung. Level ranks
    (a hang and a wait inside the same step) leave no evidence: None, never a guess.
    """
    least = min(progress[rank] for rank in timed_out)
    behind = [rank for rank in timed_out if progress[rank] == least]
    return behind[0] if len(behind) == 1 and least < max(progress) else None


def _stop_all(launches: list[Launch], failed: int) -> tuple[int, float]:
    """Kill every rank's tree at once (lifelines first, then reap), timing it."""
    started = time.monotonic()
    for launch in launches:
        if launch.child is not None and launch.child.lifeline_write >= 0:
            os.close(launch.child.lifeline_write)
            launch.child.lifeline_write = -1
    for launch in launches:
        LocalExecutor.stop(launch)
    return failed, round(time.monotonic() - started, 4)
