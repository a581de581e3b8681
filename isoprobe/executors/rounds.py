"""Requests run to their end and handed to the probe as each ends: one at a time, or several at once.

``run_round`` hands a round's requests to an executor and calls ``finished(slot,
run)`` for each request *as its child ends*, so that a trial that finished is
recorded and printed at once, not when the slowest of its round is done. A
round of one is how every trial of the probe runs (``pipeline.trials``), the
sequential search's included: a SIGINT/SIGTERM must never drop a trial whose
child had ended (issue 25). So each call is made with SIGINT and SIGTERM held
(``signals_deferred``) from the moment the end is seen: a signal that comes
while a trial is stopped, collected and recorded lands after it is. On an
interrupt, a child that had already ended on its own when the signal came
(between two looks at it) is still reported, and so is one whose timeout had
been reached; one ended by SIGINT/SIGTERM (a scheduler signals the whole job:
``scancel``) was stopped, not finished, and is dropped like the ones still running.

With the local executor the children run concurrently, through its
``launch``/``stop``/``collect`` pieces (as the gang does for its ranks): every
request is launched, each is waited for up to its own deadline (the usual
timeout rule: a verdict at the deadline gets a short grace), and on any exit,
an interrupt included, every child of the round is stopped before anything is
raised. A slot whose end the fork server lost (``ChildRun.lost``: the server
killed or stopped mid-round) is isoprobe's failure, not the batch's: that
server is dropped and the slot launched again, its timeout from the new
delivery; after ``SERVER_LOSSES`` losses its request is spawned, where no
server can lose it, and the run that comes back names the attempts lost before
it (``ChildRun.lost_before``). A lost run is never reported on an interrupt.

A wrapper executor that records what its children report
(``cache.sources.SourceRecorder``, which has an ``inner``) sees each run as it
would in ``run``. An executor that runs a request as a whole but can hand over
its end itself (``run_reporting``: the gang, whose ranks are one request) is
asked to; any other (the scripted one of the unit tests, which has no child to
end before its ``run`` returns) runs the round's requests one after another,
each reported as it returns.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import replace

from isoprobe.errors import Terminated
from isoprobe.executors import ChildRun
from isoprobe.executors.fork_server_choice import SERVER_LOSSES
from isoprobe.executors.processes import signals_deferred

#: How often the round's children are looked at.
POLL_SECONDS = 0.02
#: Exit statuses of a child ended by the interrupt that also reached isoprobe: stopped, not finished.
INTERRUPTED_EXITS = (-signal.SIGINT, -signal.SIGTERM)

Finished = Callable[[int, ChildRun], None]


def earned_timeout(request, timeout: float, steps_done: int) -> float:
    """The timeout a trial has earned so far: ``timeout`` stretched for a trial of more steps than the search's
    (one that steps until steady, a soak) is given as the steps are done, never before.

    Such a trial keeps ``search.trial_timeout`` until it completes a step, and each completed step earns it that
    timeout's share of one of the search's steps, up to ``timeout``. Issue 35: the trial right below the smallest
    failure now steps until steady the first time it runs, and with the whole stretch from its start a trial that
    hung at its first step was killed after 15 trial timeouts (120 s for an 8 s one) instead of one. A trial that
    keeps stepping is never stopped sooner than it was: a step earns at least what its share of the stretch was.
    """
    if getattr(request, "mode", None) != "trial":  # the environment check: its own bound
        return timeout
    base = request.spec.search.trial_timeout
    if timeout <= base:
        return timeout
    return min(timeout, base + steps_done * base / request.spec.search.steps)


def steps_done(events) -> int:
    """How many steps a trial's events report as done (a gang's rank, or one child)."""
    from isoprobe.protocol.messages import StepDone

    return sum(isinstance(event, StepDone) for event in events)


class BusyClock:
    """A trial's timeout in the time it could run: the deadline moves on by what a busy node kept from it.

    At each deadline the CPU its process tree got since the last look is read (``system.cpu_share``): a tree that
    waited, runnable, for a CPU at least half the time it wanted one was starved, and is owed the time it would
    have taken alone. A hung trial sleeps and is owed nothing; a slow one on a quiet node hardly waits. At most
    ``MOST_BUSY_TIMEOUTS`` times its timeout in all, so that nothing waits for ever on a node that never frees up:
    then it times out, and its run says that the node was busy (``ChildRun.busy_at_timeout``)."""

    def __init__(self, pid: int, since: float, timeout: float):
        from isoprobe.system.cpu_share import tree_cpu_time

        self.pid, self.since, self.timeout = pid, since, timeout
        self.reading = tree_cpu_time(pid)
        self.extended = 0.0  # seconds added to the deadline so far
        self.busy_at_end = False  # the last look found it starved (and owed it nothing more: the bound)

    def owed(self, now: float) -> float:
        """Seconds to add to the deadline now (0: none; the trial times out)."""
        import sys

        from isoprobe.system.cpu_share import starved_seconds, tree_cpu_time

        reading = tree_cpu_time(self.pid)
        used, wall = reading.since(self.reading), now - self.since
        self.reading, self.since = reading, now
        owed = starved_seconds(used, wall)
        self.busy_at_end = owed > 0
        owed = min(owed, MOST_BUSY_TIMEOUTS * self.timeout - self.extended)
        if owed <= 0:
            return 0.0
        self.extended += owed
        sys.stderr.write(
            f"isoprobe: a busy node: the trial waited for a CPU {used.waiting_share:.0%} of the time it "
            f"wanted one over the last {wall:.0f} s; its timeout is extended by {owed:.0f} s, the time "
            "it would have had alone\n"
        )
        return owed


#: The most a busy node may extend a trial's timeout, in multiples of that timeout (all extensions together).
MOST_BUSY_TIMEOUTS = 8.0


def ended_on_its_own(status: int | None) -> bool:
    """Whether a child's exit status (None: running) is an end of its own, not one the interrupt caused."""
    return status is not None and status not in INTERRUPTED_EXITS


def run_round(executor, jobs: list[tuple], finished: Finished) -> None:
    """``jobs``: (request, conditions, timeout, name) per slot; ``finished(slot, run)`` once per slot, as each ends.

    Returns when every slot was reported; an interrupt propagates after the
    slots that had ended were reported and every child was stopped.
    """
    if hasattr(executor, "launch") and hasattr(executor, "collect"):
        return _concurrently(executor, jobs, finished)
    inner = getattr(executor, "inner", None)
    if inner is not None and hasattr(executor, "record"):  # the source recorder: record each run as run() does

        def recorded(slot: int, run: ChildRun) -> None:
            finished(slot, executor.record(run))

        return run_round(inner, jobs, recorded)
    for slot, (request, conditions, timeout, name) in enumerate(jobs):
        if hasattr(executor, "run_reporting"):
            executor.run_reporting(
                request, conditions, timeout=timeout, name=name, finished=lambda run, slot=slot: finished(slot, run)
            )
            continue
        run = executor.run(request, conditions, timeout=timeout, name=name)
        with signals_deferred():
            finished(slot, run)


def _concurrently(local, jobs: list[tuple], finished: Finished) -> None:
    launches: list = [None] * len(jobs)
    deadlines: list[float] = [0.0] * len(jobs)
    graced = [False] * len(jobs)
    clocks: list[BusyClock | None] = [None] * len(jobs)  # per slot: the CPU its tree got since delivery
    lost: list[list[str]] = [[] for _ in jobs]  # per slot: why each earlier attempt was lost
    waiting: set[int] = set()

    def start(i: int) -> None:
        """Launch slot ``i``'s request (again, after a loss: under a name of its own)."""
        request, conditions, timeout, name = jobs[i]
        attempt = name if not lost[i] else f"{name}-again{len(lost[i])}"
        launches[i] = local.launch(request, conditions, timeout=timeout, name=attempt)
        graced[i] = False
        waiting.add(i)
        if launches[i].delivered is None:
            end(i)  # never delivered (died or hung importing): its run says so
        else:
            deadlines[i] = launches[i].delivered + earned_timeout(request, timeout, 0)
            pid = getattr(launches[i], "pid", None)  # a launch that has no process (a test's) has no clock
            clocks[i] = BusyClock(pid, launches[i].delivered, timeout) if pid is not None else None

    def end(i: int, interrupted: bool = False) -> None:
        """Stop, collect and report slot ``i`` (or launch it again, if the fork server lost it)."""
        with signals_deferred():  # stopped, collected and recorded before a signal can land
            waiting.discard(i)
            local.stop(launches[i])
            run = replace(local.collect(launches[i]), lost_before=tuple(lost[i]))
            clock = clocks[i]
            if clock is not None and clock.extended:
                run = replace(run, busy_seconds=clock.extended, busy_at_timeout=clock.busy_at_end)
            if run.lost is None or len(lost[i]) >= SERVER_LOSSES:  # the last attempt was spawned: never lost
                if run.lost is None or not interrupted:
                    finished(i, run)
                return
            if interrupted:
                return  # isoprobe's failure, and no time to run it again: nothing finished
            lost[i].append(run.lost)
            local.servers.drop_lost()
        start(i)

    try:
        for i in range(len(jobs)):
            start(i)
        while waiting:
            now = time.monotonic()
            for i in sorted(waiting):
                if i not in waiting:
                    continue
                launch = launches[i]
                if launch.poll() is not None:
                    end(i)
                elif now >= deadlines[i]:
                    later = _later_deadline(launch, jobs[i], graced[i], clocks[i], now)
                    if later is not None:
                        deadlines[i], graced[i] = later
                        continue
                    launch.timed_out, launch.verdict_at_timeout = True, graced[i]
                    end(i)
            if waiting:
                time.sleep(POLL_SECONDS)
    except (KeyboardInterrupt, Terminated):
        for i in sorted(waiting):  # what had ended before the signal is a finished trial all the same
            if launches[i].timed_out or ended_on_its_own(launches[i].poll()):
                end(i, interrupted=True)
        raise
    finally:
        for launch in launches:  # on an interrupt too: no child of the round outlives it
            if launch is not None:
                local.stop(launch)


def _later_deadline(launch, job: tuple, graced: bool, clock: BusyClock | None, now: float) -> tuple[float, bool] | None:
    """At a slot's deadline, the deadline it is given instead and whether that is its grace; None: it timed out.

    Apart from ``_concurrently``'s loop because this is the timeout rule itself: a trial that stepped on since
    has earned the time of its steps (``earned_timeout``); one whose verdict is written is on its way out and
    gets the usual grace, once; one a busy node kept from the CPU is owed that time (``BusyClock``), which is
    not the batch's. Once graced, only the grace counts.
    """
    from isoprobe.executors.processes import VERDICT_EXIT_GRACE_SECONDS
    from isoprobe.protocol.messages import Inspected, TrialResult, last_of, read_events

    events = read_events(launch.events_path)
    request, _, timeout, _ = job
    earned = launch.delivered + earned_timeout(request, timeout, steps_done(events))
    if earned > now and not graced:  # it stepped on since: the time its steps earned
        return earned, False
    verdict = last_of(events, TrialResult) is not None or last_of(events, Inspected) is not None
    if verdict and not graced:  # on its way out: the usual grace
        return now + VERDICT_EXIT_GRACE_SECONDS, True
    owed = clock.owed(now) if clock is not None and not graced else 0.0
    if owed > 0:  # a busy node kept it from the CPU: not the batch's time, and not counted
        return now + owed, graced
    return None
