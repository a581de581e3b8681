"""Several requests at once, one per slot: the executor side of parallel trials (``search.parallel``).

``run_round`` hands a round's requests to an executor and returns one
``ChildRun`` per request, in order. With the local executor the children run
concurrently, through its ``launch``/``stop``/``collect`` pieces (as the gang
does for its ranks): every request is launched, each is waited for up to its
own deadline (the usual timeout rule: a verdict at the deadline gets a short
grace), and on any exit, an interrupt included, every child of the round is
stopped before anything is returned or raised. A wrapper executor that records
what its children report (``cache_sources.SourceRecorder``, which has an
``inner``) sees each run as it would in ``run``. An executor without those
pieces (the scripted one of the unit tests) runs the round's requests one after
another: the search cannot tell, since a round's observations are used only
once all of them are in.
"""

from __future__ import annotations

import time

from isoprobe.executors import ChildRun

#: How often the round's children are looked at.
POLL_SECONDS = 0.02


def run_round(executor, jobs: list[tuple]) -> list[ChildRun]:
    """``jobs``: (request, conditions, timeout, name) per slot; the runs in the same order."""
    if hasattr(executor, "launch") and hasattr(executor, "collect"):
        return _concurrently(executor, jobs)
    inner = getattr(executor, "inner", None)
    if inner is not None and hasattr(executor, "record"):  # the source recorder: record each run as run() does
        return [executor.record(run) for run in run_round(inner, jobs)]
    return [executor.run(request, conditions, timeout=timeout, name=name) for request, conditions, timeout, name in jobs]


def _concurrently(local, jobs: list[tuple]) -> list[ChildRun]:
    from isoprobe.executors.processes import VERDICT_EXIT_GRACE_SECONDS
    from isoprobe.protocol import Inspected, TrialResult, last_of, read_events

    launches = []
    try:
        for request, conditions, timeout, name in jobs:
            launches.append(local.launch(request, conditions, timeout=timeout, name=name))
        deadlines = [launch.delivered + job[2] if launch.delivered is not None else None
                     for launch, job in zip(launches, jobs)]
        graced = [False] * len(launches)
        waiting = {i for i, launch in enumerate(launches) if launch.delivered is not None}
        while waiting:
            now = time.monotonic()
            for i in sorted(waiting):
                launch = launches[i]
                if launch.poll() is not None:
                    waiting.discard(i)
                elif now >= deadlines[i]:
                    events = read_events(launch.events_path)
                    verdict = last_of(events, TrialResult) is not None or last_of(events, Inspected) is not None
                    if verdict and not graced[i]:  # on its way out: the usual grace
                        graced[i], deadlines[i] = True, now + VERDICT_EXIT_GRACE_SECONDS
                        continue
                    launch.timed_out, launch.verdict_at_timeout = True, graced[i]
                    local.stop(launch)
                    waiting.discard(i)
            if waiting:
                time.sleep(POLL_SECONDS)
    finally:
        for launch in launches:  # on an interrupt too: no child of the round outlives it
            local.stop(launch)
    return [local.collect(launch) for launch in launches]
