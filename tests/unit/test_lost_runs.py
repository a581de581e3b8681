"""A run whose end isoprobe's fork server lost is never the batch's outcome (issue 25), over scripted runs.

The executor re-runs such a run (tests/integration/test_fork_server.py, with a
real server killed and stopped); here, what the probe does with what comes
back: a re-run's verdict counts once, with a progress line naming the loss,
and a run that is still lost stops the probe (``ProbeError``, exit 4) instead of
giving a lower answer.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from isoprobe.errors import ProbeError
from isoprobe.executors.scripted import Call, ScriptedExecutor, crashed, fits, linear
from isoprobe.pipeline.trial_record import trial_from_run
from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, hog_spec, probe

GONE = "the fork server is gone (its channel closed: killed or crashed)"


def _at_the_edge(run):
    """The edge's first trial comes back as ``run``; every other as the device says."""
    return lambda call: run if call.batch_size == HOG_MAX and call.attempt == 1 else None


def test_a_run_the_executor_had_to_repeat_counts_once_and_the_progress_says_why():
    device = linear(HOG_FIXED, HOG_PER_SAMPLE)

    def script(call: Call):  # the edge's first trial: the device's verdict, from a re-run after a lost one
        run = device(call)
        return replace(run, lost_before=(GONE,)) if call.batch_size == HOG_MAX and call.attempt == 1 else run

    probed = probe(hog_spec(), ScriptedExecutor(script))
    assert probed.result.max_batch_size == HOG_MAX
    notes = [line for line in probed.lines if "was run again" in line]
    assert len(notes) == 1 and GONE in notes[0] and f"batch {HOG_MAX}" in notes[0] and "not counted" in notes[0]


def test_a_run_still_lost_stops_the_probe_with_the_reason_rather_than_a_lower_answer():
    executor = ScriptedExecutor(linear(HOG_FIXED, HOG_PER_SAMPLE,
                                       faults=_at_the_edge(replace(crashed(), lost=GONE, lost_before=(GONE, GONE)))))
    with pytest.raises(ProbeError, match="fork_server: false") as raised:
        probe(hog_spec(), executor)
    assert GONE in str(raised.value) and "3 times in a row" in str(raised.value)
    assert executor.closed


def test_a_lost_gang_rank_or_slot_never_becomes_an_outcome():
    """``trial_from_run`` is also what parallel slots and gangs are classified by: a lost run is refused there too."""
    with pytest.raises(ProbeError, match=GONE.split(" (")[0]):
        trial_from_run(replace(fits(HOG_FIXED), lost=GONE), 1, 2, "search")
