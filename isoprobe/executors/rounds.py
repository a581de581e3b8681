"""Several requests at once, one per slot: the executor side of parallel trials (``search.parallel``).

``run_round`` hands a round's requests to an executor and calls ``finished(slot,
run)`` for each request *as its child ends*, so that a trial that finished is
recorded and printed at once, not when the slowest of its round is done: a
SIGINT/SIGTERM mid-round must not drop the trials that already ended (issue
25). Each call is made with SIGINT and SIGTERM held (``signals_deferred``), so
a signal that comes while a trial is being recorded lands after it is.

With the local executor the children run concurrently, through its
``launch``/``stop``/``collect`` pieces (as the gang does for its ranks): every
request is launched, each is waited for up to its own deadline (the usual
timeout rule: a verdict at the deadline gets a short grace), and on any exit,
an interrupt included, every child of the round is stopped before anything is
raised. On an interrupt, a child that had already ended on its own when the
signal came (between two looks at it) is still reported; one ended by
SIGINT/SIGTERM (a scheduler signals the whole job: ``scancel``) was stopped,
not finished, and is dropped like the ones still running. A wrapper executor
that records what its children report (``cache_sources.SourceRecorder``,
which has an ``inner``) sees each run as it would in ``run``. An executor
without those pieces (the scripted one of the unit tests) runs the round's
requests one after another, reporting each as it returns.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

from isoprobe.errors import Terminated
from isoprobe.executors import ChildRun
from isoprobe.executors.processes import signals_deferred

#: How often the round's children are looked at.
POLL_SECONDS = 0.02
#: Exit statuses of a child ended by the interrupt that also reached isoprobe: stopped, not finished.
_INTERRUPTED_EXITS = (-signal.SIGINT, -signal.SIGTERM)

Finished = Callable[[int, ChildRun], None]


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
        run = executor.run(request, conditions, timeout=timeout, name=name)
        with signals_deferred():
            finished(slot, run)


def _concurrently(local, jobs: list[tuple], finished: Finished) -> None:
    from isoprobe.executors.processes import VERDICT_EXIT_GRACE_SECONDS
    from isoprobe.protocol import Inspected, TrialResult, last_of, read_events

    launches = []
    waiting: set[int] = set()

    def report(i: int) -> None:
        waiting.discard(i)
        with signals_deferred():  # stopped, collected and recorded before a signal can land
            local.stop(launches[i])
            finished(i, local.collect(launches[i]))

    try:
        for request, conditions, timeout, name in jobs:
            launches.append(local.launch(request, conditions, timeout=timeout, name=name))
            waiting.add(len(launches) - 1)
        deadlines = [launch.delivered + job[2] if launch.delivered is not None else None
                     for launch, job in zip(launches, jobs)]
        graced = [False] * len(launches)
        for i in [i for i, launch in enumerate(launches) if launch.delivered is None]:
            report(i)  # never delivered (died or hung importing): its run says so
        while waiting:
            now = time.monotonic()
            for i in sorted(waiting):
                launch = launches[i]
                if launch.poll() is not None:
                    report(i)
                elif now >= deadlines[i]:
                    events = read_events(launch.events_path)
                    verdict = last_of(events, TrialResult) is not None or last_of(events, Inspected) is not None
                    if verdict and not graced[i]:  # on its way out: the usual grace
                        graced[i], deadlines[i] = True, now + VERDICT_EXIT_GRACE_SECONDS
                        continue
                    launch.timed_out, launch.verdict_at_timeout = True, graced[i]
                    report(i)
            if waiting:
                time.sleep(POLL_SECONDS)
    except (KeyboardInterrupt, Terminated):
        for i in sorted(waiting):  # what had ended on its own before the signal is a finished trial all the same
            status = launches[i].poll()
            if status is not None and status not in _INTERRUPTED_EXITS:
                report(i)
        raise
    finally:
        for launch in launches:  # on an interrupt too: no child of the round outlives it
            local.stop(launch)
