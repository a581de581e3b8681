"""A SIGINT/SIGTERM that lands after a trial's child ended, before the trial was recorded, never drops it (issue 25).

The parallel rounds were fixed first (test_parallel_probe.py); here the single
path (``LocalExecutor.run`` -> ``TrialRunner``) and the gang's. The executor is
the real one over canned children (``canned_local``), and a real signal is
raised in the parent at three points after trial N's child has ended: when its
end is first seen, while it is stopped, and while it is collected. The partial
result must hold trial N, printed, and nothing after it.
"""

from __future__ import annotations

import re
import signal

import pytest

from canned_local import CannedLocal
from isoprobe.errors import Terminated
from isoprobe.executors.gang import GangExecutor
from isoprobe.executors.local import LocalExecutor
from isoprobe.executors.scripted import crashed, linear
from isoprobe.report.output import Reporter
from isoprobe.pipeline import run_probe
from isoprobe.spec.model import Spec
from scripted_probe import HOG_FIXED, HOG_MAX, HOG_PER_SAMPLE, SPEC_PATH, hog_spec

TRIAL_LINE = re.compile(r"isoprobe: trial +\d+ +batch ")
SIGNALS = [pytest.param(signal.SIGINT, "interrupted", id="SIGINT"),
           pytest.param(signal.SIGTERM, "terminated", id="SIGTERM")]


@pytest.fixture(autouse=True)
def sigterm_raises_terminated():
    """As ``isoprobe run`` has it (commands/run.py): SIGTERM raises ``Terminated`` in the parent."""
    def on_sigterm(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    yield
    signal.signal(signal.SIGTERM, previous)


def _spec(gang: bool) -> Spec:
    raw = hog_spec()
    if gang:
        raw["distributed"] = {"strategy": "ddp", "world_size": 2}
        # the device's edge (25) leaves 16 MiB: one process's spread (8 MiB) is the one under test here, not a gang's
        raw["search"]["edge_spread"] = "8MiB"
    return Spec.model_validate(raw)


def _probe(tmp_path, gang: bool, *, signum: int | None = None, at: str = "", trial: int = 0, monkeypatch=None):
    """A probe over canned children; with ``signum``, raised in the parent at point ``at`` of trial ``trial``."""
    fired: list[str] = []

    def land(name: str) -> None:
        if signum is not None and not fired and name.startswith(f"trial{trial:03d}-"):
            fired.append(name)
            signal.raise_signal(signum)

    tmp_path.mkdir(exist_ok=True)
    local = CannedLocal(linear(HOG_FIXED, HOG_PER_SAMPLE), tmp_path, on_seen=land if at == "seen" else None)
    if at in ("stopped", "collected") and monkeypatch is not None:
        method = {"stopped": "stop", "collected": "collect"}[at]
        original = getattr(LocalExecutor, method)

        def then_the_signal(launch):
            value = original(launch)
            land(launch.events_path.name)
            return value

        monkeypatch.setattr(LocalExecutor, method, staticmethod(then_the_signal))
    executor = GangExecutor(local) if gang else local
    lines: list[str] = []
    result = run_probe(_spec(gang), SPEC_PATH, Reporter(lines.append), environ={}, executor=executor)
    return result, lines, fired


@pytest.fixture(scope="module", params=[False, True], ids=["single", "gang"])
def uninterrupted(request, tmp_path_factory):
    gang = request.param
    result, _, _ = _probe(tmp_path_factory.mktemp("uninterrupted"), gang)
    assert result.stop_reason.value == "edge_found" and result.max_batch_size == HOG_MAX
    return gang, result.trials


@pytest.mark.parametrize("at", ["seen", "stopped", "collected"])
@pytest.mark.parametrize(("signum", "reason"), SIGNALS)
def test_a_signal_after_a_trials_child_ended_keeps_the_trial(uninterrupted, tmp_path, monkeypatch, at, signum, reason):
    gang, ran = uninterrupted
    for n in range(1, len(ran) + 1):
        with monkeypatch.context() as patched:
            result, lines, fired = _probe(tmp_path / f"n{n}", gang, signum=signum, at=at, trial=n, monkeypatch=patched)
        context = f"signal {at} at trial {n}"
        assert fired, context  # the signal was raised, after the child's end
        assert result.stop_reason.value == reason, context
        assert [(t.index, t.batch_size, t.purpose, t.outcome) for t in result.trials] == \
            [(t.index, t.batch_size, t.purpose, t.outcome) for t in ran[:n]], context
        assert len([line for line in lines if TRIAL_LINE.match(line)]) == n, context
        if gang:
            assert all(len(t.ranks) == 2 for t in result.trials), context


@pytest.mark.parametrize(("signum", "reason"), SIGNALS)
def test_a_child_ended_by_the_same_signal_was_stopped_not_finished_and_is_not_recorded(uninterrupted, tmp_path,
                                                                                        signum, reason):
    # A scheduler signals the whole job (scancel): trial 2's child died of the signal that reached isoprobe.
    gang, ran = uninterrupted
    device = linear(HOG_FIXED, HOG_PER_SAMPLE)
    killed = crashed(signum, stderr_tail="")

    def script(call):
        return killed if call.number in ((3, 4) if gang else (2,)) else device(call)  # a gang's ranks: 2 calls

    fired = []

    def land(name):
        if name.startswith("trial002-") and not fired:
            fired.append(name)
            signal.raise_signal(signum)

    local = CannedLocal(script, tmp_path, on_seen=land)
    lines: list[str] = []
    result = run_probe(_spec(gang), SPEC_PATH, Reporter(lines.append), environ={},
                       executor=GangExecutor(local) if gang else local)
    assert fired and result.stop_reason.value == reason
    assert [(t.index, t.batch_size, t.outcome) for t in result.trials] == [(1, ran[0].batch_size, ran[0].outcome)]
